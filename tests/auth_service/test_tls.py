"""HTTPS on the auth service (TLS_CERT_FILE/TLS_KEY_FILE through uvicorn), and the chat
server fetching its JWK set over https, verified with TLS_CA_FILE.

One service is shared by the module's tests; the CA is a throwaway one
(:mod:`chatlab.throwaway_ca`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from auth_service.settings import SPECS
from chatlab.harness import AuthProcess, KeyPair, ServerProcess, http_request
from chatlab.throwaway_ca import ThrowawayCA
from chatlab.tls import client_context
from loadtest.auth import AuthClient
from loadtest.seed import seed
from tests.support import closed_by_server, opens_chat
from tests.support.auth import TEST_SETTINGS

PASSWORD = "correct horse"


def _tls(ca: ThrowawayCA) -> dict[str, str]:
    return {"TLS_CERT_FILE": str(ca.cert_file), "TLS_KEY_FILE": str(ca.key_file)}


@pytest.fixture(scope="module")
def https_auth(tmp_path_factory: pytest.TempPathFactory, ca: ThrowawayCA) -> Iterator[AuthProcess]:
    """An auth service serving https with the CA's server certificate."""
    service = AuthProcess(
        tmp_path_factory.mktemp("auth"), ca_file=ca.ca_file, **TEST_SETTINGS, **_tls(ca)
    )
    try:
        yield service.start()
    finally:
        service.stop()


def test_register_and_login_over_https_with_the_right_ca(https_auth: AuthProcess):
    assert https_auth.url().startswith("https://")
    assert https_auth.register("tls-alice", PASSWORD).status == 201
    reply = https_auth.login("tls-alice", PASSWORD)
    assert reply.status == 200, reply
    assert reply.json()["access_token"]
    assert "auth_service on https://" in https_auth.log()
    waited = https_auth.run("wait")  # the wait command trusts the certificate it serves
    assert waited.returncode == 0, waited.stderr


def test_a_client_trusting_another_ca_is_refused(https_auth: AuthProcess, wrong_ca: ThrowawayCA):
    with pytest.raises(urllib.error.URLError) as refused:
        http_request(
            "GET", https_auth.url("/healthz"), context=client_context(str(wrong_ca.ca_file))
        )
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)


def test_plain_http_to_the_https_port_is_closed_while_https_is_served(https_auth: AuthProcess):
    async def answer_to_plain_http() -> bytes:
        with socket.create_connection(("127.0.0.1", https_auth.port), timeout=10) as sock:
            sock.setblocking(False)
            sock.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            return await closed_by_server(sock, 30)

    answer = asyncio.run(answer_to_plain_http())
    assert not answer.startswith(b"HTTP/"), answer  # nothing of the API in plain text
    assert https_auth.get("/healthz").status == 200


@pytest.mark.parametrize(
    ("case", "at_fault"),
    [
        ("cert without key", "TLS_KEY_FILE"),
        ("key without cert", "TLS_CERT_FILE"),
        ("missing cert file", "TLS_CERT_FILE"),
        ("key of another certificate", "TLS_KEY_FILE"),
    ],
)
def test_a_bad_tls_setting_exits_2_naming_it(
    case: str, at_fault: str, *, tmp_path: Path, ca: ThrowawayCA, wrong_ca: ThrowawayCA
):
    cert, key = str(ca.cert_file), str(ca.key_file)
    tls = {
        "cert without key": {"TLS_CERT_FILE": cert},
        "key without cert": {"TLS_KEY_FILE": key},
        "missing cert file": {"TLS_CERT_FILE": str(tmp_path / "none.pem"), "TLS_KEY_FILE": key},
        "key of another certificate": {
            "TLS_CERT_FILE": cert,
            "TLS_KEY_FILE": str(wrong_ca.key_file),
        },
    }[case]
    assert set(tls) <= {spec.env for spec in SPECS}
    result = AuthProcess(tmp_path, **TEST_SETTINGS, **tls).run("wait")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"bad setting {at_fault}=" in lines[0], result.stderr


def test_the_chat_server_takes_the_jwk_set_over_https_verified_with_its_ca_file(
    https_auth: AuthProcess, ca: ThrowawayCA, tmp_path: Path
):
    jwks = {"JWT_JWKS_URL": https_auth.url("/.well-known/jwks.json"), "EVENT_LOOP": "asyncio"}
    unused = KeyPair(tmp_path)  # JWT_JWKS_URL rules; the harness needs a key on disk
    trusting = ServerProcess(tmp_path, unused, **jwks, TLS_CA_FILE=str(ca.ca_file))
    try:
        trusting.start()
        https_auth.register("tls-bob", PASSWORD)
        assert asyncio.run(opens_chat(trusting, https_auth.token("tls-bob", PASSWORD)))
    finally:
        trusting.kill()
    # without the CA file the system's CAs are asked, and they do not know this one
    untrusting = ServerProcess(tmp_path, unused, **jwks)
    result = subprocess.run(
        [sys.executable, "-m", "chat_server", "--check"],
        env=untrusting.env,
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "bad setting JWT_JWKS_URL=" in result.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in result.stderr


def test_loadtest_seed_registers_over_https_verified_with_its_ca_file(
    https_auth: AuthProcess, ca: ThrowawayCA
):
    trusting = AuthClient(https_auth.url(), ca_file=str(ca.ca_file), max_attempts=1)
    created, taken, tokens, failures = seed(trusting, ["tls-seed0", "tls-seed1"], 2, True)
    assert (created, taken, failures) == (2, 0, {}), failures
    assert set(tokens) == {"tls-seed0", "tls-seed1"}
    # without the CA file the system's CAs are asked, and they do not know this one
    untrusting = AuthClient(https_auth.url(), max_attempts=1)
    created, _, _, failures = seed(untrusting, ["tls-seed2"], 1, False)
    assert created == 0 and "tls-seed2" in failures, failures
