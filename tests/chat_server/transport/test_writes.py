"""One write per connection per loop iteration, on each transport (the coalescer in
``transport/base.py``): a burst the server reads at once reaches each member in one
write, its sender's acks included, instead of one write per frame. The kernel counts
the server's writes where they arrive: the data segments each of the test's own client
sockets received (``TCP_INFO``'s ``tcpi_data_segs_in``; on loopback, with
``TCP_NODELAY``, one write under the MSS of 64 KiB is one segment). Only these
connections count, whatever else the machine sends."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct

import pytest

from chat_server.codecs import get_codec
from chat_server.messages import Ack, Error, Join, Joined, Message, Presence, Send, Welcome
from tests.support import Client, KeyPair

pytestmark = pytest.mark.transports

MEMBERS = 10
BURST = 100


#: offset of ``tcpi_data_segs_in`` (a u32) in Linux's ``struct tcp_info`` (since 4.6)
_TCPI_DATA_SEGS_IN = 152


def _data_segments_received(clients: list[Client]) -> int:
    """Segments carrying data that these clients' sockets received, summed."""
    total = 0
    for client in clients:
        sock = client.conn.transport.get_extra_info("socket")
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        assert len(info) >= _TCPI_DATA_SEGS_IN + 4, "this kernel's tcp_info has no data_segs_in"
        total += struct.unpack_from("I", info, _TCPI_DATA_SEGS_IN)[0]
    return total


async def _count_until(client: Client, kind: type, count: int) -> None:
    seen = 0
    while seen < count:
        seen += isinstance(await client.recv(), kind)


async def test_a_burst_read_at_once_reaches_each_member_in_one_write(
    start_server, keys: KeyPair
) -> None:
    server = start_server(event_loop="uvloop", rate_limit_per_s=100000, rate_limit_burst=100000)
    members = [await Client.connect(server, keys.mint(f"member{i}")) for i in range(MEMBERS)]
    for member in members:
        await member.expect(Welcome)
        await member.join("burst")
    last = f"member{MEMBERS - 1}"

    async def read_the_joins_presence(member: Client) -> None:
        # presence goes to the other members in join order: the last join's is the last frame
        while not (isinstance(frame := await member.recv(), Presence) and frame.user == last):
            pass

    # every frame before the burst received, so the counts below are the burst's
    await asyncio.gather(*(read_the_joins_presence(member) for member in members[:-1]))
    sender = members[0]
    protocol = sender.conn.protocol
    for i in range(BURST):
        protocol.send_text(sender.codec.encode_client(Send(room="burst", body=f"b{i}", ref=str(i))))
    # the whole burst in one TCP write: the server reads it in one go (a few at most)
    before = _data_segments_received(members)
    sender.conn.transport.write(b"".join(protocol.data_to_send()))
    await asyncio.gather(
        *(_count_until(member, Message, BURST) for member in members[1:]),
        _count_until(sender, Ack, BURST),  # the sender's messages come with its acks
    )
    segments = _data_segments_received(members) - before
    # one write per frame would be BURST x MEMBERS messages plus BURST acks (1,100
    # segments); one per connection per iteration is MEMBERS per read of the burst
    assert segments < BURST * MEMBERS / 4, segments
    for member in members:
        await member.close()


def _masked_frame(payload: bytes, opcode: int) -> bytes:
    """One final client frame (masked, as a client must), of up to 65,535 bytes."""
    mask = os.urandom(4)
    size = len(payload)
    length = bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + struct.pack("!H", size)
    return (
        bytes([0x80 | opcode])
        + length
        + mask
        + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    )


async def test_frames_sent_right_behind_the_upgrade_request_are_handled_in_order(
    start_server, keys: KeyPair
):
    """A client that writes its first frames in the same segment as its handshake: the
    server reads them before its connection handler runs, and answers them in order once
    it does (none is lost waiting for the handler)."""
    server = start_server()
    codec = get_codec(server.serializer)
    opcode = 2 if codec.binary else 1
    frames = b"".join(
        _masked_frame(codec.encode_client(message), opcode)
        for message in (Join(room="early"), Send(room="early", body="pipelined", ref="p1"))
    )
    request = (
        "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
        f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {codec.subprotocol}\r\n"
        f"Authorization: Bearer {keys.mint('early')}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(request + frames)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101"), head
    answers = []
    while len(answers) < 4:  # welcome, joined, the message, its ack
        _, second = await asyncio.wait_for(reader.readexactly(2), 10)
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", await reader.readexactly(2))
        payload = await reader.readexactly(size)
        answers.append(codec.decode_server(payload if codec.binary else payload.decode()))
    assert [type(a) for a in answers] == [Welcome, Joined, Message, Ack], answers
    assert answers[1].room == "early"
    assert (answers[2].body, answers[2].ref) == ("pipelined", "p1")
    assert (answers[3].seq, answers[3].ref) == (answers[2].seq, "p1")
    writer.close()


async def test_what_outgrows_the_first_read_buffer_is_read_whole(start_server, keys: KeyPair):
    """picows starts each connection's read buffer at 4 KiB (``READ_BUFFER_INIT_BYTES``)
    and doubles it as data needs: a 6 KB handshake, the longest body allowed and a frame
    of 60 KB (refused as ``too_large``, not cut or closed) are each read whole, and the
    connection serves on."""
    server = start_server()
    client = await Client.connect(server, keys.mint("big"), user_agent_header="u" * 6000)
    await client.expect(Welcome)
    await client.join("big")
    body = "b" * 4000  # MAX_BODY_CHARS
    await client.say("big", body, ref="long")
    assert (await client.expect(Message)).body == body
    assert (await client.expect(Ack)).ref == "long"
    await client.say("big", "c" * 60_000, ref="too long")
    error = await client.expect(Error, skip=(Presence,))
    assert (error.code, error.ref) == ("too_large", "too long")
    await client.say("big", "small", ref="after")
    assert (await client.expect(Message)).body == "small"
    await client.close()
