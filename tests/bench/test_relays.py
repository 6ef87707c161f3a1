"""The bare relays (``python -m bench.relay``), each transport in each mode, as real processes
with real websocket clients: every member gets every message verbatim, the sender too;
fragmented messages arrive whole; rooms are apart; ``/healthz``, 404 and 1008; and the
coalesced relays write once per member per loop iteration.

How many writes reached a member is read from the kernel's counters of that member's
own socket (``TCP_INFO``: data segments received), which no other process moves; on
loopback one write of a few kilobytes is one segment. The relays that write per frame
are not held to a count: the kernel merges back-to-back small writes (TCP autocorking),
and 100 writes arrived here in 23 to 55 segments, too close to a coalesced count to be
told apart reliably.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from bench.lab.target import RelayProcess
from bench.relay_base import MAX_OUTBOUND_BYTES
from chat_server.transport.frames import frame_header
from tests.support import running_relay

#: (transport, mode) of every relay; the floor relays first
RELAYS = [
    ("websockets", "coalesced"),
    ("picows", "coalesced"),
    ("websockets", "recv-broadcast"),
    ("picows", "per-frame-send"),
]
COALESCED = [relay for relay in RELAYS if relay[1] == "coalesced"]
#: relays that close a member too far behind with 1013 (recv-broadcast has no bound)
BOUNDED = [relay for relay in RELAYS if relay[1] != "recv-broadcast"]
#: messages sent in one TCP write by the burst test
BURST = 100


@pytest.fixture(scope="module", params=RELAYS, ids="-".join)
def relay(request: pytest.FixtureRequest) -> Iterator[str]:
    """One relay per (transport, mode), shared by this module's tests; its websocket URL."""
    transport, mode = request.param
    with running_relay(transport, mode=mode) as url:
        yield url


async def member(url: str, room: str, **options: object) -> ClientConnection:
    """A client in ``room``, with no keepalive pings (nothing but relayed frames arrives)."""
    return await connect(f"{url}?room={room}", ping_interval=None, **options)  # type: ignore[arg-type]


async def receive(client: ClientConnection, count: int) -> list[str | bytes]:
    """The next ``count`` messages (text as str, binary as bytes)."""
    return [await asyncio.wait_for(client.recv(), 10) for _ in range(count)]


def wire(message: str | bytes) -> tuple[str, bytes]:
    """A message's type and bytes (UTF-8 encodes each text one way, so equal bytes for
    equal text): what a byte-identical relay must preserve."""
    if isinstance(message, str):
        return ("text", message.encode())
    return ("binary", message)


def data_segments_in(client: ClientConnection) -> int:
    """Data segments this client's socket has received (``tcpi_data_segs_in``, Linux 4.6+)."""
    sock = client.transport.get_extra_info("socket")
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    (segments,) = struct.unpack_from("I", info, 152)
    return int(segments)


async def test_every_member_gets_every_message_verbatim_with_its_type_the_sender_too(
    relay: str,
) -> None:
    clients = [await member(relay, "verbatim") for _ in range(3)]
    sent = Counter[tuple[str, bytes]]()
    for i, client in enumerate(clients):
        # text as text and binary as binary, every frame-length encoding (7-bit, 16, 64)
        messages: list[tuple[str, bytes]] = [
            ("text", f"héllo ✓ {i}".encode()),
            ("binary", bytes([0, 255, i]) + b"\x80\xfe"),
            ("text", ("ü" * 200).encode()),
            ("binary", bytes(range(256)) * 300),
        ]
        for kind, payload in messages:
            await client.send(payload, text=kind == "text")
        sent.update(messages)
    for client in clients:
        got = await receive(client, sent.total())
        assert Counter(wire(m) for m in got) == sent
    for client in clients:
        await client.close()


async def test_a_fragmented_message_arrives_as_one(relay: str) -> None:
    sender, other = await member(relay, "fragments"), await member(relay, "fragments")
    await sender.send(["hé", "l", "lo ✓"])  # one text message in three frames
    await sender.send([b"\x00frag", b"men", b"ted\xff"])  # one binary message in three
    for client in (sender, other):
        assert await receive(client, 2) == ["hél" + "lo ✓", b"\x00fragmented\xff"]
    await sender.close()
    await other.close()


async def test_a_member_of_another_room_gets_nothing(relay: str) -> None:
    a1, a2 = await member(relay, "room-a"), await member(relay, "room-a")
    b = await member(relay, "room-b")
    await a1.send("for room a only")
    for client in (a1, a2):
        assert await receive(client, 1) == ["for room a only"]
    # what room a got is written; had b been sent it, it would come before b's own
    await b.send(b"b's own")
    assert await receive(b, 1) == [b"b's own"]
    for client in (a1, a2, b):
        await client.close()


def test_healthz_answers_200_and_other_paths_404(relay: str) -> None:
    http = relay.replace("ws://", "http://").removesuffix("/ws")
    with urllib.request.urlopen(f"{http}/healthz", timeout=5) as reply:
        assert reply.status == 200
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{http}/elsewhere", timeout=5)
    assert refused.value.code == 404


async def test_a_connection_without_a_room_is_closed_1008(relay: str) -> None:
    client = await connect(relay, ping_interval=None)
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(client.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_no_extension_is_negotiated(relay: str) -> None:
    # offered permessage-deflate (websockets' client default), the answer has none
    client = await member(relay, "plain")
    assert client.response is not None
    assert "Sec-WebSocket-Extensions" not in client.response.headers
    await client.close()


@pytest.mark.parametrize("relay", COALESCED, ids="-".join, indirect=True)
async def test_a_burst_read_at_once_reaches_a_member_in_one_write(relay: str) -> None:
    sender, reader = await member(relay, "burst"), await member(relay, "burst")
    before = data_segments_in(reader)
    protocol = sender.protocol
    for i in range(BURST):
        protocol.send_text(f"burst {i}".encode())
    sender.transport.write(b"".join(protocol.data_to_send()))  # the whole burst, one write
    burst = [f"burst {i}" for i in range(BURST)]
    assert await receive(reader, BURST) == burst
    segments = data_segments_in(reader) - before
    # the sender gets the burst too; read, so that its close is not held behind it
    assert await receive(sender, BURST) == burst
    # one write per message would be up to BURST segments; one per iteration is one per
    # read of the burst (the relay reads its 1.5 kB in one go; a few reads at most)
    assert 1 <= segments < BURST / 10, segments
    await sender.close()
    await reader.close()


@pytest.mark.parametrize("relay", BOUNDED, ids="-".join, indirect=True)
async def test_a_member_too_far_behind_is_closed_1013(relay: str) -> None:
    # a member that stops reading (its client pauses once one message waits): what the
    # relay holds for it passes MAX_OUTBOUND_BYTES, and it is closed rather than kept
    slow = await member(relay, "slow", max_queue=1, max_size=None)
    sender = await member(relay, "slow", max_size=None)
    payload = bytes(512 * 1024)
    # the bound, plus what the kernel's send and receive buffers hold on loopback
    count = (MAX_OUTBOUND_BYTES + 32 * 2**20) // len(payload)
    for _ in range(count):
        await sender.send(payload)
        assert await sender.recv() == payload  # the sender reads its own: not behind
    received = 0
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            assert await asyncio.wait_for(slow.recv(), 10) == payload
            received += 1
    assert received < count
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013, closed.value
    await sender.close()


def test_a_relay_that_never_starts_fails_the_launch_with_its_own_words() -> None:
    with (
        pytest.raises(RuntimeError, match="the picows relay has no permessage-deflate"),
        running_relay("picows", deflate="on"),
    ):
        pass


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 2**20])
def test_frame_header_is_websockets_framing(size: int) -> None:
    from websockets.frames import Frame, Opcode

    for opcode in (Opcode.TEXT, Opcode.BINARY):
        payload = b"x" * size
        assert frame_header(opcode, size) + payload == Frame(opcode, payload).serialize(mask=False)
        plain, compressed = frame_header(opcode, size), frame_header(opcode, size, compressed=True)
        assert compressed == bytes([plain[0] | 0x40]) + plain[1:]  # RSV1: permessage-deflate


def test_the_lab_starts_a_relay_in_the_mode_its_configuration_names(tmp_path: Path) -> None:
    # a matrix's env = { TRANSPORT = "picows", RELAY_MODE = "coalesced" } reaches --mode
    relay = RelayProcess(tmp_path, [], "picows", mode="coalesced")
    command = relay.command()
    assert command[command.index("--transport") + 1] == "picows"
    assert command[command.index("--mode") + 1] == "coalesced"
    assert "--mode" not in RelayProcess(tmp_path, [], "websockets").command()
    relay.start()
    try:
        assert relay.ready()  # /healthz, as for every mode
    finally:
        assert relay.stop() == 0
