"""Users: the store's interface, and the embedded store, one SQLite file on one thread.

:class:`Users` is what the API needs of a store; :class:`UserStore` keeps users in
SQLite (the default, for one replica), and
:class:`~auth_service.users_postgres.PostgresUsers` in PostgreSQL (``AUTH_DB_URL``,
for several).

Usernames are unique without regard to case: each row's primary key is the
casefolded name (:func:`username_key`), and the name as registered is kept beside it
for the token's ``sub``. Every SQLite call runs on the store's own thread, never on
the event loop; at most ``max_pending`` calls wait for that thread, and past that a
call raises :class:`~auth_service.errors.Unavailable` at once instead of queueing.
A registration is committed (WAL, ``synchronous=FULL``) before it is answered.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, TypeVar

from auth_service.errors import AuthCode, AuthError, Unavailable
from auth_service.settings import SettingError

_T = TypeVar("_T")

_SCHEMA: Final = """CREATE TABLE IF NOT EXISTS users (
    username_key TEXT PRIMARY KEY,
    username TEXT NOT NULL,
    password_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL
)"""


def username_key(username: str) -> str:
    """The case-insensitive identity of a username (its casefold)."""
    return username.casefold()


@dataclass(frozen=True)
class User:
    """A registered user: the name as registered and the argon2 hash of the password."""

    username: str
    password_hash: str


class Users(Protocol):
    """A user store: usernames unique without regard to case, registrations durable."""

    async def get(self, username: str) -> User | None:
        """The user registered under ``username`` in any case, or None."""
        ...

    async def add(self, username: str, password_hash: str) -> None:
        """Register ``username``, or raise ``username_taken`` if any case of it exists."""
        ...

    async def set_password_hash(self, username: str, password_hash: str) -> None:
        """Replace the stored hash of ``username``."""
        ...

    async def close(self) -> None:
        """Release what the store holds."""
        ...


class UserStore:
    """Registered users in SQLite; open it with :meth:`open`, close it with :meth:`close`."""

    def __init__(self, path: str, max_pending: int = 1024) -> None:
        self.path = path
        self.max_pending = max_pending
        self._pending = 0
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="auth-users")
        self._db: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, path: str) -> UserStore:
        """Open (creating if needed) the database; a file that cannot be used is a SettingError."""
        store = cls(path)
        try:
            await store._call(store._open_db)
        except (OSError, sqlite3.Error) as exc:
            store._thread.shutdown()
            raise SettingError("AUTH_DB", path, f"cannot open it as SQLite: {exc}") from None
        return store

    async def get(self, username: str) -> User | None:
        """The user registered under ``username`` in any case, or None."""
        return await self._call(self._get, username_key(username))

    async def add(self, username: str, password_hash: str) -> None:
        """Register ``username``, or raise ``username_taken`` if any case of it exists."""
        await self._call(self._add, username, password_hash)

    async def set_password_hash(self, username: str, password_hash: str) -> None:
        """Replace the stored hash of ``username`` (after a parameter change)."""
        await self._call(self._set_hash, username_key(username), password_hash)

    async def all(self) -> list[tuple[User, int]]:
        """Every user with its registration time (unix seconds), oldest first."""
        return await self._call(self._all)

    async def run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """``work(connection)`` on the store's thread (the same bounded queue as every call):
        how the session store shares this file."""

        def on_thread() -> _T:
            assert self._db is not None
            return work(self._db)

        return await self._call(on_thread)

    async def close(self) -> None:
        """Close the database and stop the store's thread."""
        if self._db is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._db.close)
            self._db = None
        self._thread.shutdown()

    async def _call(self, fn: Callable[..., _T], *args: object) -> _T:
        if self._pending >= self.max_pending:
            raise Unavailable("the user database is busy", retry_after_s=1)
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)
        finally:
            self._pending -= 1

    # ---- on the store's thread ---------------------------------------------------------

    def _open_db(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=5000")
            db.execute(_SCHEMA)
        except sqlite3.Error:
            db.close()
            raise
        self._db = db

    def _get(self, key: str) -> User | None:
        assert self._db is not None
        row = self._db.execute(
            "SELECT username, password_hash FROM users WHERE username_key = ?", (key,)
        ).fetchone()
        return None if row is None else User(row[0], row[1])

    def _all(self) -> list[tuple[User, int]]:
        assert self._db is not None
        rows = self._db.execute(
            "SELECT username, password_hash, created_at FROM users ORDER BY created_at, username"
        ).fetchall()
        return [(User(row[0], row[1]), row[2]) for row in rows]

    def _add(self, username: str, password_hash: str) -> None:
        assert self._db is not None
        try:
            self._db.execute(
                "INSERT INTO users (username_key, username, password_hash, created_at)"
                " VALUES (?, ?, ?, ?)",
                (username_key(username), username, password_hash, int(time.time())),
            )
        except sqlite3.IntegrityError:
            raise AuthError(
                AuthCode.USERNAME_TAKEN, f"the username {username!r} is taken"
            ) from None

    def _set_hash(self, key: str, password_hash: str) -> None:
        assert self._db is not None
        self._db.execute(
            "UPDATE users SET password_hash = ? WHERE username_key = ?", (password_hash, key)
        )
