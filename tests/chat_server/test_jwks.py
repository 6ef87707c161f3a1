"""JWT_JWKS_URL: keys from a JWK set by kid, loaded at start, refreshed in the background."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
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

from chatlab.harness import http_request
from tests.support import (
    AUDIENCE,
    ISSUER,
    KeyPair,
    ServerProcess,
    free_port,
    opens_chat,
    wait_until,
)
from tests.support.prometheus import scrape_metrics


class JwksServer:
    """A real HTTP server on 127.0.0.1 serving a JWK set that the test can change."""

    def __init__(self) -> None:
        self.keys: dict[str, ed25519.Ed25519PrivateKey] = {}
        #: what GET answers: "set" (the JWK set), "[]" (valid JSON, not a set), "truncated"
        self.answer = "set"
        self.requests: collections.Counter[str] = collections.Counter()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                answer = owner.answer
                owner.requests[answer] += 1
                body = b"[]" if answer == "[]" else json.dumps(owner.document()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                # "truncated": the length promised, half the body, then the connection closes
                self.wfile.write(body[: len(body) // 2] if answer == "truncated" else body)

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
    await wait_until(lambda: opens_chat(server, jwks.mint("k2")), 15, "the new key taken")
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
        await wait_until(
            lambda: opens_chat(server, jwks.mint("k3")), 10, "the new key of the set still up"
        )
        assert await opens_chat(server, jwks.mint("k1"))
    finally:
        other.httpd.server_close()


def test_no_jwks_url_answering_at_start_exits_2(tmp_path: Path, keys: KeyPair):
    urls = ",".join(f"http://127.0.0.1:{free_port()}/.well-known/jwks.json" for _ in range(2))
    server = ServerProcess(tmp_path, keys, jwt_jwks_url=urls)
    with pytest.raises(RuntimeError, match="exited 2"):
        server.start()
    assert "JWT_JWKS_URL" in server.log()


# ---- a refresh that nothing stops --------------------------------------------------------

#: a replica that answers its first request half and is SIGKILLed in the middle of it
DYING_REPLICA = """
import os, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "4096")
        self.end_headers()
        self.wfile.write(b'{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "')
        self.wfile.flush()
        os.kill(os.getpid(), signal.SIGKILL)

HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


async def _follows_a_revocation(server: ServerProcess, jwks: JwksServer) -> None:
    """Revoke k1 and publish k2 at the JWK server: k2 opens chat within a few refresh
    intervals (1 s each), and k1's tokens are refused from then on."""
    revoked = jwks.mint("k1")
    del jwks.keys["k1"]
    jwks.add_key("k2")
    await wait_until(lambda: opens_chat(server, jwks.mint("k2")), 10, "the new key accepted")
    assert not await opens_chat(server, revoked)


@pytest.mark.parametrize("answer", ["[]", "truncated"])
async def test_a_bad_answer_does_not_stop_the_refresh(start_server, jwks: JwksServer, answer: str):
    server = start_server(event_loop="asyncio", jwt_jwks_url=jwks.url, jwks_refresh_s=1)
    assert await opens_chat(server, jwks.mint("k1"))
    jwks.answer = answer
    await wait_until(lambda: jwks.requests[answer] >= 2, 15, "two refreshes met the bad answer")
    jwks.answer = "set"
    await _follows_a_revocation(server, jwks)
    assert "JWK set refresh from" in server.log()  # each failure was said


async def test_a_replica_killed_mid_answer_does_not_stop_the_refresh(
    start_server, jwks: JwksServer
):
    port = free_port()
    dying_url = f"http://127.0.0.1:{port}/.well-known/jwks.json"
    # the dying replica is down at start (the server starts on the other's keys)
    server = start_server(
        event_loop="asyncio", jwt_jwks_url=f"{jwks.url},{dying_url}", jwks_refresh_s=1
    )
    replica = subprocess.Popen([sys.executable, "-c", DYING_REPLICA, str(port)])
    try:
        assert replica.wait(timeout=30) == -9  # killed in the middle of answering a refresh
    finally:
        replica.kill()
    await _follows_a_revocation(server, jwks)
    assert "IncompleteRead" in server.log()


async def test_an_unknown_kid_wakes_a_refresh(start_server, jwks: JwksServer):
    server = start_server(event_loop="asyncio", jwt_jwks_url=jwks.url, jwks_refresh_s=600)
    jwks.add_key("k2")
    # the first k2 token is refused and wakes a refresh; a later one opens, long before 600 s
    await wait_until(lambda: opens_chat(server, jwks.mint("k2")), 15, "the new key accepted")
    assert jwks.requests["set"] >= 2


def _healthz(server: ServerProcess) -> tuple[int, str]:
    reply = http_request("GET", f"http://127.0.0.1:{server.port}/healthz", timeout_s=5)
    return reply.status, reply.body.decode()


async def test_a_stale_set_keeps_its_keys_and_says_so(start_server, jwks: JwksServer):
    metrics_port = free_port()
    server = start_server(
        event_loop="asyncio",
        jwt_jwks_url=jwks.url,
        jwks_refresh_s=1,
        jwks_max_age_s=2,
        metrics_port=metrics_port,
    )
    status, body = _healthz(server)
    assert status == 200
    assert "jwks age" in body
    assert scrape_metrics(metrics_port)["chat_jwks_max_age_seconds"] == 2
    jwks.answer = "[]"
    await wait_until(lambda: "stale" in _healthz(server)[1], 15, "/healthz says stale")
    assert _healthz(server)[0] == 200  # an auth outage is no chat outage
    assert await opens_chat(server, jwks.mint("k1"))  # availability: the keys held serve
    assert scrape_metrics(metrics_port)["chat_jwks_age_seconds"] > 2
    await wait_until(lambda: "JWK set stale" in server.log(), 10, "the stale set logged")
    jwks.answer = "set"
    await wait_until(lambda: "stale" not in _healthz(server)[1], 15, "fresh again")
