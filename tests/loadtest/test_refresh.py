"""The load test's users keep their session with refresh tokens: they log in once and
refresh (body mode) when their access token nears expiry; and how a grant reads its
expiry (pure code, in-process)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from chatlab.harness import AuthProcess, KeyPair, ServerProcess
from loadtest.auth import REFRESH_AT_SHARE, Grant
from tests.support.auth import logins_answered, metric_sum
from tests.support.locust import LOAD_TEST_AUTH, run_locust

USERS = 10


def test_users_refresh_instead_of_logging_in_again_when_their_tokens_near_expiry(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    # 3-second access tokens in a 9-second run: each user's token nears expiry twice or more
    (tmp_path / "auth").mkdir()
    auth = AuthProcess(tmp_path / "auth", **{**LOAD_TEST_AUTH, "TOKEN_TTL_S": "3"}).start()
    try:
        server = start_server(
            jwt_public_key=str(auth.public_path), jwt_leeway_s="0", log_level="warning"
        )
        run = run_locust(
            tmp_path,
            "-H",
            server.url,
            "--stages",
            f"1s:{USERS}@20,7s:{USERS},2s:{USERS}:quiet",
            "--pause",
            "0.3-0.5",
            "--auth-url",
            auth.url(),
        )
        rotated = metric_sum(auth, "auth_refresh_total", outcome="rotated")
        refused = metric_sum(auth, "auth_refresh_total") - rotated
        logins = logins_answered(auth)
    finally:
        auth.stop()
    assert run.returncode == 0, run.output
    assert run.failures == [], run.failures
    # one login per user (its first use also registers it), every renewal a refresh
    assert run.count("login") == logins == USERS, run.output
    assert rotated >= USERS, run.output
    assert run.count("refresh") == rotated
    assert refused == 0
    deliveries = run.report["deliveries"]
    assert deliveries["sent"] > 0
    assert deliveries["missing"] == deliveries["unacked"] == deliveries["duplicates"] == 0
    assert deliveries["unexpected_closes"] == 0


def test_a_grant_from_a_reply_is_refreshed_at_its_share_of_the_access_tokens_life() -> None:
    grant = Grant.from_reply(
        {"access_token": "a", "expires_in": 100, "refresh_token": "r"}, now=1000.0
    )
    assert grant == Grant("a", 1100.0, 1000.0 + 100 * REFRESH_AT_SHARE, "r")
    assert not grant.refresh_due(1000.0 + 100 * REFRESH_AT_SHARE - 1)
    assert grant.refresh_due(1000.0 + 100 * REFRESH_AT_SHARE)


def test_a_token_from_a_file_has_its_expiry_from_exp_and_is_never_refreshed(
    keys: KeyPair,
) -> None:
    token = keys.mint("load0", ttl_s=600)
    grant = Grant.from_token(token)
    assert grant.refresh_token is None
    assert grant.expires_at is not None and grant.refresh_at is not None
    assert grant.refresh_at < grant.expires_at
    assert not grant.refresh_due(grant.expires_at + 1)
    assert Grant.from_token("not a jwt") == Grant("not a jwt")
