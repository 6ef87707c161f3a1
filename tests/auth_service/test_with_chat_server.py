"""The auth service's tokens against the real chat server, and what the chat server loads."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from chat_server.messages import Ack, Joined, Message, Welcome
from chatlab.harness import (
    AUDIENCE,
    FAST_ARGON2,
    ISSUER,
    ROOT,
    AuthProcess,
    KeyPair,
    ServerProcess,
    free_port,
    http_request,
)
from tests.support import Client, opens_chat, wait_until

PASSWORD = "correct horse"


def _services(
    start_auth: Callable[..., AuthProcess],
    start_server: Callable[..., ServerProcess],
    tmp_path: Path,
    **settings: str,
) -> tuple[AuthProcess, ServerProcess]:
    (tmp_path / "auth").mkdir()
    (tmp_path / "chat").mkdir()
    auth = start_auth(tmp_path / "auth", **settings)
    chat = start_server(
        tmp_path / "chat", event_loop="asyncio", jwt_public_key=str(auth.public_path)
    )
    return auth, chat


@pytest.fixture
def services(
    start_auth: Callable[..., AuthProcess],
    start_server: Callable[..., ServerProcess],
    tmp_path: Path,
) -> tuple[AuthProcess, ServerProcess]:
    """An auth service, then a chat server verifying with the public key it wrote."""
    return _services(start_auth, start_server, tmp_path)


@pytest.fixture
def store_services(
    start_auth: Callable[..., AuthProcess],
    start_server: Callable[..., ServerProcess],
    tmp_path: Path,
    store_env: dict[str, str],
) -> tuple[AuthProcess, ServerProcess]:
    """``services`` on each store in turn."""
    return _services(start_auth, start_server, tmp_path, **store_env)


async def test_an_issued_token_opens_a_chat_connection(
    store_services: tuple[AuthProcess, ServerProcess],
):
    auth, chat = store_services
    assert auth.register("Alice", PASSWORD).status == 201
    token = auth.token("alice", PASSWORD)
    client = await Client.connect(chat, token)
    try:
        welcome = await client.expect(Welcome)
        assert welcome.user == "Alice"
        joined = await client.join("lobby")
        assert isinstance(joined, Joined) and "Alice" in joined.members
        await client.say("lobby", "hello from a real token", ref="r-1")
        message = await client.expect(Message)
        assert (message.user, message.body, message.ref) == (
            "Alice",
            "hello from a real token",
            "r-1",
        )
        ack = await client.expect(Ack)
        assert (ack.seq, ack.ref) == (message.seq, "r-1")
    finally:
        await client.close()


def _sign_with_the_services_key(auth: AuthProcess, **claims: object) -> str:
    key = load_pem_private_key(auth.private_path.read_bytes(), password=None)
    kid = auth.jwks()["keys"][0]["kid"]
    now = int(time.time())
    payload = {
        "sub": "alice",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + 600,
        "jti": uuid.uuid4().hex,
        **claims,
    }
    return jwt.encode(payload, key, algorithm="EdDSA", headers={"kid": kid})  # type: ignore[arg-type]


async def test_the_chat_server_refuses_foreign_expired_and_misaddressed_tokens(
    services: tuple[AuthProcess, ServerProcess], keys: KeyPair
):
    auth, chat = services
    now = int(time.time())
    refused = {
        "signed by another key": keys.mint("alice"),
        "expired": _sign_with_the_services_key(auth, iat=now - 1000, exp=now - 100),
        "wrong audience": _sign_with_the_services_key(auth, aud="someone-else"),
    }
    for case, token in refused.items():
        with pytest.raises(InvalidStatus) as error:
            await connect(chat.url, additional_headers={"Authorization": f"Bearer {token}"})
        assert error.value.response.status_code == 401, case
    # the same signing path with good claims is accepted: the refusals were the claims'
    client = await Client.connect(chat, _sign_with_the_services_key(auth))
    await client.expect(Welcome)
    await client.close()


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_the_chat_server_never_loads_argon2(services: tuple[AuthProcess, ServerProcess]):
    auth, chat = services
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import chat_server.__main__, chat_server.service, "
            "chat_server.transport.websockets, sys; print('argon2' in sys.modules)",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "False"
    assert chat.proc is not None and auth.proc is not None
    assert "argon2" not in _maps(chat.proc.pid)
    # the check can see argon2's library: the auth service's own process has it
    assert "_argon2_cffi_bindings" in _maps(auth.proc.pid)


def _kid(token: str) -> str:
    return jwt.get_unverified_header(token)["kid"]


async def test_rotation_old_and_new_tokens_open_chat_until_the_old_expire(
    start_auth: Callable[..., AuthProcess],
    start_server: Callable[..., ServerProcess],
    tmp_path: Path,
):
    ttl_s = 6
    (tmp_path / "auth").mkdir()
    (tmp_path / "chat").mkdir()
    auth = start_auth(tmp_path / "auth", token_ttl_s=ttl_s)
    chat = start_server(
        tmp_path / "chat",
        event_loop="asyncio",
        jwt_jwks_url=auth.url("/.well-known/jwks.json"),
        jwks_refresh_s=1,
        jwt_leeway_s=0,  # expiry to the second (one host: no clock skew to allow for)
    )
    assert auth.register("alice", PASSWORD).status == 201
    old_token = auth.token("alice", PASSWORD)
    old_expiry = time.time() + ttl_s
    rotated = subprocess.run(
        [sys.executable, "-m", "auth_service", "rotate-key"],
        cwd=auth.workdir,
        env=auth.env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert rotated.returncode == 0, rotated.stderr
    assert "JWT_JWKS_URL" in rotated.stdout  # it says what the chat server needs

    def signed_anew() -> str | None:  # the running service looks at its keyring once a second
        token = auth.token("alice", PASSWORD)
        return token if _kid(token) != _kid(old_token) else None

    new_token = await wait_until(signed_anew, 10, "a token signed with the new key", 0.2)
    assert {_kid(old_token), _kid(new_token)} <= {k["kid"] for k in auth.jwks()["keys"]}
    # the chat server learns the new kid in the background (refused at most until then)
    await wait_until(lambda: opens_chat(chat, new_token), 10, "the chat server trusting it", 0.2)
    assert await opens_chat(chat, old_token)  # the old key still opens chat
    time.sleep(max(0.0, old_expiry - time.time()) + 1.5)  # the old token's life runs out
    assert not await opens_chat(chat, old_token)  # until its tokens expire
    assert await opens_chat(chat, auth.token("alice", PASSWORD))


async def test_auth_inline_regression_serves_login_on_the_chat_loop(
    start_auth: Callable[..., AuthProcess],
    start_server: Callable[..., ServerProcess],
    tmp_path: Path,
):
    (tmp_path / "auth").mkdir()
    (tmp_path / "chat").mkdir()
    auth = start_auth(tmp_path / "auth")
    assert auth.register("bob", PASSWORD).status == 201
    inline_port = free_port()
    chat = start_server(
        tmp_path / "chat",
        event_loop="asyncio",
        regression="auth_inline",
        auth_inline_port=inline_port,
        jwt_public_key=str(auth.public_path),
        # the auth service's own settings, read by the inline login from the same env
        auth_db=str(auth.db_path),
        jwt_private_key=str(auth.private_path),
        jwt_keyring=str(auth.keyring_path),
        login_rate_per_client_per_min=0,
        **FAST_ARGON2,
    )
    reply = http_request(
        "POST",
        f"http://127.0.0.1:{inline_port}/login",
        {"username": "bob", "password": PASSWORD},
    )
    assert reply.status == 200, reply.body
    token = reply.json()["access_token"]
    assert await opens_chat(chat, token)
    wrong = http_request(
        "POST", f"http://127.0.0.1:{inline_port}/login", {"username": "bob", "password": "x" * 9}
    )
    assert wrong.status == 401
    assert "REGRESSION=auth_inline" in chat.log()
    assert chat.proc is not None and "_argon2_cffi_bindings" in _maps(chat.proc.pid)
