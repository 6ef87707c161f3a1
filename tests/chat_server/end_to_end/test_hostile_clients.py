"""Clients that misbehave on purpose, on raw sockets, each against a bound, on each
transport; an honest client on the same server is served meanwhile (it joins, sends, and
gets its message and its ack).

- A client that pings and never reads: its pongs count toward ``MAX_OUTBOUND_BYTES``
  (1013, then dropped), instead of growing the server by every pong it cannot read.
- A client that sends the first frame of a message and stalls: closed 1008 after
  ``PARTIAL_MESSAGE_TIMEOUT_S``.
- Many such clients: what their partial messages hold in the process, inflaters of
  compressed ones included, stays within ``MAX_PARTIAL_BYTES``; the frame that would
  pass it closes its connection with 1013.
- A stranger reading what the port tells: with ``EXPOSE_INTERNALS`` off (the default)
  no counters, host name or pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator

import pytest

from chat_server.messages import Welcome
from chat_server.settings import TRANSPORTS
from chat_server.transport.base import WORKER_HEADER
from chat_server.transport.peer import INFLATER_BYTES
from tests.support import (
    Client,
    KeyPair,
    ServerProcess,
    masked_frame,
    raw_close_code,
    raw_frame,
    raw_upgrade,
    served,
    wait_until,
)

pytestmark = pytest.mark.transports

CONT, TEXT, CLOSE, PING, PONG = 0x0, 0x1, 0x8, 0x9, 0xA
MAX_OUTBOUND_BYTES = 64 * 1024
#: the most the server reads at once (asyncio's selector transports: 256 KiB; picows reads
#: into its own smaller buffer): the pongs of one read are written before they are counted
ONE_READ_BYTES = 256 * 1024
PARTIAL_MESSAGE_TIMEOUT_S = 3
MAX_PARTIAL_BYTES = 256 * 1024
#: pings a flooder sends at most before the test calls the server unbounded (its pongs
#: would be 250 times MAX_OUTBOUND_BYTES)
FLOOD_CAP_BYTES = 16 * 1024 * 1024
#: the first fragment each hoarder leaves open: four fit in MAX_PARTIAL_BYTES, five do not
HOARD_BYTES = 60_000


@pytest.fixture(scope="module", params=TRANSPORTS)
def hostile_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, keys: KeyPair
) -> Iterator[ServerProcess]:
    """One server per transport with small bounds, shared by the hostile clients' tests
    (each leaves nothing held behind: its clients are closed or dropped)."""
    server = ServerProcess(
        tmp_path_factory.mktemp("hostile"),
        keys,
        transport=request.param,
        event_loop="asyncio",
        ws_deflate="shared",
        max_outbound_bytes=MAX_OUTBOUND_BYTES,
        socket_send_buffer_bytes=16 * 1024,
        partial_message_timeout_s=PARTIAL_MESSAGE_TIMEOUT_S,
        max_partial_bytes=MAX_PARTIAL_BYTES,
        # the pongs' bound, not the rate limit's, is what the ping flood meets here
        rate_limit_per_s=1_000_000,
        rate_limit_burst=1_000_000,
    )
    try:
        yield server.start()
    finally:
        server.kill()


@pytest.fixture(scope="module", params=TRANSPORTS)
def plain_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, keys: KeyPair
) -> Iterator[ServerProcess]:
    """One server per transport with the default bounds (``EXPOSE_INTERNALS`` off, the
    default rate limit), shared by the tests of what a stranger meets with them."""
    server = ServerProcess(
        tmp_path_factory.mktemp("plain"),
        keys,
        transport=request.param,
        event_loop="asyncio",
        expose_internals="off",
    )
    try:
        yield server.start()
    finally:
        server.kill()


async def test_a_ping_flood_that_never_reads_meets_max_outbound_bytes(
    hostile_server: ServerProcess, keys: KeyPair
) -> None:
    """Bound: the pongs owed to a client that does not read stay within
    ``MAX_OUTBOUND_BYTES`` (64 KiB) plus one read's pongs; past it 1013, and the client,
    still pinging, is dropped long before it sent 16 MiB of pings."""
    server = hostile_server
    before = server.stats()
    _, writer = await raw_upgrade(server, keys.mint("pinger"), buffer_bytes=4096)
    writer.transport.pause_reading()  # type: ignore[attr-defined]
    burst = masked_frame(b"p" * 125, PING) * 1000  # 131 KB of pings, 127 KB of pongs owed

    async def flood() -> int:
        sent = 0
        try:
            while sent < FLOOD_CAP_BYTES:
                writer.write(burst)
                await writer.drain()
                sent += len(burst)
        except ConnectionError:
            return sent
        raise AssertionError(f"{sent} bytes of pings taken: the pongs owed have no bound")

    sent, _ = await asyncio.gather(flood(), served(server, keys.mint("bystander")))
    writer.close()
    after = server.stats()
    assert after["slow_consumer_closes"] == before["slow_consumer_closes"] + 1
    assert after["peak_outbound_bytes"] <= MAX_OUTBOUND_BYTES + ONE_READ_BYTES, after
    assert sent < FLOOD_CAP_BYTES


async def test_a_message_left_partial_is_closed_1008_after_its_timeout(
    hostile_server: ServerProcess, keys: KeyPair
) -> None:
    """Bound: a message's first frame, never followed by its last, is held
    ``PARTIAL_MESSAGE_TIMEOUT_S`` (3 s), then its connection is closed with 1008."""
    server = hostile_server
    closes = server.stats()["partial_closes"]
    reader, writer = await raw_upgrade(server, keys.mint("staller"))
    started = time.monotonic()
    writer.write(masked_frame(b"x" * 1000, TEXT, fin=False))
    await served(server, keys.mint("bystander"))
    assert await raw_close_code(reader, PARTIAL_MESSAGE_TIMEOUT_S + 10) == 1008
    assert time.monotonic() - started >= PARTIAL_MESSAGE_TIMEOUT_S
    writer.close()
    stats = server.stats()
    assert stats["partial_closes"] == closes + 1
    await wait_until(lambda: server.stats()["partial_bytes"] == 0)


async def test_partial_messages_past_the_process_bound_close_1013(
    hostile_server: ServerProcess, keys: KeyPair
) -> None:
    """Bound: all connections' partial messages hold at most ``MAX_PARTIAL_BYTES``
    (256 KiB) in the process: four 60,000-byte first fragments fit, the fifth closes its
    connection with 1013 and the four keep theirs."""
    server = hostile_server
    hoarders = [await raw_upgrade(server, keys.mint(f"hoarder{i}")) for i in range(5)]
    for _, writer in hoarders[:4]:
        writer.write(masked_frame(b"x" * HOARD_BYTES, TEXT, fin=False))
    await wait_until(lambda: server.stats()["partial_bytes"] == 4 * HOARD_BYTES)
    last_reader, last_writer = hoarders[4]
    last_writer.write(masked_frame(b"x" * HOARD_BYTES, TEXT, fin=False))
    assert await raw_close_code(last_reader, 10) == 1013
    await served(server, keys.mint("bystander"))
    stats = server.stats()
    assert stats["partial_bytes"] == 4 * HOARD_BYTES  # the four still hold theirs
    assert stats["peak_partial_bytes"] <= MAX_PARTIAL_BYTES
    for _, writer in hoarders:
        writer.close()
    await wait_until(lambda: server.stats()["partial_bytes"] == 0)


async def test_inflaters_of_partial_compressed_messages_count_toward_the_bound(
    hostile_server: ServerProcess, keys: KeyPair
) -> None:
    """Bound: a compressed message left partial keeps an inflater, charged
    ``INFLATER_BYTES`` (40 KiB) with its bytes, so at most ``MAX_PARTIAL_BYTES // 40 KiB``
    (six) exist at once in the process; the seventh closes its connection with 1013."""
    server = hostile_server
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    first = compressor.compress(b"x" * 100) + compressor.flush(zlib.Z_SYNC_FLUSH)
    held = 100 + INFLATER_BYTES
    fit = MAX_PARTIAL_BYTES // held
    assert fit == 6
    inflating = [
        await raw_upgrade(server, keys.mint(f"inflater{i}"), extensions="permessage-deflate")
        for i in range(fit + 1)
    ]
    for _, writer in inflating[:fit]:
        writer.write(masked_frame(first, TEXT, fin=False, rsv1=True))
    await wait_until(lambda: server.stats()["partial_bytes"] == fit * held)
    last_reader, last_writer = inflating[fit]
    last_writer.write(masked_frame(first, TEXT, fin=False, rsv1=True))
    assert await raw_close_code(last_reader, 10) == 1013
    await served(server, keys.mint("bystander"))
    assert server.stats()["partial_bytes"] == fit * held
    for _, writer in inflating:
        writer.close()
    await wait_until(lambda: server.stats()["partial_bytes"] == 0)


async def test_a_compressed_message_in_several_frames_may_start_in_the_read_that_ends_another(
    hostile_server: ServerProcess, keys: KeyPair
) -> None:
    """The honest side of the inflaters' bound: one read holds a compressed message in
    two frames and the first frame of the next; its last frame comes in a later read.
    Each is inflated and answered, and nothing stays held."""
    server = hostile_server
    reader, writer = await raw_upgrade(
        server, keys.mint("fragmenter"), extensions="permessage-deflate"
    )
    frames = []
    for text in ('{"type":"join","room":"frag"}', '{"type":"send","room":"frag","body":"hi"}'):
        compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
        data = (compressor.compress(text.encode()) + compressor.flush(zlib.Z_SYNC_FLUSH))[:-4]
        half = len(data) // 2
        frames += [masked_frame(data[:half], TEXT, fin=False, rsv1=True)]
        frames += [masked_frame(data[half:], CONT)]
    writer.write(b"".join(frames[:3]))
    assert await _kinds(reader, 2) == ["welcome", "joined"]  # the first read was handled
    writer.write(frames[3])
    assert await _kinds(reader, 2) == ["message", "ack"]
    writer.close()
    assert server.stats()["partial_bytes"] == 0


async def _kinds(reader: asyncio.StreamReader, count: int) -> list[str]:
    """The kinds of the next ``count`` server frames of a raw websocket (JSON, inflated when
    compressed)."""
    kinds = []
    for _ in range(count):
        opcode, compressed, payload = await asyncio.wait_for(raw_frame(reader), 10)
        assert opcode == TEXT, (opcode, payload)
        if compressed:
            payload = zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff")
        kinds.append(json.loads(payload)["type"])
    return kinds


async def test_a_frame_left_partial_is_closed_1011_by_the_keepalive(
    start_server, keys: KeyPair
) -> None:
    """Bound: a frame not yet whole is the websocket library's to hold, at most
    ``MAX_FRAME_BYTES``, and for at most ``PING_INTERVAL_S`` + ``PING_TIMEOUT_S`` (0.5 +
    1 s here): a client in the middle of a frame cannot answer the ping, so it is closed
    with 1011. (A bound the keepalive already kept: this test passes on 5e03359 too.)"""
    server = start_server(event_loop="asyncio", ping_interval_s=0.5, ping_timeout_s=1)
    reader, writer = await raw_upgrade(server, keys.mint("halfway"))
    writer.write(masked_frame(b"x" * HOARD_BYTES, TEXT)[: HOARD_BYTES // 2])
    await served(server, keys.mint("bystander"))
    assert await raw_close_code(reader, 10) == 1011
    writer.close()


def _answer(server: ServerProcess, path: str) -> tuple[int, dict[str, str], str]:
    """The status, headers and body ``GET path`` gets on the chat port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read().decode()


async def test_a_stranger_reads_no_counters_host_or_pid_by_default(
    plain_server: ServerProcess, keys: KeyPair
) -> None:
    """Bound: with ``EXPOSE_INTERNALS`` off (the default) ``/stats`` is 404 and no
    response, the 101 included, carries ``X-Chatlab-Worker``; the chat is served."""
    server = plain_server
    assert server.proc is not None
    pid = str(server.proc.pid)
    answers = {path: _answer(server, path) for path in ("/stats", "/healthz", "/ws", "/nope")}
    assert [status for status, _, _ in answers.values()] == [404, 200, 401, 404]
    for status, headers, body in answers.values():
        assert WORKER_HEADER not in headers and pid not in body, (status, headers, body)
    client = await Client.connect(server, keys.mint("stranger"))
    await client.expect(Welcome)
    assert WORKER_HEADER not in client.conn.response.headers
    await client.close()
    await served(server, keys.mint("bystander"))


#: the default RATE_LIMIT_BURST: a flood is closed once this many frames were refused
#: within RATE_LIMIT_BURST / RATE_LIMIT_PER_S seconds
RATE_LIMIT_BURST = 100
#: pings the flooder sends at most (it stops once closed)
PINGS_CAP = 20_000


async def test_a_ping_flood_that_reads_its_pongs_is_closed_by_the_rate_limit(
    plain_server: ServerProcess, keys: KeyPair
) -> None:
    """Bound: pings draw rate-limit tokens like any frame, so a client that pings as fast
    as it can (and reads every pong) is answered within its allowance and closed with
    1008 once ``RATE_LIMIT_BURST`` (100) were refused, not answered without end: at most
    twice the burst plus one read's pings (websockets answers every ping it parsed; picows
    answers none past the allowance) of the 20,000 it sends."""
    server = plain_server
    reader, writer = await raw_upgrade(server, keys.mint("pingpong"))
    ping = masked_frame(b"p" * 125, PING)
    one_read_pings = ONE_READ_BYTES // len(ping)

    async def flood() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(PINGS_CAP // 1000):
                writer.write(ping * 1000)
                await writer.drain()

    async def read_pongs() -> tuple[int, int | None]:
        pongs = 0
        while True:
            try:
                opcode, _, payload = await raw_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return pongs, None
            if opcode == PONG:
                pongs += 1
            elif opcode == CLOSE:
                return pongs, struct.unpack("!H", payload[:2])[0]

    (pongs, code), _, _ = await asyncio.gather(
        asyncio.wait_for(read_pongs(), 30), flood(), served(server, keys.mint("bystander"))
    )
    writer.close()
    assert code == 1008, f"{pongs} pongs, then close {code}"
    assert RATE_LIMIT_BURST <= pongs <= 2 * RATE_LIMIT_BURST + one_read_pings
