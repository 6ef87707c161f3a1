"""Where users, sessions and keys live, chosen once at start: SQLite and key files, or PostgreSQL.

``AUTH_DB_URL`` empty: users and sessions in the SQLite file ``AUTH_DB`` and keys in the
files (``JWT_PRIVATE_KEY``, ``JWT_KEYRING``): one replica. Set: users, sessions and the
keyring in PostgreSQL, shared by every replica. Nothing else in the service asks which.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from auth_service.database import Database
from auth_service.keys_postgres import DatabaseKeys, open_keyring
from auth_service.sessions import (
    SessionRules,
    Sessions,
    SqliteSessions,
    prune_forever,
)
from auth_service.sessions_postgres import PostgresSessions
from auth_service.settings import SettingError, Settings
from auth_service.tokens import (
    FileKeys,
    KeyFiles,
    KeySource,
    load_or_create_keys,
    read_keys,
    write_public_key,
)
from auth_service.users import Users, UserStore
from auth_service.users_postgres import PostgresUsers
from chatlab.supervision import RESTART, supervisor


@dataclass
class Backend:
    """The users, sessions and keys of a running service; :meth:`close` releases them."""

    users: Users
    sessions: Sessions
    keys: KeySource
    database: Database | None = None
    #: the task re-reading the shared keyring (database mode)
    refresh_task: asyncio.Task[None] | None = None
    #: the task deleting expired and revoked sessions (see :meth:`start_pruning`)
    prune_task: asyncio.Task[None] | None = None

    def start_pruning(self) -> None:
        """Delete expired and revoked sessions in the background, through the supervisor
        (restarted should it fail), until :meth:`close`."""
        self.prune_task = supervisor().start(
            "auth-sessions-prune", lambda: prune_forever(self.sessions), RESTART
        )

    def signing_kid(self) -> str:
        """The kid signing now (for the start-up log)."""
        return self.keys.signing_key(time.time())[0]

    async def close(self) -> None:
        """Stop the background tasks, close the users and the database."""
        for task in (self.refresh_task, self.prune_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.users.close()
        if self.database is not None:
            await self.database.close()


def session_rules(settings: Settings) -> SessionRules:
    """The sessions' rules from the settings (``REFRESH_*``)."""
    return SessionRules(
        settings.refresh_ttl_s, settings.refresh_grace_s, settings.refresh_families_per_user
    )


async def open_database(settings: Settings) -> Database:
    """The PostgreSQL of ``AUTH_DB_URL``, connected, its schema created; SettingError if not."""
    database = Database(settings.auth_db_url, settings.auth_db_pool_max, settings.auth_db_timeout_s)
    try:
        await database.open()
    except OSError as exc:
        raise SettingError(
            "AUTH_DB_URL", settings.auth_db_url, f"cannot use it as PostgreSQL: {exc}"
        ) from None
    return database


@contextlib.asynccontextmanager
async def sessions_only(settings: Settings) -> AsyncIterator[Sessions]:
    """The sessions the settings name, without keys or background work (for
    ``revoke-sessions``), closed after; SettingError naming what cannot be used."""
    rules = session_rules(settings)
    if not settings.auth_db_url:
        users = await UserStore.open(settings.auth_db)
        try:
            yield await SqliteSessions.open(users, rules)
        finally:
            await users.close()
        return
    database = await open_database(settings)
    try:
        yield await PostgresSessions.open(database, rules)
    finally:
        await database.close()


async def open_backend(settings: Settings, *, create_keys: bool = True) -> Backend:
    """Open the users and keys the settings name; SettingError naming what cannot be used.

    ``create_keys`` False (the chat server's inline login) reads the key files as the
    service left them instead of creating or pruning them.
    """
    files = KeyFiles.from_settings(settings)
    rules = session_rules(settings)
    if not settings.auth_db_url:
        keyring = (
            load_or_create_keys(files, settings.token_ttl_s) if create_keys else read_keys(files)
        )
        users = await UserStore.open(settings.auth_db)
        try:
            sessions: Sessions = await SqliteSessions.open(users, rules)
        except BaseException:
            await users.close()
            raise
        return Backend(users, sessions, FileKeys(files, keyring))
    database = await open_database(settings)
    try:
        rows = await open_keyring(database, files, settings.token_ttl_s)
        sessions = await PostgresSessions.open(database, rules)
    except BaseException:
        await database.close()
        raise
    keys = DatabaseKeys(database, rows)
    if create_keys:
        _write_public_key(files, keys)
    backend = Backend(PostgresUsers(database), sessions, keys, database)
    # survives a failed read itself; should it end anyway, it restarts
    backend.refresh_task = supervisor().start("auth-keyring-refresh", keys.refresh_forever, RESTART)
    return backend


def _write_public_key(files: KeyFiles, keys: DatabaseKeys) -> None:
    """``JWT_PUBLIC_KEY``: the signing key's public PEM at start, for a chat server beside
    this replica that verifies with one key (it cannot follow a rotation: use the JWK set)."""
    _, private_key = keys.signing_key(time.time())
    write_public_key(files.public_key, private_key.public_key())
