"""Several auth replicas on one PostgreSQL behind real chat servers: a rotation on one
replica with no 401 anywhere, and a replica killed under load with no registration lost
and clients (the load test's, the web page) failing over to the others."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest

from chatlab.harness import AuthProcess, KeyPair, ServerProcess
from loadtest.auth import AuthClient
from loadtest.client import AuthError
from tests.support import CHROMIUM, opens_chat, wait_until
from tests.support.auth import TEST_SETTINGS, logins_answered
from tests.support.browser import CHROMEDRIVER, browsers

PASSWORD = "correct horse"


def _kid(token: str) -> str:
    return jwt.get_unverified_header(token)["kid"]


def _jwks_urls(replicas: list[AuthProcess]) -> str:
    return ",".join(replica.url("/.well-known/jwks.json") for replica in replicas)


@pytest.fixture
def chat_in_front(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> Callable[[list[AuthProcess]], ServerProcess]:
    """Start a chat server taking its keys from every replica's JWK set (refreshed each second)."""

    def start(replicas: list[AuthProcess]) -> ServerProcess:
        (tmp_path / "chat").mkdir()
        return start_server(
            tmp_path / "chat",
            event_loop="asyncio",
            jwt_jwks_url=_jwks_urls(replicas),
            jwks_refresh_s=1,
        )

    return start


async def test_a_token_from_one_replica_verifies_after_another_rotates_with_no_401(
    start_replicas: Callable[..., list[AuthProcess]],
    chat_in_front: Callable[[list[AuthProcess]], ServerProcess],
    auth_db_url: str,
):
    # the rule: a key is published AUTH_KEY_ACTIVATION_S before it signs, which is more
    # than the chat server's JWKS_REFRESH_S + its fetch timeout
    a, b = start_replicas(2, auth_db_url=auth_db_url, auth_key_activation_s=8)
    chat = chat_in_front([a, b])
    assert a.register("alice", PASSWORD).status == 201
    old_token = a.token("alice", PASSWORD)
    assert await opens_chat(chat, old_token)

    rotated = b.run("rotate-key")
    assert rotated.returncode == 0, rotated.stderr
    assert "JWT_JWKS_URL" in rotated.stdout and "JWKS_REFRESH_S" in rotated.stdout
    old_kid = _kid(old_token)
    # every login until both replicas sign with the new key, and the first ones after: each
    # token opens chat at its first try, whichever replica issued it
    new_tokens = {a.port: "", b.port: ""}
    after_switch = 0

    async def switched() -> bool:
        nonlocal after_switch
        for replica in (a, b):
            token = replica.token("alice", PASSWORD)
            assert await opens_chat(chat, token), f"401 for a token of kid {_kid(token)}"
            if _kid(token) != old_kid:
                new_tokens[replica.port] = token
                after_switch += 1
        return after_switch >= 4

    await wait_until(switched, 60, "both replicas signing with the new key", 0.25)
    assert _kid(new_tokens[a.port]) == _kid(new_tokens[b.port]) != old_kid
    assert {old_kid, _kid(new_tokens[a.port])} <= {key["kid"] for key in a.jwks()["keys"]}
    assert await opens_chat(chat, old_token)  # tokens of the retired key stay good


async def test_a_replica_killed_under_login_load_loses_no_registration(
    start_replicas: Callable[..., list[AuthProcess]],
    chat_in_front: Callable[[list[AuthProcess]], ServerProcess],
    auth_db_url: str,
):
    a, b = start_replicas(2, auth_db_url=auth_db_url, hash_pool_size=1)
    chat = chat_in_front([a, b])
    client = AuthClient([a.url(), b.url()], timeout_s=10, max_attempts=3)
    created: list[str] = []
    failures: list[str] = []
    tokens: list[str] = []
    killed = threading.Event()
    stop = threading.Event()
    lock = threading.Lock()

    def user(worker: int) -> None:
        index = 0
        while not stop.is_set():
            name = f"load{worker}_{index}"
            index += 1
            try:
                if client.register(name, PASSWORD):
                    with lock:
                        created.append(name)
                token = client.login(name, PASSWORD).access_token
            except AuthError as exc:
                with lock:
                    failures.append(f"{name}: {exc} ({'after' if killed.is_set() else 'before'})")
                continue
            if killed.is_set():
                with lock:
                    tokens.append(token)

    workers = [threading.Thread(target=user, args=(w,)) for w in range(4)]
    for worker in workers:
        worker.start()
    try:
        await wait_until(
            lambda: len(created) >= 20 and logins_answered(a) and logins_answered(b),
            60,
            lambda: f"no load on both replicas: {failures}",
        )
        a.kill()  # SIGKILL, with requests in flight
        killed.set()
        at_kill = len(created)
        await wait_until(
            lambda: len(created) >= at_kill + 20,
            60,
            lambda: f"no registrations after the kill: {failures}",
        )
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
    assert failures == []  # every call found a replica: the killed one's were passed on
    for name in created:  # every registration answered 201 is in the shared database
        assert b.login(name, PASSWORD).status == 200, name
    assert tokens and await opens_chat(chat, tokens[-1])
    assert await opens_chat(chat, b.token(created[0], PASSWORD))


def test_the_page_fails_over_to_another_replica(
    tmp_path: Path, keys: KeyPair, auth_db_url: str, monkeypatch: pytest.MonkeyPatch
):
    if shutil.which(CHROMEDRIVER) is None or shutil.which(CHROMIUM) is None:
        pytest.skip("no chromium or chromium-driver: CI and the setup script install them")
    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium may never fetch a browser
    replicas = []
    for index in range(2):
        (tmp_path / f"replica{index}").mkdir()
        replicas.append(
            AuthProcess(tmp_path / f"replica{index}", **TEST_SETTINGS, AUTH_DB_URL=auth_db_url)
        )
    (tmp_path / "chat").mkdir()
    chat = ServerProcess(
        tmp_path / "chat",
        keys,
        event_loop="asyncio",
        jwt_jwks_url=_jwks_urls(replicas),
        jwks_refresh_s=1,
        auth_public_url=",".join(replica.url() for replica in replicas),
    )
    try:
        for replica in replicas:
            replica.env["AUTH_CORS_ORIGINS"] = f"http://127.0.0.1:{chat.port}"
            replica.start()
        chat.start()
        with browsers(tmp_path, "page") as (page,):
            page.open(f"http://127.0.0.1:{chat.port}/")
            page.sign_in("pager", register=True)
            # kill the replica the page used: it goes back there first next time
            used = next(r for r in replicas if logins_answered(r))
            used.kill()
            page.field("logout").click()
            page.wait(lambda: page.field("login-panel").is_displayed(), "logged out")
            page.field("username").clear()
            page.sign_in("pager", register=False)
            page.join("lobby")
            page.say("still here")
            page.wait(lambda: [m["body"] for m in page.messages("lobby")] == ["still here"], "sent")
    finally:
        chat.kill()
        for replica in replicas:
            replica.kill()
