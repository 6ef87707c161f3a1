"""Sessions: rotating refresh tokens with reuse detection (RFC 9700 §4.14.2).

A login opens a **family** (a random id, never derived from a token) and issues its
first refresh token. ``POST /refresh`` spends the token presented and issues its
successor in the same family; the family's **live** token is its one unspent,
unexpired token while the family is not revoked. The rules, as a pure function of the
rows (:func:`judge`), which both stores apply inside one transaction:

=============================================  =========================================
the token presented                            outcome
=============================================  =========================================
unknown, expired, or of a revoked family       ``invalid`` (401; nothing changes)
live                                           ``rotated``: spent, successor issued
spent within ``REFRESH_GRACE_S``, its          ``grace``: the *same* successor again
successor live                                 (two tabs refreshing at once)
spent otherwise (after the grace, or its       ``reused``: the whole family revoked
successor spent in turn)
=============================================  =========================================

Tokens are 32 random bytes, base64url (43 characters); the stores keep only their
SHA-256 (:func:`token_hash`). The successor of token P is ``HMAC-SHA256(secret, P)``
(:func:`successor`), with a 32-byte secret created once in the store and shared by
every replica, so a replica that sees spent P within the grace recomputes the same
successor without having stored it. Neither a token nor its hash is ever logged; a
family id may be.

The spend is atomic: a conditional update (``... WHERE token_hash = ? AND spent_at IS
NULL``) with the successor inserted in the same transaction, so of two requests (or
replicas) racing one token exactly one spends it; the other re-reads the rows and is
judged again (it then gets the same successor as a grace answer, or, outside the
grace, revokes the family).

:class:`SqliteSessions` keeps the sessions beside the users in the SQLite file
``AUTH_DB`` (on the user store's thread); :class:`~auth_service.sessions_postgres.PostgresSessions`
in the PostgreSQL of ``AUTH_DB_URL``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import enum
import hashlib
import hmac
import logging
import re
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, Protocol

from auth_service.errors import Unavailable
from auth_service.users import UserStore, username_key

log = logging.getLogger("auth_service.sessions")

#: random bytes in a refresh token and in the store's successor secret (RFC 9700 asks
#: for tokens an attacker cannot guess; 256 bits as the issue asks)
TOKEN_BYTES: Final = 32
#: a refresh token as issued: base64url of 32 bytes without padding
TOKEN_SHAPE: Final = re.compile(r"[A-Za-z0-9_-]{43}")
#: the cookie that carries the refresh token in cookie mode (docs/protocol.md)
REFRESH_COOKIE: Final = "chatlab_refresh"
#: spent tokens kept per family for reuse detection (the latest); an older one is
#: forgotten at the next pruning, and presenting it is then ``invalid``, not reuse: a
#: thief's copy that old fails anyway, and the rows one session holds stay bounded
SPENT_KEPT_PER_FAMILY: Final = 16
#: the longest pruning waits between two runs (shorter when REFRESH_TTL_S is)
PRUNE_INTERVAL_S: Final = 60.0


class Outcome(enum.StrEnum):
    """What presenting a refresh token did (``auth_refresh_total{outcome}``)."""

    ROTATED = "rotated"
    GRACE = "grace"
    INVALID = "invalid"
    REUSED = "reused"


class RevokeReason(enum.StrEnum):
    """Why a family was revoked (``auth_sessions_revoked_total{reason}``)."""

    REUSE = "reuse"
    LOGOUT = "logout"
    ADMIN = "admin"
    LIMIT = "limit"


@dataclass(frozen=True)
class SessionRules:
    """The settings sessions follow: ``REFRESH_TTL_S``, ``REFRESH_GRACE_S``,
    ``REFRESH_FAMILIES_PER_USER``."""

    ttl_s: int
    grace_s: int
    families_per_user: int

    @property
    def prune_interval_s(self) -> float:
        """How often expired and revoked rows are deleted."""
        return min(PRUNE_INTERVAL_S, max(1.0, float(self.ttl_s)))


@dataclass(frozen=True)
class TokenRow:
    """One stored token as :func:`judge` needs it."""

    family_id: str
    username: str
    expires_at: float
    spent_at: float | None
    family_revoked: bool

    def live(self, now_s: float) -> bool:
        """Unspent, unexpired, of a family not revoked."""
        return self.spent_at is None and not self.family_revoked and self.expires_at > now_s


@dataclass(frozen=True)
class Session:
    """A refresh token handed out: whose, which family, and its life left."""

    username: str
    family_id: str
    refresh_token: str
    expires_in_s: int


@dataclass(frozen=True)
class Refreshed:
    """The outcome of presenting a token, with the session to answer when there is one."""

    outcome: Outcome
    session: Session | None = None
    #: the family the token belonged to (None when unknown)
    family_id: str | None = None


def judge(
    presented: TokenRow | None, successor: TokenRow | None, now_s: float, grace_s: float
) -> Outcome:
    """The outcome of presenting a token whose row is ``presented`` and whose successor's
    (by :func:`successor`) is ``successor`` at ``now_s`` (the module's table)."""
    if presented is None or presented.family_revoked or presented.expires_at <= now_s:
        return Outcome.INVALID
    if presented.spent_at is None:
        return Outcome.ROTATED
    within_grace = grace_s > 0 and now_s - presented.spent_at <= grace_s
    if within_grace and successor is not None and successor.live(now_s):
        return Outcome.GRACE
    return Outcome.REUSED


def new_token() -> str:
    """A fresh refresh token: 32 random bytes, base64url without padding."""
    return _b64(secrets.token_bytes(TOKEN_BYTES))


def new_family_id() -> str:
    """A fresh family id (random; may be logged)."""
    return secrets.token_hex(8)


def new_secret() -> bytes:
    """A fresh successor secret (created once per store)."""
    return secrets.token_bytes(TOKEN_BYTES)


def token_hash(token: str) -> bytes:
    """What the stores keep of a token: its SHA-256."""
    return hashlib.sha256(token.encode()).digest()


def successor(secret: bytes, token: str) -> str:
    """The successor of ``token``: ``HMAC-SHA256(secret, token)``, base64url."""
    return _b64(hmac.new(secret, token.encode(), hashlib.sha256).digest())


def well_formed(token: object) -> bool:
    """True when ``token`` has the shape of an issued token (anything else is invalid
    without asking the store)."""
    if not isinstance(token, str) or not TOKEN_SHAPE.fullmatch(token):
        return False
    try:
        base64.urlsafe_b64decode(token + "=")
    except (binascii.Error, ValueError):
        return False
    return True


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def excess_families(live_ids: list[str], families_per_user: int) -> list[str]:
    """The oldest of a user's ``live_ids`` (oldest first) to revoke so that one more
    family fits within ``families_per_user``."""
    return live_ids[: max(0, len(live_ids) - families_per_user + 1)]


class Sessions(Protocol):
    """A session store (SQLite or PostgreSQL); every method is one transaction."""

    rules: SessionRules

    async def open_family(self, username: str, now_s: float) -> tuple[Session, list[str]]:
        """A new family for ``username`` with its first token; also the ids of the user's
        oldest families revoked to keep within ``families_per_user`` (reason ``limit``)."""
        ...

    async def refresh(self, token: str, now_s: float) -> Refreshed:
        """Present ``token`` (well formed): the module's table, applied atomically."""
        ...

    async def revoke_family_of(self, token: str, now_s: float) -> str | None:
        """Revoke the family ``token`` belongs to (logout); its id, or None when the token
        is unknown or the family was revoked already."""
        ...

    async def revoke_user(self, username: str, now_s: float) -> int:
        """Revoke every live family of ``username`` (any case); how many."""
        ...

    async def prune(self, now_s: float) -> int:
        """Delete expired tokens and revoked or expired families; how many rows went."""
        ...


async def prune_forever(sessions: Sessions) -> None:
    """Prune every ``rules.prune_interval_s`` until cancelled; a database that cannot be
    used now is logged and tried at the next turn (other failures raise, and the
    supervisor restarts this)."""
    while True:
        await asyncio.sleep(sessions.rules.prune_interval_s)
        try:
            pruned = await sessions.prune(time.time())
        except Unavailable as exc:
            log.warning("sessions not pruned this time: %s", exc.detail)
            continue
        if pruned:
            log.debug("pruned %d expired or revoked session rows", pruned)


# ---- SQLite ------------------------------------------------------------------------------

SQLITE_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS refresh_families (
        family_id TEXT PRIMARY KEY,
        username_key TEXT NOT NULL,
        username TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        revoked_at REAL,
        revoked_reason TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS refresh_families_user ON refresh_families (username_key)",
    """CREATE TABLE IF NOT EXISTS refresh_tokens (
        token_hash BLOB PRIMARY KEY,
        family_id TEXT NOT NULL,
        expires_at REAL NOT NULL,
        spent_at REAL
    )""",
    "CREATE INDEX IF NOT EXISTS refresh_tokens_family ON refresh_tokens (family_id)",
    """CREATE TABLE IF NOT EXISTS refresh_secret (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        secret BLOB NOT NULL
    )""",
)

#: the presented token's row and its successor's, each with its family's state
SELECT_ROWS: Final = (
    "SELECT t.token_hash, t.family_id, f.username, t.expires_at, t.spent_at,"
    " f.revoked_at IS NOT NULL"
    " FROM refresh_tokens t JOIN refresh_families f ON f.family_id = t.family_id"
    " WHERE t.token_hash IN ({0}, {0})"
)
#: deletes what can never be answered but ``invalid``: tokens expired or of dead
#: families, then dead families (revoked, or whose live token expired); and each family's
#: spent tokens past its :data:`SPENT_KEPT_PER_FAMILY` latest
PRUNE: Final = (
    "DELETE FROM refresh_tokens WHERE expires_at <= {0} OR family_id IN (SELECT family_id"
    " FROM refresh_families WHERE revoked_at IS NOT NULL OR expires_at <= {0})",
    "DELETE FROM refresh_families WHERE revoked_at IS NOT NULL OR expires_at <= {0}",
    "DELETE FROM refresh_tokens WHERE token_hash IN (SELECT token_hash FROM (SELECT"
    " token_hash, ROW_NUMBER() OVER (PARTITION BY family_id ORDER BY spent_at DESC) AS n"
    " FROM refresh_tokens WHERE spent_at IS NOT NULL) AS ranked WHERE n > {1})",
)


def prune_statement(sql: str, mark: str, now_s: float) -> tuple[str, tuple[float, ...]]:
    """One of :data:`PRUNE` in a driver's placeholder ``mark``, with its arguments."""
    text = sql.format(mark, SPENT_KEPT_PER_FAMILY)
    return text, (now_s,) * sql.count("{0}")


def rows_by_hash(rows: Iterable[tuple[object, ...]]) -> dict[bytes, TokenRow]:
    """:data:`SELECT_ROWS`' result keyed by token hash."""
    return {
        bytes(row[0]): TokenRow(str(row[1]), str(row[2]), float(row[3]), row[4], bool(row[5]))  # type: ignore[arg-type]
        for row in rows
    }


class SqliteSessions:
    """Sessions in the user store's SQLite file, run on its thread (its bounded queue)."""

    def __init__(self, users: UserStore, rules: SessionRules) -> None:
        self.users = users
        self.rules = rules
        self._secret = b""

    @classmethod
    async def open(cls, users: UserStore, rules: SessionRules) -> SqliteSessions:
        """Create the tables and the successor secret if they are not there yet."""
        sessions = cls(users, rules)
        sessions._secret = await users.run(_sqlite_setup)
        return sessions

    async def open_family(self, username: str, now_s: float) -> tuple[Session, list[str]]:
        """See :meth:`Sessions.open_family`."""
        return await self.users.run(lambda db: self._open_family(db, username, now_s))

    async def refresh(self, token: str, now_s: float) -> Refreshed:
        """See :meth:`Sessions.refresh`."""
        return await self.users.run(lambda db: self._refresh(db, token, now_s))

    async def revoke_family_of(self, token: str, now_s: float) -> str | None:
        """See :meth:`Sessions.revoke_family_of`."""
        return await self.users.run(lambda db: self._revoke_family_of(db, token, now_s))

    async def revoke_user(self, username: str, now_s: float) -> int:
        """See :meth:`Sessions.revoke_user`."""

        def revoke(db: sqlite3.Connection) -> int:
            with _immediate(db):
                return _sqlite_revoke_where(
                    db, "username_key = ?", (username_key(username),), now_s, RevokeReason.ADMIN
                )

        return await self.users.run(revoke)

    async def prune(self, now_s: float) -> int:
        """See :meth:`Sessions.prune`."""

        def prune(db: sqlite3.Connection) -> int:
            with _immediate(db):
                return sum(db.execute(*prune_statement(sql, "?", now_s)).rowcount for sql in PRUNE)

        return await self.users.run(prune)

    # ---- on the store's thread -------------------------------------------------------------

    def _open_family(
        self, db: sqlite3.Connection, username: str, now_s: float
    ) -> tuple[Session, list[str]]:
        key = username_key(username)
        family_id, token = new_family_id(), new_token()
        expires_at = now_s + self.rules.ttl_s
        with _immediate(db):
            live = [
                row[0]
                for row in db.execute(
                    "SELECT family_id FROM refresh_families WHERE username_key = ? AND"
                    " revoked_at IS NULL AND expires_at > ? ORDER BY created_at, family_id",
                    (key, now_s),
                )
            ]
            excess = excess_families(live, self.rules.families_per_user)
            for old in excess:
                _sqlite_revoke_where(db, "family_id = ?", (old,), now_s, RevokeReason.LIMIT)
            db.execute(
                "INSERT INTO refresh_families (family_id, username_key, username, created_at,"
                " expires_at) VALUES (?, ?, ?, ?, ?)",
                (family_id, key, username, now_s, expires_at),
            )
            db.execute(
                "INSERT INTO refresh_tokens (token_hash, family_id, expires_at) VALUES (?, ?, ?)",
                (token_hash(token), family_id, expires_at),
            )
        return Session(username, family_id, token, self.rules.ttl_s), excess

    def _refresh(self, db: sqlite3.Connection, token: str, now_s: float) -> Refreshed:
        presented_hash = token_hash(token)
        next_token = successor(self._secret, token)
        next_hash = token_hash(next_token)
        with _immediate(db):
            for _ in range(2):  # a lost race is judged again on the rows as they are now
                rows = rows_by_hash(
                    db.execute(SELECT_ROWS.format("?"), (presented_hash, next_hash))
                )
                presented, following = rows.get(presented_hash), rows.get(next_hash)
                outcome = judge(presented, following, now_s, self.rules.grace_s)
                if outcome is not Outcome.ROTATED:
                    break
                assert presented is not None
                spent = db.execute(
                    "UPDATE refresh_tokens SET spent_at = ?"
                    " WHERE token_hash = ? AND spent_at IS NULL",
                    (now_s, presented_hash),
                )
                if spent.rowcount == 1:
                    expires_at = now_s + self.rules.ttl_s
                    db.execute(
                        "INSERT INTO refresh_tokens (token_hash, family_id, expires_at)"
                        " VALUES (?, ?, ?)",
                        (next_hash, presented.family_id, expires_at),
                    )
                    db.execute(
                        "UPDATE refresh_families SET expires_at = ? WHERE family_id = ?",
                        (expires_at, presented.family_id),
                    )
                    return answer(outcome, presented, next_token, self.rules.ttl_s)
            if outcome is Outcome.ROTATED:  # spent by another twice over: cannot happen here
                raise Unavailable("the token is being spent elsewhere; retry", 1)
            if outcome is Outcome.REUSED:
                assert presented is not None
                _sqlite_revoke_where(
                    db, "family_id = ?", (presented.family_id,), now_s, RevokeReason.REUSE
                )
        return settle(outcome, presented, following, next_token, now_s)

    def _revoke_family_of(self, db: sqlite3.Connection, token: str, now_s: float) -> str | None:
        with _immediate(db):
            row = db.execute(
                "SELECT family_id FROM refresh_tokens WHERE token_hash = ?", (token_hash(token),)
            ).fetchone()
            if row is None:
                return None
            revoked = _sqlite_revoke_where(
                db, "family_id = ?", (row[0],), now_s, RevokeReason.LOGOUT
            )
        return row[0] if revoked else None


def answer(outcome: Outcome, presented: TokenRow, token: str, expires_in_s: float) -> Refreshed:
    """A refresh that hands out ``token`` (of ``presented``'s family) for ``expires_in_s``."""
    session = Session(presented.username, presented.family_id, token, max(0, int(expires_in_s)))
    return Refreshed(outcome, session, presented.family_id)


def settle(
    outcome: Outcome,
    presented: TokenRow | None,
    following: TokenRow | None,
    next_token: str,
    now_s: float,
) -> Refreshed:
    """The answer for an outcome other than a won rotation (grace, invalid, reused)."""
    if outcome is Outcome.GRACE:
        assert presented is not None and following is not None
        return answer(outcome, presented, next_token, following.expires_at - now_s)
    return Refreshed(outcome, None, None if presented is None else presented.family_id)


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an exception) on an autocommit
    connection: the write lock is taken before the first read, so a read-then-write
    cannot interleave with another writer."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _sqlite_setup(db: sqlite3.Connection) -> bytes:
    with _immediate(db):
        for statement in SQLITE_SCHEMA:
            db.execute(statement)
        db.execute(
            "INSERT OR IGNORE INTO refresh_secret (id, secret) VALUES (1, ?)", (new_secret(),)
        )
        (secret,) = db.execute("SELECT secret FROM refresh_secret WHERE id = 1").fetchone()
    return bytes(secret)


def _sqlite_revoke_where(
    db: sqlite3.Connection, where: str, args: tuple[object, ...], now_s: float, reason: RevokeReason
) -> int:
    """Revoke the live families matching ``where``; how many."""
    revoked = db.execute(
        f"UPDATE refresh_families SET revoked_at = ?, revoked_reason = ?"
        f" WHERE revoked_at IS NULL AND {where}",
        (now_s, str(reason), *args),
    ).rowcount
    return int(revoked)
