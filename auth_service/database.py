"""PostgreSQL for the auth service (``AUTH_DB_URL``): one bounded pool, its schema, its errors.

Why psycopg 3 with psycopg_pool rather than asyncpg: psycopg is PostgreSQL's reference
Python driver (libpq underneath, so ``AUTH_DB_URL`` takes every libpq URL parameter:
``sslmode``, ``host=/socket/dir``, ``target_session_attrs`` for fail-over between
servers), its pool is maintained with it and bounds both the connections
(``AUTH_DB_POOL_MAX``) and the requests waiting for one, and it runs natively on asyncio.
asyncpg is faster per query, but the auth service makes one or two small queries per
request beside an argon2 hash that costs a thousand times more.

Guarantees: every operation (waiting for a connection included) ends within
``AUTH_DB_TIMEOUT_S`` or raises :class:`~auth_service.errors.Unavailable` (503 with
``Retry-After``); so does a database that is down, refuses us or breaks a connection.
A query still running at the deadline is cancelled in the background while the
request is answered. While the database is unusable, one request at a time tries it
(the probe) and the others are answered 503 at once, instead of each holding a slot
for ``AUTH_DB_TIMEOUT_S``; the first that succeeds ends it. The URL's password is never
logged (the process's log filter redacts it; :meth:`Database.where` is the URL without
it). Connections are checked before each use, so after the database comes back the
first request succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Final, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout, TooManyRequests

from auth_service.errors import Unavailable
from chatlab.log_redaction import redact

log = logging.getLogger("auth_service.database")

_T = TypeVar("_T")

#: ``Retry-After`` when the database cannot be used: long enough for a restart or a
#: fail-over to be under way, short enough that a client comes back soon
RETRY_AFTER_S: Final = 2
#: requests that may wait for a connection at once; past it 503 at once (the same bound
#: as the SQLite store's queue)
MAX_WAITING: Final = 1024
#: serialises the schema's creation between replicas starting together (any constant)
SCHEMA_LOCK: Final = 0x63686174_6C6162

SCHEMA: Final = (
    # usernames are unique without regard to case: the key is the name lowercased (the
    # username rule allows ASCII only, where casefold and lower agree), and the database
    # checks that it is, so the primary key is a unique index on lower(username)
    """CREATE TABLE IF NOT EXISTS users (
        username_key TEXT PRIMARY KEY CHECK (username_key = lower(username)),
        username TEXT NOT NULL,
        password_hash TEXT NOT NULL,
        created_at BIGINT NOT NULL
    )""",
    # the keyring every replica shares (auth_service.keys_postgres)
    """CREATE TABLE IF NOT EXISTS signing_keys (
        kid TEXT PRIMARY KEY,
        private_pem TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        active_at BIGINT NOT NULL
    )""",
    # sessions: refresh token families and their tokens, stored as SHA-256 only, and the
    # secret every replica derives successors with (auth_service.sessions)
    """CREATE TABLE IF NOT EXISTS refresh_families (
        family_id TEXT PRIMARY KEY,
        username_key TEXT NOT NULL,
        username TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION,
        revoked_reason TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS refresh_families_user ON refresh_families (username_key)",
    """CREATE TABLE IF NOT EXISTS refresh_tokens (
        token_hash BYTEA PRIMARY KEY,
        family_id TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        spent_at DOUBLE PRECISION
    )""",
    "CREATE INDEX IF NOT EXISTS refresh_tokens_family ON refresh_tokens (family_id)",
    """CREATE TABLE IF NOT EXISTS refresh_secret (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        secret BYTEA NOT NULL
    )""",
)


class Database:
    """A bounded pool of connections to ``url``; :meth:`open` it, :meth:`close` it."""

    def __init__(self, url: str, pool_max: int, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        # since when the database has been unusable (None: it answered last time), and
        # whether a request is trying it now
        self.down_since: float | None = None
        self.probing = False
        self.pool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=pool_max,
            open=False,
            timeout=timeout_s,
            max_waiting=MAX_WAITING,
            # a broken connection (the server restarted) is found and replaced before use
            check=AsyncConnectionPool.check_connection,
            # a pool slot that cannot reconnect for this long is given up, and a new one
            # is tried on demand
            reconnect_timeout=max(30.0, 6 * timeout_s),
            kwargs={
                "autocommit": True,
                "application_name": "chatlab-auth",
                # libpq's connect_timeout is whole seconds, at least 2
                "connect_timeout": max(2, math.ceil(timeout_s)),
                # the server ends a statement that runs too long (a lock held elsewhere)
                "options": f"-c statement_timeout={int(timeout_s * 1000)}",
            },
            name="auth-db",
        )

    def where(self) -> str:
        """The URL fit for a log or an error line (without its password)."""
        return redact(self.url)

    async def open(self) -> None:
        """Connect and create the schema; OSError naming why when the database cannot be used."""
        try:
            await self.pool.open(wait=True, timeout=max(self.timeout_s, 2.0))
            async with self.pool.connection() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                for statement in SCHEMA:
                    await conn.execute(statement)
        except (psycopg.Error, PoolTimeout) as exc:
            await self.pool.close()
            raise OSError(redact(str(exc)).strip() or type(exc).__name__) from None

    async def close(self) -> None:
        """Close every connection."""
        await self.pool.close()

    async def run(self, work: Callable[[psycopg.AsyncConnection], Awaitable[_T]]) -> _T:
        """``work`` on a pooled connection, within ``AUTH_DB_TIMEOUT_S``, or Unavailable.

        While the database is down, one request at a time tries it; the others get
        Unavailable at once. Errors that are not the database's being unusable (an
        integrity error, a bug's SQL error) propagate as they are: it answered.
        """
        probe = False
        if self.down_since is not None:
            if self.probing:
                raise Unavailable(
                    "the user database is down; one request at a time is trying it",
                    RETRY_AFTER_S,
                )
            self.probing = probe = True
        try:
            result = await self._attempt(work)
        except _Unusable as exc:
            if self.down_since is None:
                self.down_since = time.monotonic()
                log.warning(
                    "user database down (%s): answering 503 at once while one request at a"
                    " time tries it",
                    exc.detail,
                )
            raise Unavailable(exc.detail, RETRY_AFTER_S) from None
        except Unavailable:
            raise  # busy: the database works, its pool is full
        except Exception:  # it answered: an integrity error, a refused statement
            self._answered()
            raise
        finally:
            if probe:
                self.probing = False
        self._answered()
        return result

    def _answered(self) -> None:
        if self.down_since is not None:
            log.warning("user database back after %.1f s", time.monotonic() - self.down_since)
            self.down_since = None

    async def _attempt(self, work: Callable[[psycopg.AsyncConnection], Awaitable[_T]]) -> _T:
        """One try of ``work``: its result, _Unusable, or Unavailable when the pool is full."""
        task = asyncio.ensure_future(self._on_connection(work))
        done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        if not done:
            # psycopg cancels the query on the server; that may take a while on a
            # database that does not answer, so it is not waited for
            task.cancel()
            task.add_done_callback(_swallow)
            raise _Unusable("the user database did not answer in time")
        try:
            return task.result()
        except TooManyRequests:
            raise Unavailable("the user database is busy", RETRY_AFTER_S) from None
        except PoolTimeout:
            raise _Unusable("the user database cannot be reached") from None
        except psycopg.OperationalError as exc:
            # connection refused or broken, server shutting down, statement timeout
            log.warning("user database unusable: %s", redact(str(exc)).strip())
            raise _Unusable("the user database cannot be used now") from None

    async def _on_connection(self, work: Callable[[psycopg.AsyncConnection], Awaitable[_T]]) -> _T:
        async with self.pool.connection(timeout=self.timeout_s) as conn:
            return await work(conn)


class _Unusable(Exception):
    """The database is down, unreachable or did not answer in time (not merely busy)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _swallow(task: asyncio.Task[object]) -> None:
    """Retrieve an abandoned query's outcome, so asyncio does not log it as lost."""
    with suppress(asyncio.CancelledError, Exception):
        task.result()
