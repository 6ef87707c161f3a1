"""JWT_JWKS_URL: keys from a JWK set by kid, loaded at start, refreshed in the background."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from jwt.algorithms import OKPAlgorithm
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support import AUDIENCE, ISSUER, KeyPair, ServerProcess, free_port, opens_chat


class JwksServer:
    """A real HTTP server on 127.0.0.1 serving a JWK set that the test can change."""

    def __init__(self) -> None:
        self.keys: dict[str, ed25519.Ed25519PrivateKey] = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(owner.document()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/.well-known/jwks.json"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def add_key(self, kid: str) -> None:
        self.keys[kid] = ed25519.Ed25519PrivateKey.generate()

    def document(self) -> dict[str, object]:
        keys = []
        for kid, private in list(self.keys.items()):
            jwk = OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
            keys.append({**jwk, "kid": kid, "alg": "EdDSA", "use": "sig"})
        return {"keys": keys}

    def mint(self, kid: str, sub: str = "alice") -> str:
        now = int(time.time())
        claims = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 60}
        return jwt.encode(claims, self.keys[kid], algorithm="EdDSA", headers={"kid": kid})


@pytest.fixture
def jwks() -> Iterator[JwksServer]:
    server = JwksServer()
    server.add_key("k1")
    yield server
    server.httpd.shutdown()


async def test_keys_are_picked_by_kid_and_refreshed(start_server, jwks: JwksServer):
    server = start_server(event_loop="asyncio", jwt_jwks_url=jwks.url, jwks_refresh_s=1)
    assert await opens_chat(server, jwks.mint("k1"))
    jwks.add_key("k2")  # a rotation at the auth service
    deadline = time.monotonic() + 15
    while not await opens_chat(server, jwks.mint("k2")):
        assert time.monotonic() < deadline, "the new key was never picked up"
        time.sleep(0.2)
    assert await opens_chat(server, jwks.mint("k1"))  # the old key still verifies
    del jwks.keys["k1"]  # retired once its tokens expired
    token = jwks.mint("k2")
    old = jwt.encode(
        {"sub": "x", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60},
        ed25519.Ed25519PrivateKey.generate(),
        algorithm="EdDSA",
        headers={"kid": "k1"},
    )
    assert not await opens_chat(server, old)  # a forged token naming a known kid
    assert await opens_chat(server, token)


async def test_unknown_kid_is_refused_with_401(start_server, jwks: JwksServer):
    server = start_server(event_loop="asyncio", jwt_jwks_url=jwks.url)
    other = JwksServer()
    other.add_key("k9")
    try:
        async with connect(
            server.url, additional_headers={"Authorization": f"Bearer {other.mint('k9')}"}
        ):
            pytest.fail("a token with an unknown kid opened a connection")
    except InvalidStatus as refused:
        assert refused.response.status_code == 401
        assert b"kid" in refused.response.body
    finally:
        other.httpd.shutdown()


def test_unreachable_jwks_at_start_exits_2(tmp_path: Path, keys: KeyPair):
    server = ServerProcess(
        tmp_path, keys, jwt_jwks_url=f"http://127.0.0.1:{free_port()}/.well-known/jwks.json"
    )
    with pytest.raises(RuntimeError, match="exited 2"):
        server.start()
    assert "JWT_JWKS_URL" in server.log()


async def test_several_jwks_urls_trust_the_keys_of_every_set_that_answers(
    start_server, jwks: JwksServer
):
    other = JwksServer()
    other.add_key("k2")
    down = f"http://127.0.0.1:{free_port()}/.well-known/jwks.json"
    try:
        # one replica down at start: the server starts on the others' keys
        server = start_server(
            event_loop="asyncio", jwt_jwks_url=f"{down}, {jwks.url},{other.url}", jwks_refresh_s=1
        )
        assert await opens_chat(server, jwks.mint("k1"))
        assert await opens_chat(server, other.mint("k2"))
        # a set that stops answering keeps nobody's keys from the others
        other.httpd.shutdown()
        other.httpd.server_close()
        jwks.add_key("k3")
        deadline = time.monotonic() + 10
        while not await opens_chat(server, jwks.mint("k3")):
            assert time.monotonic() < deadline, "the new key of the set still up was never taken"
            time.sleep(0.2)
        assert await opens_chat(server, jwks.mint("k1"))
    finally:
        other.httpd.server_close()


def test_no_jwks_url_answering_at_start_exits_2(tmp_path: Path, keys: KeyPair):
    urls = ",".join(f"http://127.0.0.1:{free_port()}/.well-known/jwks.json" for _ in range(2))
    server = ServerProcess(tmp_path, keys, jwt_jwks_url=urls)
    with pytest.raises(RuntimeError, match="exited 2"):
        server.start()
    assert "JWT_JWKS_URL" in server.log()
