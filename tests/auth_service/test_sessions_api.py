"""Refresh tokens through the service's HTTP API, on SQLite and on PostgreSQL: login
returns both tokens, /refresh rotates, a replay revokes the family, two tabs racing
share one successor, /logout, revoke-sessions, expiry and pruning, the bounds, the
cookie mode, and no token (nor its hash) in the log at LOG_LEVEL=debug."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import jwt
import psycopg
import pytest

from chatlab.harness import AuthProcess
from tests.support import wait_until
from tests.support.auth import TEST_SETTINGS, RawReply, at_once, raw_request

PASSWORD = "correct horse"
GRACE_S = 2
#: the bounded service's: a refresh token lives 3 s, two sessions a user, 3 refreshes at once
BOUNDED_TTL_S = 3


@pytest.fixture(scope="module")
def auth(
    module_store_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AuthProcess]:
    """One service the module's tests share (distinct usernames), logging at debug."""
    service = AuthProcess(
        tmp_path_factory.mktemp("sessions"),
        **TEST_SETTINGS,
        REFRESH_GRACE_S=str(GRACE_S),
        LOG_LEVEL="debug",
        **module_store_env,
    ).start()
    yield service
    service.stop()


@pytest.fixture(scope="module")
def bounded(
    module_store_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AuthProcess]:
    """A service with short and small session bounds (same store as ``auth``)."""
    service = AuthProcess(
        tmp_path_factory.mktemp("bounded"),
        **TEST_SETTINGS,
        REFRESH_TTL_S=str(BOUNDED_TTL_S),
        REFRESH_FAMILIES_PER_USER="2",
        REFRESH_RATE_PER_CLIENT_PER_MIN="6",
        REFRESH_BURST_PER_CLIENT="3",
        **module_store_env,
    ).start()
    yield service
    service.stop()


_serial = iter(range(1_000_000))


@pytest.fixture
def user(auth: AuthProcess) -> str:
    """A user registered on the shared store (both services see it)."""
    name = f"s{next(_serial)}_{time.monotonic_ns() % 10**8}"
    assert auth.register(name, PASSWORD).status == 201
    return name


def _login(service: AuthProcess, username: str, **extra: Any) -> RawReply:
    reply = raw_request(
        service, "POST", "/login", {"username": username, "password": PASSWORD, **extra}
    )
    assert reply.status == 200, reply
    return reply


def _refresh(service: AuthProcess, token: str, source: str = "127.0.0.1") -> RawReply:
    return raw_request(service, "POST", "/refresh", {"refresh_token": token}, source=source)


def _refreshed(service: AuthProcess, token: str) -> str:
    reply = _refresh(service, token)
    assert reply.status == 200, reply
    return str(reply.json()["refresh_token"])


def _invalid(reply: RawReply) -> bool:
    return reply.status == 401 and reply.json()["error"] == "invalid_token"


def _sub(access_token: str) -> str:
    return str(jwt.decode(access_token, options={"verify_signature": False})["sub"])


def _metric(service: AuthProcess, name: str, label: str, value: str) -> float:
    text = service.get("/metrics").body.decode()
    found = re.search(rf'^{name}\{{{label}="{value}"\}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _query(service: AuthProcess, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """``sql`` (with ``?`` placeholders) on the service's own store."""
    url = service.settings.get("AUTH_DB_URL")
    if url:
        with psycopg.connect(url, autocommit=True) as db:
            return list(db.execute(sql.replace("?", "%s"), args).fetchall())
    with sqlite3.connect(service.db_path) as db:
        return list(db.execute(sql, args).fetchall())


def _live_tokens(service: AuthProcess, username: str) -> int:
    ((count,),) = _query(
        service,
        "SELECT count(*) FROM refresh_tokens t JOIN refresh_families f"
        " ON f.family_id = t.family_id WHERE f.username_key = ? AND t.spent_at IS NULL"
        " AND f.revoked_at IS NULL AND t.expires_at > ?",
        username.casefold(),
        time.time(),
    )
    return int(count)


# ---- login, refresh, reuse, logout ----------------------------------------------------------


def test_login_returns_an_access_token_and_a_refresh_token(auth: AuthProcess, user: str):
    body = _login(auth, user).json()
    assert set(body) == {
        "access_token",
        "token_type",
        "expires_in",
        "refresh_token",
        "refresh_expires_in",
    }
    assert _sub(body["access_token"]) == user and body["token_type"] == "Bearer"
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", body["refresh_token"])
    assert body["refresh_expires_in"] == 2592000  # REFRESH_TTL_S's default, 30 days


def test_refresh_rotates_and_hashes_no_password(auth: AuthProcess, user: str):
    first = _login(auth, user).json()
    verified = _metric(auth, "auth_hash_seconds_count", "op", "verify")
    reply = _refresh(auth, first["refresh_token"])
    assert reply.status == 200, reply
    second = reply.json()
    assert _sub(second["access_token"]) == user
    assert second["refresh_token"] != first["refresh_token"]
    assert second["refresh_expires_in"] == 2592000
    third = _refreshed(auth, second["refresh_token"])
    assert third not in (first["refresh_token"], second["refresh_token"])
    assert _live_tokens(auth, user) == 1
    assert _metric(auth, "auth_hash_seconds_count", "op", "verify") == verified


def test_a_spent_token_whose_successor_is_spent_revokes_the_family(auth: AuthProcess, user: str):
    reused = _metric(auth, "auth_refresh_total", "outcome", "reused")
    first = _login(auth, user).json()["refresh_token"]
    second = _refreshed(auth, first)
    third = _refreshed(auth, second)
    other_session = _login(auth, user).json()["refresh_token"]
    assert _invalid(_refresh(auth, first))  # a replay: its successor is spent already
    assert _invalid(_refresh(auth, third))  # so the family's live token stops working too
    assert _invalid(_refresh(auth, second))
    assert _metric(auth, "auth_refresh_total", "outcome", "reused") == reused + 1
    # the user's other session (another login) lives on
    assert _refresh(auth, other_session).status == 200


def test_a_spent_token_after_its_grace_revokes_the_family(auth: AuthProcess, user: str):
    first = _login(auth, user).json()["refresh_token"]
    second = _refreshed(auth, first)
    answers: list[int] = []

    def refused_once_the_grace_is_over() -> bool:
        reply = _refresh(auth, first)
        answers.append(reply.status)
        if reply.status == 200:  # within the grace: the same successor again
            assert reply.json()["refresh_token"] == second
        return _invalid(reply)

    asyncio.run(wait_until(refused_once_the_grace_is_over, 20, lambda: answers))
    assert _invalid(_refresh(auth, second))
    assert _live_tokens(auth, user) == 0


def test_two_tabs_refreshing_at_once_get_one_successor_and_stay_signed_in(
    auth: AuthProcess, user: str
):
    token = _login(auth, user).json()["refresh_token"]
    for _ in range(3):
        replies = at_once([lambda token=token: _refresh(auth, token) for _ in range(4)])
        assert [r.status for r in replies] == [200] * 4, replies
        successors = {r.json()["refresh_token"] for r in replies}
        assert len(successors) == 1
        assert {_sub(r.json()["access_token"]) for r in replies} == {user}
        assert _live_tokens(auth, user) == 1
        (token,) = successors


def test_logout_revokes_the_family_and_any_token_answers_204(auth: AuthProcess, user: str):
    first = _login(auth, user).json()["refresh_token"]
    live = _refreshed(auth, first)
    kept = _login(auth, user).json()["refresh_token"]
    reply = raw_request(auth, "POST", "/logout", {"refresh_token": first})
    assert reply.status == 204 and reply.body == b""
    assert _invalid(_refresh(auth, live))
    assert _refresh(auth, kept).status == 200
    for unknown in ({"refresh_token": live}, {"refresh_token": "no"}, {}):
        assert raw_request(auth, "POST", "/logout", unknown).status == 204


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"not json", 400),
        (b"[]", 400),
        (b'{"refresh_token": 7}', 400),
        (b'{"refresh_token": "short"}', 401),
        (b'{"refresh_token": "' + b"A" * 43 + b'"}', 401),
        (b"", 401),  # no token in the body, and no cookie
        (b"{}", 401),
    ],
)
def test_a_malformed_or_unknown_token_is_refused(auth: AuthProcess, body: bytes, status: int):
    reply = raw_request(auth, "POST", "/refresh", body=body)
    assert reply.status == status, reply
    assert reply.json()["error"] == {400: "bad_request", 401: "invalid_token"}[status]


def test_revoke_sessions_ends_every_session_of_one_user(auth: AuthProcess, user: str):
    tokens = [_login(auth, user).json()["refresh_token"] for _ in range(2)]
    tokens[1] = _refreshed(auth, tokens[1])
    other = f"{user}x"
    assert auth.register(other, PASSWORD).status == 201
    others = _login(auth, other).json()["refresh_token"]
    done = auth.run("revoke-sessions", user.upper())
    assert done.returncode == 0, done.stderr
    assert re.search(r"\brevoked 2 sessions\b", done.stdout), done.stdout
    assert all(_invalid(_refresh(auth, t)) for t in tokens)
    assert _refresh(auth, others).status == 200
    again = auth.run("revoke-sessions", user)
    assert again.returncode == 0 and "revoked 0 sessions" in again.stdout
