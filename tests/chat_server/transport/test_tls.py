"""TLS on the chat server (TLS_CERT_FILE/TLS_KEY_FILE): wss:// and https:// on both
transports and both loops, through the loop's own SSL transport.

One server per transport and loop is shared by the module's tests; the CA is a
throwaway one (:mod:`chatlab.throwaway_ca`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from chat_server.settings import SPECS, TRANSPORTS
from chat_server.transport.accept import HANDSHAKE_TIMEOUT_S
from chatlab.throwaway_ca import ThrowawayCA
from chatlab.tls import client_context
from tests.support import ROOT, KeyPair, ServerProcess, closed_by_server, served

LOOPS = ("asyncio", "uvloop")
COMBOS = [(transport, loop) for transport in TRANSPORTS for loop in LOOPS]
IDS = [f"{transport}-{loop}" for transport, loop in COMBOS]
#: room past the handshake bound for a loaded machine: a bound, not a timing
SLACK_S = 10.0


@pytest.fixture(scope="module")
def tls_servers(
    tmp_path_factory: pytest.TempPathFactory, keys: KeyPair, ca: ThrowawayCA
) -> Iterator[dict[tuple[str, str], ServerProcess]]:
    """A chat server with TLS on each transport and loop."""
    servers: dict[tuple[str, str], ServerProcess] = {}
    try:
        for transport, loop in COMBOS:
            server = ServerProcess(
                tmp_path_factory.mktemp(f"tls-{transport}-{loop}"),
                keys,
                ca_file=ca.ca_file,
                transport=transport,
                event_loop=loop,
                tls_cert_file=ca.cert_file,
                tls_key_file=ca.key_file,
            )
            servers[transport, loop] = server
            server.start()
        yield servers
    finally:
        for server in servers.values():
            server.kill()


@pytest.fixture(params=COMBOS, ids=IDS)
def tls_server(
    request: pytest.FixtureRequest, tls_servers: dict[tuple[str, str], ServerProcess]
) -> ServerProcess:
    """The TLS server of one transport and loop."""
    return tls_servers[request.param]


def _get(url: str, context: ssl.SSLContext) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10, context=context) as resp:
        return resp.status, resp.read()


def test_a_client_trusting_the_ca_chats_over_wss_and_reads_the_page_over_https(
    tls_server: ServerProcess, keys: KeyPair, ca: ThrowawayCA
):
    assert tls_server.url.startswith("wss://")
    asyncio.run(served(tls_server, keys.mint("alice")))  # joins, sends, gets message and ack
    context = client_context(str(ca.ca_file))
    status, body = _get(tls_server.http_url("/healthz"), context)
    assert status == 200, body
    status, page = _get(tls_server.http_url("/"), context)
    assert status == 200 and b"<html" in page.lower()
    assert "listening on wss://" in tls_server.log()


def test_a_client_trusting_another_ca_is_refused(
    tls_server: ServerProcess, keys: KeyPair, wrong_ca: ThrowawayCA
):
    wrong = client_context(str(wrong_ca.ca_file))

    async def open_websocket() -> None:
        async with connect(tls_server.url, ssl=wrong, open_timeout=10):
            pass

    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(open_websocket())
    with pytest.raises(urllib.error.URLError) as refused:
        _get(tls_server.http_url("/healthz"), wrong)
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)


def _connected(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setblocking(False)
    return sock


def test_plain_text_to_the_tls_port_is_closed_while_a_tls_client_is_served(
    tls_server: ServerProcess, keys: KeyPair
):
    async def scenario() -> bytes:
        with _connected(tls_server.port) as plain:
            plain.send(
                b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            answer = await closed_by_server(plain, HANDSHAKE_TIMEOUT_S + SLACK_S)
        await served(tls_server, keys.mint("bob"))
        return answer

    answer = asyncio.run(scenario())
    assert not answer.startswith(b"HTTP/"), answer  # nothing of the service in plain text


def test_clients_stalled_in_the_tls_handshake_are_dropped_while_others_are_served(
    tls_servers: dict[tuple[str, str], ServerProcess], keys: KeyPair
):
    """Each server at once: one client says nothing, another stops in its ClientHello
    (a record header, no record); both are dropped within HANDSHAKE_TIMEOUT_S while
    an honest TLS client is served."""

    async def scenario() -> None:
        stalled = []
        for server in tls_servers.values():
            silent = _connected(server.port)
            halfway = _connected(server.port)
            halfway.send(b"\x16\x03\x01\x02\x00")  # a handshake record of 512 bytes: none follow
            stalled += [silent, halfway]
        try:
            for server in tls_servers.values():
                await served(server, keys.mint("carol"))
            await asyncio.gather(
                *(closed_by_server(sock, HANDSHAKE_TIMEOUT_S + SLACK_S) for sock in stalled)
            )
        finally:
            for sock in stalled:
                sock.close()

    asyncio.run(scenario())


def _run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m chat_server ARGS`` with ``env`` over an environment without settings."""
    clean = {k: v for k, v in os.environ.items() if k not in {s.env for s in SPECS}}
    return subprocess.run(
        [sys.executable, "-m", "chat_server", *args],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        cwd=cwd,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _write_garbage(path: Path) -> Path:
    path.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    return path


@pytest.mark.parametrize(
    ("case", "at_fault"),
    [
        ("cert without key", "TLS_KEY_FILE"),
        ("key without cert", "TLS_CERT_FILE"),
        ("missing cert file", "TLS_CERT_FILE"),
        ("missing key file", "TLS_KEY_FILE"),
        ("cert not a certificate", "TLS_CERT_FILE"),
        ("key of another certificate", "TLS_KEY_FILE"),
        ("missing CA file", "TLS_CA_FILE"),
    ],
)
def test_a_bad_tls_setting_exits_2_naming_it(
    case: str,
    at_fault: str,
    *,
    tmp_path: Path,
    keys: KeyPair,
    ca: ThrowawayCA,
    wrong_ca: ThrowawayCA,
):
    cert, key = str(ca.cert_file), str(ca.key_file)
    tls = {
        "cert without key": {"TLS_CERT_FILE": cert},
        "key without cert": {"TLS_KEY_FILE": key},
        "missing cert file": {"TLS_CERT_FILE": str(tmp_path / "none.pem"), "TLS_KEY_FILE": key},
        "missing key file": {"TLS_CERT_FILE": cert, "TLS_KEY_FILE": str(tmp_path / "none.key")},
        "cert not a certificate": {
            "TLS_CERT_FILE": str(_write_garbage(tmp_path / "garbage.pem")),
            "TLS_KEY_FILE": key,
        },
        "key of another certificate": {
            "TLS_CERT_FILE": cert,
            "TLS_KEY_FILE": str(wrong_ca.key_file),
        },
        "missing CA file": {"TLS_CA_FILE": str(tmp_path / "none-ca.pem")},
    }[case]
    assert set(tls) <= {spec.env for spec in SPECS}
    result = _run({"JWT_PUBLIC_KEY": str(keys.public_path), **tls}, tmp_path, "--check")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"bad setting {at_fault}=" in lines[0], result.stderr


def test_a_good_pair_and_ca_file_pass_the_check(tmp_path: Path, keys: KeyPair, ca: ThrowawayCA):
    tls = {
        "TLS_CERT_FILE": str(ca.cert_file),
        "TLS_KEY_FILE": str(ca.key_file),
        "TLS_CA_FILE": str(ca.ca_file),
    }
    result = _run({"JWT_PUBLIC_KEY": str(keys.public_path), **tls}, tmp_path, "--check")
    assert result.returncode == 0, result.stderr


def test_a_post_over_tls_is_answered_405_and_closed(tls_server: ServerProcess, ca: ThrowawayCA):
    """The method gate's answer goes out whole over TLS, which has no half-close."""

    async def post() -> bytes:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", tls_server.port, ssl=client_context(str(ca.ca_file))
        )
        try:
            writer.write(b"POST /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\nhi")
            await writer.drain()
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S + SLACK_S):
                return await reader.read()  # to the end: the server closes
        finally:
            writer.close()

    answer = asyncio.run(post())
    assert answer.startswith(b"HTTP/1.1 405"), answer
    assert b"allow: get" in answer.lower(), answer
    assert "Traceback" not in tls_server.log()  # no error on the way (TLS has no write_eof)
