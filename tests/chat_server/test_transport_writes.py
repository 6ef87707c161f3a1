"""One write per connection per loop iteration, on each transport (the coalescer in
``transport/base.py``): a burst the server reads at once reaches each member in one
write, its sender's acks included, instead of one write per frame. The kernel counts
what left: TCP segments sent on this machine (``/proc/net/snmp``, ``OutSegs``: on
loopback a write is a segment; the clients' own acks count too)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chat_server.messages import Ack, Message, Send, Welcome
from tests.support import Client, KeyPair

pytestmark = pytest.mark.transports

MEMBERS = 10
BURST = 100


def _segments_sent() -> int:
    lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()]
    header, values = (line for line in lines if line[0] == "Tcp:")
    return int(values[header.index("OutSegs")])


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
    await asyncio.sleep(0.5)  # the joins' presence frames are written and counted before
    for member in members:
        while True:  # read what is waiting (presence), so the counts below are the burst's
            try:
                await member.recv(timeout_s=0.2)
            except TimeoutError:
                break
    sender = members[0]
    protocol = sender.conn.protocol
    for i in range(BURST):
        protocol.send_text(sender.codec.encode_client(Send(room="burst", body=f"b{i}", ref=str(i))))
    # the whole burst in one TCP write: the server reads it in one go (a few at most)
    before = _segments_sent()
    sender.conn.transport.write(b"".join(protocol.data_to_send()))
    await asyncio.gather(
        *(_count_until(member, Message, BURST) for member in members[1:]),
        _count_until(sender, Ack, BURST),  # the sender's messages come with its acks
    )
    await asyncio.sleep(0.2)
    segments = _segments_sent() - before
    # one write per frame would be BURST x MEMBERS messages plus BURST acks (1,100
    # segments, and the clients' acks of them); one per connection per iteration is
    # MEMBERS per read of the burst (and as many acks)
    assert segments < BURST * MEMBERS / 4, segments
    for member in members:
        await member.close()
