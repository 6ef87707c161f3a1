"""Refresh tokens through the service's HTTP API, on SQLite and on PostgreSQL: login
returns both tokens, /refresh rotates, a replay revokes the family, two tabs racing
share one successor, /logout, revoke-sessions, expiry and pruning, the bounds, the
cookie mode, and no token (nor its hash) in the log at LOG_LEVEL=debug."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any

import jwt
import psycopg
import pytest

from chatlab.harness import AuthProcess
from tests.support import wait_until
from tests.support.auth import TEST_SETTINGS, RawReply, at_once, raw_request

PASSWORD = "correct horse"
GRACE_S = 2
#: the bounded service's: a refresh token lives 3 s, two sessions a user, 10 refreshes at once
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
        **{
            **TEST_SETTINGS,
            "REFRESH_TTL_S": str(BOUNDED_TTL_S),
            "REFRESH_FAMILIES_PER_USER": "2",
            "REFRESH_RATE_PER_CLIENT_PER_MIN": "6",
            "REFRESH_BURST_PER_CLIENT": "10",
            **module_store_env,
        },
    ).start()
    yield service
    service.stop()


_serial = iter(range(1_000_000))


def _registered(service: AuthProcess) -> str:
    name = f"s{next(_serial)}_{time.monotonic_ns() % 10**8}"
    assert service.register(name, PASSWORD).status == 201
    return name


@pytest.fixture
def user(auth: AuthProcess) -> str:
    """A user registered on ``auth``."""
    return _registered(auth)


@pytest.fixture
def bounded_user(bounded: AuthProcess) -> str:
    """A user registered on ``bounded``."""
    return _registered(bounded)


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
    graces = _metric(auth, "auth_refresh_total", "outcome", "grace")
    answers: list[int] = []

    def refused_once_the_grace_is_over() -> bool:
        reply = _refresh(auth, first)
        answers.append(reply.status)
        if reply.status == 200:  # within the grace: the same successor again
            assert reply.json()["refresh_token"] == second
        return _invalid(reply)

    asyncio.run(wait_until(refused_once_the_grace_is_over, 20, lambda: answers))
    assert _metric(auth, "auth_refresh_total", "outcome", "grace") == graces + answers.count(200)
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
    logouts = _metric(auth, "auth_sessions_revoked_total", "reason", "logout")
    reply = raw_request(auth, "POST", "/logout", {"refresh_token": first})
    assert reply.status == 204 and reply.body == b""
    assert _metric(auth, "auth_sessions_revoked_total", "reason", "logout") == logouts + 1
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
    nobody = auth.run("revoke-sessions")
    assert nobody.returncode == 2 and "USERNAME" in nobody.stderr


# ---- cookie mode and CORS -------------------------------------------------------------------

ORIGIN = "http://127.0.0.1:8000"  # AUTH_CORS_ORIGINS' default: the chat server's page


def _cookie_attributes(set_cookie: str) -> tuple[str, dict[str, str]]:
    """A ``Set-Cookie`` value's ``name=value`` and its attributes (names lowercased)."""
    first, *rest = (part.strip() for part in set_cookie.split(";"))
    attributes = {}
    for part in rest:
        name, _, value = part.partition("=")
        attributes[name.lower()] = value
    return first, attributes


def _cookie_token(reply: RawReply) -> str:
    """The refresh token of an answer's two cookies (one per path, the same token)."""
    assert len(reply.cookies) == 2, reply
    values, paths = set(), set()
    for set_cookie in reply.cookies:
        pair, attributes = _cookie_attributes(set_cookie)
        name, _, value = pair.partition("=")
        assert name == "chatlab_refresh"
        assert {"httponly", "secure"} <= set(attributes)
        assert attributes["samesite"].lower() == "strict"
        values.add(value)
        paths.add(attributes["path"])
    assert paths == {"/refresh", "/logout"}
    (value,) = values
    return value


def _cleared(reply: RawReply) -> bool:
    """Both cookies cleared: empty, Max-Age=0, on each path."""
    cleared = {
        _cookie_attributes(c)[1]["path"]
        for c in reply.cookies
        if _cookie_attributes(c)[1].get("max-age") == "0"
    }
    return cleared == {"/refresh", "/logout"}


def _by_cookie(service: AuthProcess, path: str, token: str, body: bytes = b"") -> RawReply:
    return raw_request(
        service,
        "POST",
        path,
        body=body,
        headers={"Cookie": f"chatlab_refresh={token}", "Origin": ORIGIN},
    )


def test_cookie_mode_keeps_the_refresh_token_in_two_http_only_cookies(auth: AuthProcess, user: str):
    login = _login(auth, user, cookie=True)
    assert "refresh_token" not in login.json()
    assert login.json()["refresh_expires_in"] == 2592000
    first = _cookie_token(login)
    for set_cookie in login.cookies:
        assert _cookie_attributes(set_cookie)[1]["max-age"] == "2592000"
    reply = _by_cookie(auth, "/refresh", first)  # an empty body: the cookie is the token
    assert reply.status == 200, reply
    assert "refresh_token" not in reply.json() and _sub(reply.json()["access_token"]) == user
    second = _cookie_token(reply)
    assert second != first
    third = _cookie_token(_by_cookie(auth, "/refresh", second, b"{}"))
    # a replay: refused, and the browser told to forget both cookies
    refused = _by_cookie(auth, "/refresh", first)
    assert _invalid(refused) and _cleared(refused)
    assert _invalid(_by_cookie(auth, "/refresh", third))


def test_cookie_logout_revokes_and_clears_both_cookies(auth: AuthProcess, user: str):
    token = _cookie_token(_login(auth, user, cookie=True))
    reply = _by_cookie(auth, "/logout", token)
    assert reply.status == 204 and _cleared(reply)
    assert _invalid(_by_cookie(auth, "/refresh", token))


def test_the_pages_origin_may_send_credentials_and_others_may_not(auth: AuthProcess):
    preflight = raw_request(
        auth,
        "OPTIONS",
        "/refresh",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert preflight.status == 200, preflight
    assert preflight.header("access-control-allow-credentials") == "true"
    assert preflight.header("access-control-allow-origin") == ORIGIN
    answer = _by_cookie(auth, "/refresh", "A" * 43)
    assert answer.header("access-control-allow-credentials") == "true"
    assert answer.header("access-control-allow-origin") == ORIGIN
    elsewhere = raw_request(
        auth, "POST", "/refresh", body=b"", headers={"Origin": "http://evil.example"}
    )
    # without Access-Control-Allow-Origin the browser shows the page of another origin
    # nothing (Starlette marks every answer Allow-Credentials: alone, it grants nothing)
    assert elsewhere.header("access-control-allow-origin") is None


# ---- bounds: expiry and pruning, sessions per user, the rate limit ---------------------------


def test_a_refresh_token_expires_and_its_rows_are_pruned(bounded: AuthProcess, bounded_user: str):
    login = _login(bounded, bounded_user).json()
    assert login["refresh_expires_in"] == BOUNDED_TTL_S
    issued = time.time()
    reply = _refresh(bounded, login["refresh_token"])
    assert reply.status == 200 and reply.json()["refresh_expires_in"] == BOUNDED_TTL_S
    token = reply.json()["refresh_token"]
    key = bounded_user.casefold()

    def rows() -> int:
        ((count,),) = _query(
            bounded, "SELECT count(*) FROM refresh_families WHERE username_key = ?", key
        )
        return int(count)

    assert rows() == 1
    asyncio.run(wait_until(lambda: time.time() > issued + BOUNDED_TTL_S + 0.5, 20))
    invalid = _metric(bounded, "auth_refresh_total", "outcome", "invalid")
    assert _invalid(_refresh(bounded, token))
    assert _metric(bounded, "auth_refresh_total", "outcome", "invalid") == invalid + 1
    # the pruner (every REFRESH_TTL_S here) deletes the family and its tokens
    asyncio.run(wait_until(lambda: rows() == 0, 30, "the expired session pruned"))


def test_a_login_past_the_sessions_per_user_revokes_the_oldest(
    bounded: AuthProcess, bounded_user: str
):
    other = f"{bounded_user}o"
    assert bounded.register(other, PASSWORD).status == 201
    others = _login(bounded, other).json()["refresh_token"]
    limited = _metric(bounded, "auth_sessions_revoked_total", "reason", "limit")
    tokens = [_login(bounded, bounded_user).json()["refresh_token"] for _ in range(3)]
    assert _invalid(_refresh(bounded, tokens[0]))
    assert [_refresh(bounded, t).status for t in tokens[1:]] == [200, 200]
    assert _metric(bounded, "auth_sessions_revoked_total", "reason", "limit") == limited + 1
    # another user's session is untouched
    assert _refresh(bounded, others).status == 200


def test_refreshes_past_the_per_client_rate_get_429_and_others_are_served(
    bounded: AuthProcess, bounded_user: str
):
    token = _login(bounded, bounded_user).json()["refresh_token"]
    flood = [_refresh(bounded, "A" * 43, source="127.0.0.7") for _ in range(13)]
    statuses = [r.status for r in flood]
    assert statuses[:10] == [401] * 10 and 429 in statuses[10:], statuses
    limited = next(r for r in flood if r.status == 429)
    assert limited.json()["error"] == "rate_limited"
    assert int(limited.header("retry-after") or 0) >= 1
    logout = raw_request(bounded, "POST", "/logout", {}, source="127.0.0.7")
    assert logout.status == 429  # logouts draw on the same bucket
    # an honest client at another address is served meanwhile
    assert _refresh(bounded, token, source="127.0.0.8").status == 200


# ---- replicas on one PostgreSQL ----------------------------------------------------------


@pytest.fixture
def replicas(start_replicas: Callable[..., list[AuthProcess]], auth_db_url: str):
    return start_replicas(2, auth_db_url=auth_db_url)


def test_a_refresh_made_on_replica_a_works_on_replica_b(replicas: list[AuthProcess]):
    a, b = replicas
    assert a.register("roamer", PASSWORD).status == 201
    first = _login(a, "roamer").json()["refresh_token"]
    second = _refreshed(a, first)
    third = _refreshed(b, second)  # B honours A's successor
    fourth = _refreshed(a, third)  # and A B's
    # a replay on B revokes the family on A too
    assert _invalid(_refresh(b, second))
    assert _invalid(_refresh(a, fourth))


def test_two_replicas_racing_one_token_give_one_successor(
    replicas: list[AuthProcess], start_replicas: Callable[..., list[AuthProcess]], auth_db_url: str
):
    a, b = replicas
    assert a.register("racer", PASSWORD).status == 201
    for _ in range(8):
        token = _login(a, "racer").json()["refresh_token"]
        replies = at_once([lambda t=token: _refresh(a, t), lambda t=token: _refresh(b, t)])
        assert [r.status for r in replies] == [200, 200], replies
        assert len({r.json()["refresh_token"] for r in replies}) == 1
    # eight sessions, each with exactly one live token (REFRESH_FAMILIES_PER_USER is 50)
    assert _live_tokens(a, "racer") == 8
    # without a grace, exactly one of the two spends the token; the other is a replay
    c, d = start_replicas(2, auth_db_url=auth_db_url, refresh_grace_s=0)
    for _ in range(4):
        token = _login(c, "racer").json()["refresh_token"]
        replies = at_once([lambda t=token: _refresh(c, t), lambda t=token: _refresh(d, t)])
        assert sorted(r.status for r in replies) == [200, 401], replies


# ---- no token in any log ------------------------------------------------------------------


def _forms(token: str) -> list[str]:
    """How a token or its SHA-256 could appear in a log line."""
    digest = hashlib.sha256(token.encode()).digest()
    return [
        token,
        digest.hex(),
        digest.hex().upper(),
        base64.b64encode(digest).decode(),
        base64.urlsafe_b64encode(digest).decode().rstrip("="),
        repr(digest)[2:-1][:40],
    ]


def test_no_refresh_token_nor_its_hash_reaches_the_log_at_debug(
    auth: AuthProcess, user: str, request: pytest.FixtureRequest
):
    seen: list[str] = []
    first = _login(auth, user).json()["refresh_token"]
    second = _refreshed(auth, first)
    seen += [first, second, _refreshed(auth, first)]  # grace
    third = _refreshed(auth, second)
    seen.append(third)
    assert _invalid(_refresh(auth, first))  # reuse
    fourth = _login(auth, user).json()["refresh_token"]
    assert raw_request(auth, "POST", "/logout", {"refresh_token": fourth}).status == 204
    cookie = _cookie_token(_login(auth, user, cookie=True))
    fifth = _cookie_token(_by_cookie(auth, "/refresh", cookie))
    assert _by_cookie(auth, "/logout", fifth).status == 204
    seen += [fourth, cookie, fifth]
    done = auth.run("revoke-sessions", user)
    assert done.returncode == 0
    logs = {"service": auth.log(), "revoke-sessions": done.stdout + done.stderr}
    if "AUTH_DB_URL" in auth.settings:
        logs["postgres"] = request.getfixturevalue("postgres").log()
    assert "DEBUG" in logs["service"] and "revoked" in logs["service"]
    for name, text in logs.items():
        for token in seen:
            for form in _forms(token):
                assert form not in text, (name, form)
