"""What outside clients (browsers, curl, wscat, raw sockets) found, answered as documented on
each transport: no token in any log line, wrong methods answered 405, 401 that says how to
authenticate, ``rate_limited`` with its ``ref``, and ``since`` checked."""

from __future__ import annotations

import asyncio
import re
import socket

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from chat_server.messages import Error, Joined, Welcome
from tests.support import Client, KeyPair, ServerProcess, wait_until

pytestmark = pytest.mark.transports

JWT = re.compile(r"eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")


def _http(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as it is on a raw socket; the status, headers and body answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed without an answer (got {data!r})"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return int(lines[0].split()[1]), headers, body


async def test_debug_logs_hold_no_token(start_server, keys: KeyPair, transport: str):
    server = start_server(event_loop="asyncio", log_level="debug")
    by_header, by_query = keys.mint("alice"), keys.mint("bob")
    alice = await Client.connect(server, by_header)
    await alice.expect(Welcome)
    async with connect(f"{server.url}?token={by_query}") as bob:
        await asyncio.wait_for(bob.recv(), 10)
    expired = keys.mint("carol", ttl_s=-120)
    with pytest.raises(InvalidStatus):
        await connect(f"{server.url}?token={expired}", open_timeout=10)
    await alice.close()
    # the server saw the closes (and logged what it logs of them)
    await wait_until(lambda: server.stats()["connections"] == 0, 10, "the server seeing the closes")
    log = server.log_path.read_text()
    assert "debug" in log.lower() or "DEBUG" in log, "the server did not log at debug"
    for token in (by_header, by_query, expired):
        for part in token.split("."):
            assert part not in log
    assert not JWT.search(log), JWT.search(log)
    if transport == "websockets":  # it logs each handshake's headers (picows does not)
        # the challenge of the refused handshake, as sent: its parameters are no token
        assert '> WWW-Authenticate: Bearer realm="chatlab", error="invalid_token"' in log


async def test_wrong_method_gets_405_with_allow(server: ServerProcess, keys: KeyPair):
    token = keys.mint("alice")
    body = b'{"type":"send","room":"lobby","body":"hello"}'
    requests = {
        "POST /ws with a body": (
            b"POST /ws HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        ),
        "PUT /healthz": b"PUT /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        "DELETE /ws": b"DELETE /ws HTTP/1.1\r\nHost: x\r\n\r\n",
    }
    for case, request in requests.items():
        status, headers, _ = await asyncio.to_thread(_http, server.port, request)
        assert (status, headers.get("allow")) == (405, "GET"), case
    # and the server still serves
    status, _, _ = await asyncio.to_thread(
        _http, server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert status == 200


async def test_401_names_the_bearer_scheme_and_the_query_route(server: ServerProcess):
    request = (
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    status, headers, body = await asyncio.to_thread(_http, server.port, request)
    assert status == 401
    assert headers["www-authenticate"].startswith("Bearer")
    assert b"Authorization: Bearer" in body and b"?token=" in body


async def test_rate_limited_error_carries_the_sends_ref(start_server, keys: KeyPair):
    server = start_server(event_loop="asyncio", rate_limit_per_s=1, rate_limit_burst=3)
    alice = await Client.connect(server, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.join("lobby")
    for i in range(4):
        await alice.say("lobby", f"m{i}", ref=f"r-{i}")
    refused: list[Error] = []
    while len(refused) < 2:  # the two messages and acks come too
        if isinstance(frame := await alice.recv(), Error):
            refused.append(frame)
    assert [(e.code, e.ref) for e in refused] == [("rate_limited", "r-2"), ("rate_limited", "r-3")]


async def test_negative_or_huge_since_is_a_bad_request(server: ServerProcess, keys: KeyPair):
    alice = await Client.connect(server, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.send_raw('{"type":"join","room":"lobby","since":-1}')
    error = await alice.expect(Error)
    assert error.code == "bad_request" and "since" in error.detail
    await alice.send_raw('{"type":"join","room":"lobby","since":99999999999999999999999}')
    error = await alice.expect(Error)
    assert error.code == "bad_request" and "since" in error.detail, error
    assert "float" not in error.detail
    joined = await alice.join("lobby", since=0)
    assert isinstance(joined, Joined)
