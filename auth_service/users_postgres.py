"""Users in PostgreSQL (``AUTH_DB_URL``), shared by every replica of the auth service.

The same contract as :class:`~auth_service.users.UserStore`: usernames are unique
without regard to case, and the database enforces it (the primary key is the name
lowercased, checked against the name), so two replicas registering one name at once
give one success and one ``username_taken`` :class:`~auth_service.errors.AuthError`. A registration
is committed (PostgreSQL's default ``synchronous_commit``) before it is answered. A
database that is down or slow raises :class:`~auth_service.errors.Unavailable` within
``AUTH_DB_TIMEOUT_S`` (:class:`~auth_service.database.Database`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import psycopg

from auth_service.database import Database
from auth_service.errors import AuthCode, AuthError
from auth_service.users import User, username_key


class PostgresUsers:
    """Registered users in PostgreSQL, over the service's :class:`Database`."""

    def __init__(self, database: Database) -> None:
        self.database = database

    async def get(self, username: str) -> User | None:
        """The user registered under ``username`` in any case, or None."""

        async def select(conn: psycopg.AsyncConnection) -> User | None:
            cursor = await conn.execute(
                "SELECT username, password_hash FROM users WHERE username_key = %s",
                (username_key(username),),
            )
            row = await cursor.fetchone()
            return None if row is None else User(row[0], row[1])

        return await self.database.run(select)

    async def add(self, username: str, password_hash: str) -> None:
        """Register ``username``, or raise ``username_taken`` if any case of it exists."""

        async def insert(conn: psycopg.AsyncConnection) -> int:
            cursor = await conn.execute(
                "INSERT INTO users (username_key, username, password_hash, created_at)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (username_key) DO NOTHING",
                (username_key(username), username, password_hash, int(time.time())),
            )
            return cursor.rowcount

        if await self.database.run(insert) == 0:
            raise AuthError(AuthCode.USERNAME_TAKEN, f"the username {username!r} is taken")

    async def set_password_hash(self, username: str, password_hash: str) -> None:
        """Replace the stored hash of ``username`` (after a parameter change)."""

        async def update(conn: psycopg.AsyncConnection) -> None:
            await conn.execute(
                "UPDATE users SET password_hash = %s WHERE username_key = %s",
                (password_hash, username_key(username)),
            )

        await self.database.run(update)

    async def copy_in(self, users: Iterable[tuple[User, int]]) -> tuple[int, list[str]]:
        """Add ``(user, created_at)`` pairs in one transaction, keeping names already here.

        Returns how many were added and the names left out because a user of that name
        (in any case) is already registered here. Running it twice adds nothing.
        """
        rows = [
            (username_key(user.username), user.username, user.password_hash, created_at)
            for user, created_at in users
        ]

        async def copy(conn: psycopg.AsyncConnection) -> tuple[int, list[str]]:
            added, kept = 0, []
            async with conn.transaction():
                for row in rows:
                    cursor = await conn.execute(
                        "INSERT INTO users (username_key, username, password_hash, created_at)"
                        " VALUES (%s, %s, %s, %s) ON CONFLICT (username_key) DO NOTHING",
                        row,
                    )
                    if cursor.rowcount:
                        added += 1
                    else:
                        kept.append(row[1])
            return added, kept

        return await self.database.run(copy)

    async def close(self) -> None:
        """Nothing of its own to close: the service closes the :class:`Database`."""
