"""Where users and keys live, chosen once at start: SQLite and key files, or PostgreSQL.

``AUTH_DB_URL`` empty: users in the SQLite file ``AUTH_DB`` and keys in the files
(``JWT_PRIVATE_KEY``, ``JWT_KEYRING``): one replica. Set: users and the keyring in
PostgreSQL, shared by every replica. Nothing else in the service asks which.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from auth_service.database import Database
from auth_service.keys_postgres import DatabaseKeys, open_keyring
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
    """The users and keys of a running service; :meth:`close` releases them."""

    users: Users
    keys: KeySource
    database: Database | None = None
    #: the task re-reading the shared keyring (database mode)
    refresh_task: asyncio.Task[None] | None = None

    def signing_kid(self) -> str:
        """The kid signing now (for the start-up log)."""
        return self.keys.signing_key(time.time())[0]

    async def close(self) -> None:
        """Stop re-reading the keyring, close the users and the database."""
        if self.refresh_task is not None:
            self.refresh_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.refresh_task
        await self.users.close()
        if self.database is not None:
            await self.database.close()


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


async def open_backend(settings: Settings, *, create_keys: bool = True) -> Backend:
    """Open the users and keys the settings name; SettingError naming what cannot be used.

    ``create_keys`` False (the chat server's inline login) reads the key files as the
    service left them instead of creating or pruning them.
    """
    files = KeyFiles.from_settings(settings)
    if not settings.auth_db_url:
        keyring = (
            load_or_create_keys(files, settings.token_ttl_s) if create_keys else read_keys(files)
        )
        users = await UserStore.open(settings.auth_db)
        return Backend(users, FileKeys(files, keyring))
    database = await open_database(settings)
    try:
        rows = await open_keyring(database, files, settings.token_ttl_s)
    except BaseException:
        await database.close()
        raise
    keys = DatabaseKeys(database, rows)
    if create_keys:
        _write_public_key(files, keys)
    backend = Backend(PostgresUsers(database), keys, database)
    # survives a failed read itself; should it end anyway, it restarts
    backend.refresh_task = supervisor().start("auth-keyring-refresh", keys.refresh_forever, RESTART)
    return backend


def _write_public_key(files: KeyFiles, keys: DatabaseKeys) -> None:
    """``JWT_PUBLIC_KEY``: the signing key's public PEM at start, for a chat server beside
    this replica that verifies with one key (it cannot follow a rotation: use the JWK set)."""
    _, private_key = keys.signing_key(time.time())
    write_public_key(files.public_key, private_key.public_key())
