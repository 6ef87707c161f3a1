"""The keyring every replica shares, in PostgreSQL (``AUTH_DB_URL``).

Each row of ``signing_keys`` is one Ed25519 key: ``kid``, the private key (PEM),
``created_at`` (when it was published) and ``active_at`` (from when it signs). The
rule every replica applies alone, from the rows and its clock (:func:`schedule`):

- the **signing key** at time *t* is the key with the latest ``active_at`` <= *t*;
- a key is **retired** at the ``active_at`` of the key that follows it, and stays in
  the JWK set ``TOKEN_TTL_S`` + :data:`~auth_service.tokens.RETIRED_KEY_LEEWAY_S` longer,
  until every token it signed has expired; then it is **expired** (and deleted);
- a key whose ``active_at`` is still to come is **pending**: already in the JWK set,
  signing nothing yet.

``rotate-key`` adds a key with ``active_at`` = now + ``AUTH_KEY_ACTIVATION_S``, so a
new key is in every replica's JWK set (each re-reads the rows every second) and, when
that delay is longer than the chat servers' ``JWKS_REFRESH_S`` plus their fetch
timeout, in every chat server's too, before any replica signs with it: a chat server
never sees a ``kid`` it does not know. ``rotate-key --revoke`` is the exception, for a
leaked key: the new key signs at once and every other key is deleted.

A replica that cannot reach the database keeps the rows it last read, so it keeps
signing (and switches to a pending key on time). The first replica to start against
an empty keyring puts in the key of ``JWT_PRIVATE_KEY`` when that file exists (so the
tokens of a service moved over from SQLite stay valid), else a new key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import psycopg
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from auth_service.database import Database
from auth_service.errors import Unavailable
from auth_service.tokens import (
    REFRESH_INTERVAL_S,
    RETIRED_KEY_LEEWAY_S,
    KeyFiles,
    PublicKey,
    read_private_key,
)
from chatlab.keys import key_id

log = logging.getLogger("auth_service.keys")

#: serialises changes to the keyring between replicas and rotate-key runs (any constant)
KEYRING_LOCK: Final = 0x63686174_6B657973


@dataclass(frozen=True)
class KeyRow:
    """One key of the shared keyring."""

    kid: str
    private_key: Ed25519PrivateKey
    created_at: int
    active_at: int


@dataclass(frozen=True)
class Schedule:
    """What the keyring means at one moment: the key that signs, the keys served, the dead."""

    signing: KeyRow | None
    served: tuple[PublicKey, ...]
    expired: tuple[str, ...]


def schedule(rows: Sequence[KeyRow], now_s: float, ttl_s: int) -> Schedule:
    """Apply the keyring's rule (the module's docstring) to ``rows`` at ``now_s``.

    Keys are ordered by ``active_at`` (then ``created_at``, then ``kid``, so every
    replica orders them alike); ``signing`` is None only when no key is active yet.
    """
    ordered = sorted(rows, key=lambda row: (row.active_at, row.created_at, row.kid))
    signing: KeyRow | None = None
    served: list[PublicKey] = []
    expired: list[str] = []
    for index, row in enumerate(ordered):
        following = ordered[index + 1] if index + 1 < len(ordered) else None
        retired_at = (
            following.active_at if following is not None and following.active_at <= now_s else None
        )
        if retired_at is None and row.active_at <= now_s:
            signing = row
        if retired_at is not None and retired_at + ttl_s + RETIRED_KEY_LEEWAY_S <= now_s:
            expired.append(row.kid)
            continue
        served.append(PublicKey(row.kid, row.private_key.public_key(), retired_at))
    # the signing key first, as in the files' JWK set
    served.sort(key=lambda key: signing is None or key.kid != signing.kid)
    return Schedule(signing, tuple(served), tuple(expired))


class DatabaseKeys:
    """The shared keyring as a :class:`~auth_service.tokens.KeySource`, re-read every second.

    :meth:`signing_key` and :meth:`served` do no I/O: they apply :func:`schedule` to the
    rows last read by :meth:`refresh_forever`.
    """

    def __init__(self, database: Database, rows: Sequence[KeyRow]) -> None:
        self.database = database
        self.rows = tuple(rows)
        self._signing_kid: str | None = None

    def signing_key(self, now_s: float) -> tuple[str, Ed25519PrivateKey]:
        """The key that signs at ``now_s``; Unavailable when none is active (never, once open)."""
        ttl_s = 0  # expiry does not matter here
        row = schedule(self.rows, now_s, ttl_s).signing
        if row is None:
            raise Unavailable("no signing key is active yet", REFRESH_INTERVAL_S)
        if row.kid != self._signing_kid:
            if self._signing_kid is not None:
                log.info("signing key rotated: %s -> %s", self._signing_kid, row.kid)
            self._signing_kid = row.kid
        return row.kid, row.private_key

    def served(self, now_s: float, ttl_s: int) -> tuple[PublicKey, ...]:
        """Every key a token may carry now or is about to: pending, signing, retired and live."""
        return schedule(self.rows, now_s, ttl_s).served

    async def refresh_forever(self) -> None:
        """Re-read the rows every :data:`REFRESH_INTERVAL_S` until cancelled; keep the last
        rows while they cannot be read, whatever the reason: the database down
        (``Unavailable``, logged once per outage) or anything else it raises (a refused
        statement, a row that is not a key: logged with its traceback each time)."""
        failing = False
        while True:
            await asyncio.sleep(REFRESH_INTERVAL_S)
            try:
                self.rows = tuple(await self.database.run(_select_rows))
            except Unavailable as exc:
                if not failing:
                    log.warning("keyring not re-read, keeping %d keys: %s", len(self.rows), exc)
                failing = True
                continue
            except Exception:  # a replica signing with a revoked key is worse than a log line
                log.exception("keyring not re-read, keeping %d keys", len(self.rows))
                failing = True
                continue
            if failing:
                log.info("keyring re-read again: %d keys", len(self.rows))
            failing = False


async def open_keyring(database: Database, files: KeyFiles, ttl_s: int) -> list[KeyRow]:
    """The keyring's rows, first putting in a key when it is empty (see the module's docstring)
    and deleting the expired ones."""

    async def bootstrap(conn: psycopg.AsyncConnection) -> list[KeyRow]:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (KEYRING_LOCK,))
            rows = await _select_rows(conn)
            now = int(time.time())
            if not rows:
                private_key = read_private_key(files.private_key)
                where = f"from {files.private_key}"
                if private_key is None:
                    private_key, where = Ed25519PrivateKey.generate(), "new"
                rows = [await _insert(conn, private_key, now, now)]
                log.info("keyring in the database started with key %s (%s)", rows[0].kid, where)
            return await _delete_expired(conn, rows, now, ttl_s)

    return await database.run(bootstrap)


async def rotate_keyring(
    database: Database, ttl_s: int, activation_s: int, *, revoke: bool = False
) -> tuple[KeyRow, str | None]:
    """Add a new key signing ``activation_s`` from now (at once, deleting every other key, with
    ``revoke``). Returns the new key's row and the kid that signed until then."""

    async def rotate(conn: psycopg.AsyncConnection) -> tuple[KeyRow, str | None]:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (KEYRING_LOCK,))
            now = int(time.time())
            rows = await _select_rows(conn)
            old = schedule(rows, now, ttl_s).signing
            if revoke:
                await conn.execute("DELETE FROM signing_keys")
                rows = []
            new = await _insert(
                conn, Ed25519PrivateKey.generate(), now, now if revoke else now + activation_s
            )
            await _delete_expired(conn, [*rows, new], now, ttl_s)
            return new, None if old is None else old.kid

    return await database.run(rotate)


async def _select_rows(conn: psycopg.AsyncConnection) -> list[KeyRow]:
    cursor = await conn.execute("SELECT kid, private_pem, created_at, active_at FROM signing_keys")
    rows = []
    for kid, pem, created_at, active_at in await cursor.fetchall():
        try:
            private_key = serialization.load_pem_private_key(pem.encode(), password=None)
        except (ValueError, TypeError) as exc:  # one bad row does not hide the others
            log.warning("key %s left out: its PEM does not load (%s)", kid, exc)
            continue
        if not isinstance(private_key, Ed25519PrivateKey):
            log.warning("key %s left out: not an Ed25519 key", kid)
            continue
        rows.append(KeyRow(kid, private_key, created_at, active_at))
    return rows


async def _insert(
    conn: psycopg.AsyncConnection, private_key: Ed25519PrivateKey, now: int, active_at: int
) -> KeyRow:
    row = KeyRow(key_id(private_key.public_key()), private_key, now, active_at)
    pem = private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    await conn.execute(
        "INSERT INTO signing_keys (kid, private_pem, created_at, active_at)"
        " VALUES (%s, %s, %s, %s)",
        (row.kid, pem, row.created_at, row.active_at),
    )
    return row


async def _delete_expired(
    conn: psycopg.AsyncConnection, rows: list[KeyRow], now: int, ttl_s: int
) -> list[KeyRow]:
    expired = schedule(rows, now, ttl_s).expired
    if expired:
        await conn.execute("DELETE FROM signing_keys WHERE kid = ANY(%s)", (list(expired),))
        log.info("keys %s expired: no longer in the JWK set", ", ".join(expired))
    return [row for row in rows if row.kid not in expired]
