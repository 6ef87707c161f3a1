"""Every bad input gets its contract answer, and everyone else keeps being served (on each
transport)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from chat_server.messages import (
    Ack,
    Error,
    HistoryRequest,
    Join,
    Leave,
    Message,
    Presence,
    Send,
    Welcome,
)
from chat_server.settings import TRANSPORTS
from tests.support import AUDIENCE, ISSUER, Client, KeyPair, ServerProcess, wait_until

pytestmark = pytest.mark.transports

CODECS = ["orjson", "protobuf"]


@pytest.fixture(params=CODECS)
def codec_server(request: pytest.FixtureRequest, start_server) -> ServerProcess:
    """A server per codec (JSON family via orjson, and protobuf), small limits for the tests."""
    return start_server(
        serializer=request.param,
        event_loop="asyncio",
        max_protocol_errors=50,
        max_body_chars=100,
    )


@pytest.fixture(scope="module", params=TRANSPORTS)
def handshake_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, keys: KeyPair
) -> Iterator[ServerProcess]:
    """A default server per transport, shared by the tests of the handshake's answers (each
    opens its own connections and closes them; none changes what the next one is told)."""
    server = ServerProcess(
        tmp_path_factory.mktemp("handshake"), keys, transport=request.param, event_loop="asyncio"
    )
    try:
        yield server.start()
    finally:
        server.kill()


def _text_frame_for(server: ServerProcess) -> str | bytes:
    # the wrong frame type for this server
    return b"\x00\x01binary" if server.serializer != "protobuf" else '{"type":"join","room":"x"}'


def _bad_frames(server: ServerProcess) -> list[tuple[str, object, str]]:
    """(case, frame or typed message, expected code) in the server's own codec where typed."""
    if server.serializer == "protobuf":
        undecodable = b"\xff\xff\xff\xff"
        no_kind = b""
        unknown_kind = b"\x2a\x00"  # field 5 (not a ClientMessage kind), length 0
    else:
        undecodable = "{not json"
        no_kind = '{"room":"lobby"}'
        unknown_kind = '{"type":"shout","room":"lobby"}'
    cases: list[tuple[str, object, str]] = [
        ("wrong frame type", _text_frame_for(server), "unsupported"),
        ("undecodable", undecodable, "bad_request"),
        ("no kind", no_kind, "bad_request"),
        ("unknown kind", unknown_kind, "bad_request"),
        ("empty body", Send(room="lobby", body=""), "bad_request"),
        ("ref over 64", Send(room="lobby", body="x", ref="r" * 65), "bad_request"),
        ("limit 0", HistoryRequest(room="lobby", limit=0), "bad_request"),
        ("limit 501", HistoryRequest(room="lobby", limit=501), "bad_request"),
        ("empty room", Join(room=""), "invalid_room"),
        ("bad room chars", Join(room="no spaces"), "invalid_room"),
        ("room over 64", Send(room="r" * 65, body="x"), "invalid_room"),
        ("body too large", Send(room="lobby", body="x" * 101), "too_large"),
        ("send not joined", Send(room="elsewhere", body="x"), "not_in_room"),
        ("leave not joined", Leave(room="elsewhere"), "not_in_room"),
        # precedence: bad_request beats invalid_room beats too_large beats not_in_room
        ("empty body and bad room", Send(room="", body=""), "bad_request"),
        ("bad room and too large", Send(room="", body="x" * 101), "invalid_room"),
        ("too large not joined", Send(room="elsewhere", body="x" * 101), "too_large"),
    ]
    if server.serializer != "protobuf":
        cases += [
            ("mistyped field", '{"type":"send","room":"lobby","body":5}', "bad_request"),
            ("missing field", '{"type":"send","room":"lobby"}', "bad_request"),
            ("not an object", "[1,2,3]", "bad_request"),
        ]
    return cases


async def test_each_bad_input_gets_its_error_and_others_are_served(
    codec_server: ServerProcess, keys: KeyPair
):
    alice = await Client.connect(codec_server, keys.mint("alice"))
    bob = await Client.connect(codec_server, keys.mint("bob"))
    await alice.expect(Welcome)
    await bob.expect(Welcome)
    await alice.join("lobby")
    await bob.join("lobby")
    await alice.expect(Presence)
    for case, payload, code in _bad_frames(codec_server):
        if isinstance(payload, (bytes, str)):
            await alice.send_raw(payload)
        else:
            await alice.send(payload)  # type: ignore[arg-type]
        error = await alice.expect(Error)
        assert error.code == code, f"{case}: {error}"
        assert error.detail, case
        # the connection stays open and the other member is still served
        await bob.say("lobby", f"after {case}")
        message = await alice.expect(Message)
        assert message.body == f"after {case}"
        assert (await bob.expect(Message)).body == f"after {case}"
        await bob.expect(Ack)


async def test_error_echoes_the_send_ref(codec_server: ServerProcess, keys: KeyPair):
    alice = await Client.connect(codec_server, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.send(Send(room="nowhere", body="x", ref="c-9"))
    error = await alice.expect(Error)
    assert (error.code, error.ref) == ("not_in_room", "c-9")


async def test_too_many_protocol_errors_close_1008(start_server, keys: KeyPair):
    server = start_server(event_loop="asyncio", max_protocol_errors=3)
    alice = await Client.connect(server, keys.mint("alice"))
    await alice.expect(Welcome)
    for _ in range(3):
        await alice.send_raw("{broken")
        assert (await alice.expect(Error)).code == "bad_request"
    with pytest.raises(ConnectionClosed) as closed:
        await alice.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert "too many protocol errors" in closed.value.rcvd.reason
    # the server still serves others
    bob = await Client.connect(server, keys.mint("bob"))
    await bob.expect(Welcome)


async def test_oversized_frame_closes_1009(start_server, keys: KeyPair):
    server = start_server(event_loop="asyncio", max_frame_bytes=1024)
    alice = await Client.connect(server, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.send_raw('{"type":"send","room":"lobby","body":"' + "x" * 2000 + '"}')
    with pytest.raises(ConnectionClosed) as closed:
        await alice.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    # the limit is on the message: one sent in small frames that add up to more is refused too
    bob = await Client.connect(server, keys.mint("bob"))
    await bob.expect(Welcome)
    await bob.conn.send(['{"type":"send","room":"lobby","body":"', "x" * 600, "x" * 600, '"}'])
    with pytest.raises(ConnectionClosed) as closed:
        await bob.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_text_frame_that_is_not_utf8_closes_1007(server: ServerProcess, keys: KeyPair):
    alice = await Client.connect(server, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.conn.send(b'{"type":"join","room":"\xff"}', text=True)
    with pytest.raises(ConnectionClosed) as closed:
        await alice.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007


async def test_past_max_connections_the_handshake_gets_503(start_server, keys: KeyPair):
    server = start_server(event_loop="asyncio", max_connections=2)
    alice = await Client.connect(server, keys.mint("alice"))
    bob = await Client.connect(server, keys.mint("bob"))
    for client in (alice, bob):
        await client.expect(Welcome)
    with pytest.raises(InvalidStatus) as refused:
        await Client.connect(server, keys.mint("carol"))
    assert refused.value.response.status_code == 503
    assert b"MAX_CONNECTIONS" in refused.value.response.body
    await bob.close()

    async def admitted() -> Client | None:  # the server sees bob's close a moment later
        try:
            return await Client.connect(server, keys.mint("carol"))
        except InvalidStatus as again:
            assert again.response.status_code == 503
            return None

    carol = await wait_until(admitted, 10, "a place freed by a close given to a new connection")
    await carol.expect(Welcome)


def _forged_token(**claims: object) -> str:
    other = ed25519.Ed25519PrivateKey.generate()
    now = int(time.time())
    payload = {"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 60}
    return jwt.encode({**payload, **claims}, other, algorithm="EdDSA")


def _none_token() -> str:
    now = int(time.time())
    payload = {"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 60}
    return jwt.encode(payload, None, algorithm="none")  # type: ignore[arg-type]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256_with_public_key(keys: KeyPair) -> str:
    """The classic confusion attack: HMAC-sign with the server's public key as the secret."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    now = int(time.time())
    claims = {"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 60}
    payload = _b64(json.dumps(claims).encode())
    signing_input = f"{header}.{payload}".encode()
    signature = hmac.new(keys.public_path.read_bytes(), signing_input, hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(signature)}"


TOKEN_CASES: dict[str, Callable[[KeyPair], str | None]] = {
    "missing": lambda keys: None,
    "expired": lambda keys: keys.mint("alice", ttl_s=-120),
    "forged": lambda keys: _forged_token(),
    "alg none": lambda keys: _none_token(),
    "hs256 with the public key": _hs256_with_public_key,
    "wrong audience": lambda keys: keys.mint("alice", aud="someone-else"),
    "wrong issuer": lambda keys: keys.mint("alice", iss="evil-auth"),
    "no sub": lambda keys: keys.mint(None),
    "garbage": lambda keys: "not.a.jwt",
}


@pytest.mark.parametrize("case", TOKEN_CASES)
async def test_bad_token_is_refused_with_401(
    handshake_server: ServerProcess, keys: KeyPair, case: str
):
    token = TOKEN_CASES[case](keys)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with pytest.raises(InvalidStatus) as refused:
        await connect(handshake_server.url, additional_headers=headers, open_timeout=10)
    response = refused.value.response
    assert response.status_code == 401
    assert response.body and len(response.body.decode().strip().splitlines()) == 1


async def test_token_in_query_string_is_accepted(handshake_server: ServerProcess, keys: KeyPair):
    async with connect(f"{handshake_server.url}?token={keys.mint('carol')}") as conn:
        frame = await asyncio.wait_for(conn.recv(), 10)
        assert "carol" in frame


async def test_wrong_subprotocol_gets_400_naming_ours_but_401_first(
    handshake_server: ServerProcess, keys: KeyPair
):
    with pytest.raises(InvalidStatus) as refused:
        await connect(
            handshake_server.url,
            additional_headers={"Authorization": f"Bearer {keys.mint('alice')}"},
            subprotocols=["chatlab.protobuf"],
        )
    assert refused.value.response.status_code == 400
    assert b"chatlab.json" in refused.value.response.body
    with pytest.raises(InvalidStatus) as refused:
        await connect(handshake_server.url, subprotocols=["chatlab.protobuf"])
    assert refused.value.response.status_code == 401


async def test_no_subprotocol_gets_the_servers_codec(
    handshake_server: ServerProcess, keys: KeyPair
):
    async with connect(
        handshake_server.url, additional_headers={"Authorization": f"Bearer {keys.mint('alice')}"}
    ) as conn:
        assert conn.subprotocol is None
        frame = await asyncio.wait_for(conn.recv(), 10)
        assert isinstance(frame, str) and '"codec":"orjson"' in frame


def test_healthz_stats_and_unknown_path_on_the_websocket_port(server: ServerProcess):
    assert server.proc is not None
    worker = str(server.proc.pid)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["X-Chatlab-Worker"] == worker
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/stats", timeout=5) as resp:
        assert resp.headers["Content-Type"] == "application/json"
        assert json.loads(resp.read())["connections"] == 0
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/nope", timeout=5)
    assert missing.value.code == 404
    assert missing.value.headers["X-Chatlab-Worker"] == worker
