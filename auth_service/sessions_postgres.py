"""Sessions in PostgreSQL (``AUTH_DB_URL``), shared by every replica of the auth service.

The same rules as :class:`~auth_service.sessions.SqliteSessions` (the table in
:mod:`auth_service.sessions`), each operation one transaction on the service's
:class:`~auth_service.database.Database`. Two replicas racing one token: both read it
unspent, both run the conditional update ``... WHERE token_hash = %s AND spent_at IS
NULL``; PostgreSQL makes the second wait for the first's row lock and, once the first
commits, re-checks the condition (READ COMMITTED), which no longer holds, so it
updates nothing; it then reads the rows again (a new snapshot, the first's successor
in it) and is judged again: a grace answer with the same successor, or past the grace
a reuse. One successor, whatever the interleaving. A user's logins are serialised by
an advisory lock on their name while the families-per-user bound is applied.
"""

from __future__ import annotations

import hashlib

import psycopg

from auth_service.database import Database
from auth_service.errors import Unavailable
from auth_service.sessions import (
    PRUNE,
    SELECT_ROWS,
    Outcome,
    Refreshed,
    RevokeReason,
    Session,
    SessionRules,
    answer,
    excess_families,
    judge,
    new_family_id,
    new_secret,
    new_token,
    prune_statement,
    rows_by_hash,
    settle,
    successor,
    token_hash,
)
from auth_service.users import username_key


def _user_lock(key: str) -> int:
    """The advisory lock id of a username's session families (64 bits, signed)."""
    digest = hashlib.sha256(b"chatlab refresh families " + key.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PostgresSessions:
    """Sessions in PostgreSQL, over the service's :class:`Database` (tables made by its schema)."""

    def __init__(self, database: Database, rules: SessionRules, secret: bytes) -> None:
        self.database = database
        self.rules = rules
        self._secret = secret

    @classmethod
    async def open(cls, database: Database, rules: SessionRules) -> PostgresSessions:
        """Read the successor secret, creating it if no replica has yet."""

        async def setup(conn: psycopg.AsyncConnection) -> bytes:
            await conn.execute(
                "INSERT INTO refresh_secret (id, secret) VALUES (1, %s)"
                " ON CONFLICT (id) DO NOTHING",
                (new_secret(),),
            )
            cursor = await conn.execute("SELECT secret FROM refresh_secret WHERE id = 1")
            row = await cursor.fetchone()
            assert row is not None
            return bytes(row[0])

        return cls(database, rules, await database.run(setup))

    async def open_family(self, username: str, now_s: float) -> tuple[Session, list[str]]:
        """See :meth:`auth_service.sessions.Sessions.open_family`."""
        key = username_key(username)
        family_id, token = new_family_id(), new_token()
        expires_at = now_s + self.rules.ttl_s

        async def open_one(conn: psycopg.AsyncConnection) -> list[str]:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_user_lock(key),))
                cursor = await conn.execute(
                    "SELECT family_id FROM refresh_families WHERE username_key = %s AND"
                    " revoked_at IS NULL AND expires_at > %s ORDER BY created_at, family_id",
                    (key, now_s),
                )
                live = [row[0] for row in await cursor.fetchall()]
                excess = excess_families(live, self.rules.families_per_user)
                if excess:
                    await _revoke_where(
                        conn, "family_id = ANY(%s)", (excess,), now_s, RevokeReason.LIMIT
                    )
                await conn.execute(
                    "INSERT INTO refresh_families (family_id, username_key, username, created_at,"
                    " expires_at) VALUES (%s, %s, %s, %s, %s)",
                    (family_id, key, username, now_s, expires_at),
                )
                await conn.execute(
                    "INSERT INTO refresh_tokens (token_hash, family_id, expires_at)"
                    " VALUES (%s, %s, %s)",
                    (token_hash(token), family_id, expires_at),
                )
                return excess

        excess = await self.database.run(open_one)
        return Session(username, family_id, token, self.rules.ttl_s), excess

    async def refresh(self, token: str, now_s: float) -> Refreshed:
        """See :meth:`auth_service.sessions.Sessions.refresh` (and this module's docstring)."""
        presented_hash = token_hash(token)
        next_token = successor(self._secret, token)
        next_hash = token_hash(next_token)
        select = SELECT_ROWS.format("%s")

        async def refresh_one(conn: psycopg.AsyncConnection) -> Refreshed:
            async with conn.transaction():
                for _ in range(2):  # a lost race is judged again on the rows as they are now
                    cursor = await conn.execute(select, (presented_hash, next_hash))
                    rows = rows_by_hash(await cursor.fetchall())
                    presented, following = rows.get(presented_hash), rows.get(next_hash)
                    outcome = judge(presented, following, now_s, self.rules.grace_s)
                    if outcome is not Outcome.ROTATED:
                        break
                    assert presented is not None
                    spent = await conn.execute(
                        "UPDATE refresh_tokens SET spent_at = %s"
                        " WHERE token_hash = %s AND spent_at IS NULL",
                        (now_s, presented_hash),
                    )
                    if spent.rowcount == 1:
                        expires_at = now_s + self.rules.ttl_s
                        # never a duplicate (its parent was unspent until now); DO NOTHING
                        # all the same, so that no key value could reach an error's text
                        await conn.execute(
                            "INSERT INTO refresh_tokens (token_hash, family_id, expires_at)"
                            " VALUES (%s, %s, %s) ON CONFLICT (token_hash) DO NOTHING",
                            (next_hash, presented.family_id, expires_at),
                        )
                        await conn.execute(
                            "UPDATE refresh_families SET expires_at = %s WHERE family_id = %s",
                            (expires_at, presented.family_id),
                        )
                        return answer(outcome, presented, next_token, self.rules.ttl_s)
                if outcome is Outcome.ROTATED:
                    raise Unavailable("the token is being spent elsewhere; retry", 1)
                if outcome is Outcome.REUSED:
                    assert presented is not None
                    await _revoke_where(
                        conn, "family_id = %s", (presented.family_id,), now_s, RevokeReason.REUSE
                    )
                return settle(outcome, presented, following, next_token, now_s)

        return await self.database.run(refresh_one)

    async def revoke_family_of(self, token: str, now_s: float) -> str | None:
        """See :meth:`auth_service.sessions.Sessions.revoke_family_of`."""

        async def revoke(conn: psycopg.AsyncConnection) -> str | None:
            async with conn.transaction():
                cursor = await conn.execute(
                    "SELECT family_id FROM refresh_tokens WHERE token_hash = %s",
                    (token_hash(token),),
                )
                row = await cursor.fetchone()
                if row is None:
                    return None
                revoked = await _revoke_where(
                    conn, "family_id = %s", (row[0],), now_s, RevokeReason.LOGOUT
                )
                return str(row[0]) if revoked else None

        return await self.database.run(revoke)

    async def revoke_user(self, username: str, now_s: float) -> int:
        """See :meth:`auth_service.sessions.Sessions.revoke_user`."""

        async def revoke(conn: psycopg.AsyncConnection) -> int:
            return await _revoke_where(
                conn, "username_key = %s", (username_key(username),), now_s, RevokeReason.ADMIN
            )

        return await self.database.run(revoke)

    async def prune(self, now_s: float) -> int:
        """See :meth:`auth_service.sessions.Sessions.prune`."""

        async def prune(conn: psycopg.AsyncConnection) -> int:
            pruned = 0
            async with conn.transaction():
                for sql in PRUNE:
                    cursor = await conn.execute(*prune_statement(sql, "%s", now_s))
                    pruned += cursor.rowcount
            return pruned

        return await self.database.run(prune)


async def _revoke_where(
    conn: psycopg.AsyncConnection,
    where: str,
    args: tuple[object, ...],
    now_s: float,
    reason: RevokeReason,
) -> int:
    """Revoke the live families matching ``where``; how many."""
    cursor = await conn.execute(
        "UPDATE refresh_families SET revoked_at = %s, revoked_reason = %s"
        f" WHERE revoked_at IS NULL AND {where}",
        (now_s, str(reason), *args),
    )
    return cursor.rowcount
