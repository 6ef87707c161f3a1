"""Durability, graceful stop, slow consumers, keepalive and rate limits, on a real server process
(on each transport)."""

from __future__ import annotations

import asyncio
import signal

import pytest
from websockets.exceptions import ConnectionClosed

from chat_server.messages import Ack, Error, Join, Joined, Message, Send, Welcome
from tests.support import Client, KeyPair, ServerProcess, note_answer, stored_history, wait_until

pytestmark = pytest.mark.transports


async def _history_seqs(server: ServerProcess, keys: KeyPair, room: str) -> list[int]:
    return [m.seq for m in await stored_history(server, keys.mint("reader"), room)]


async def test_acked_messages_survive_sigkill(start_server, keys: KeyPair, tmp_path):
    server = start_server(event_loop="uvloop", rate_limit_per_s=100000, rate_limit_burst=100000)
    senders = [await Client.connect(server, keys.mint(f"user{i}")) for i in range(4)]
    for client in senders:
        await client.expect(Welcome)
        await client.join("durable")
    acked: set[int] = set()

    async def send_and_collect(client: Client, n: int) -> None:
        for i in range(n):
            await client.say("durable", f"{id(client)}-{i}")

    async def collect(client: Client) -> None:
        try:
            while True:
                message = await client.recv(timeout_s=30)
                if isinstance(message, Ack):
                    acked.add(message.seq)
        except (TimeoutError, ConnectionClosed):
            return

    collectors = [asyncio.create_task(collect(c)) for c in senders]
    await asyncio.gather(*(send_and_collect(c, 150) for c in senders))
    # kill mid-stream: some acked, some maybe not yet
    await wait_until(lambda: len(acked) >= 300, 30, "300 acks", interval_s=0.005)
    server.kill()
    await asyncio.gather(*collectors)
    assert len(acked) >= 300

    restarted = start_server(
        workdir=server.workdir, event_loop="uvloop", chat_db=server.env["CHAT_DB"]
    )
    seqs = await _history_seqs(restarted, keys, "durable")
    assert acked <= set(seqs), f"lost acked messages: {sorted(acked - set(seqs))[:10]}"
    assert seqs == list(range(1, len(seqs) + 1))  # in order, no gap
    # seq continues after the restart
    alice = await Client.connect(restarted, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.join("durable")
    await alice.say("durable", "after restart")
    assert (await alice.expect(Ack, skip=(Message,))).seq == len(seqs) + 1


async def test_sigterm_drains_acks_and_closes_1001(start_server, keys: KeyPair):
    # the grace only has to outlast the send made once the drain began, with room to spare
    server = start_server(
        event_loop="asyncio", rate_limit_per_s=100000, rate_limit_burst=100000, drain_grace_s=1.5
    )
    alice = await Client.connect(server, keys.mint("alice"))
    bob = await Client.connect(server, keys.mint("bob"))
    for client in (alice, bob):
        await client.expect(Welcome)
        await client.join("drain")
    for i in range(200):
        await alice.say("drain", f"burst {i}", ref=f"r{i}")
    server.signal(signal.SIGTERM)
    # a send once the drain began gets unavailable
    await wait_until(lambda: "stop signal: refusing sends" in server.log(), 10, server.log)
    await alice.say("drain", "too late", ref="late")

    acked: dict[str, int] = {}
    refused: dict[str, str] = {}
    close_codes = []
    for client in (alice, bob):
        try:
            while True:
                note_answer(await client.recv(timeout_s=20), acked, refused)
        except ConnectionClosed as closed:
            close_codes.append(closed.rcvd.code if closed.rcvd else None)
    assert close_codes == [1001, 1001]
    assert server.wait() == 0
    assert refused.get("late") == "unavailable"  # sent once the drain began
    # every send got exactly one answer: acked if it arrived before the signal, else refused
    for ref in [f"r{i}" for i in range(200)]:
        assert (ref in acked) != (ref in refused), ref
    assert set(refused.values()) == {"unavailable"}
    assert acked, "the sends that arrived before the signal were acked"

    restarted = start_server(workdir=server.workdir, event_loop="asyncio")
    seqs = await _history_seqs(restarted, keys, "drain")
    assert set(acked.values()) <= set(seqs)
    assert seqs == list(range(1, len(seqs) + 1))


async def test_slow_consumer_is_closed_1013_and_others_keep_receiving(start_server, keys: KeyPair):
    max_outbound = 64 * 1024
    server = start_server(
        event_loop="asyncio",
        max_outbound_bytes=max_outbound,
        rate_limit_per_s=100000,
        rate_limit_burst=100000,
        close_timeout_s=1,
    )
    # the stuck client: tiny receive buffer, never reads
    stuck = await Client.connect(server, keys.mint("stuck"), max_queue=1)
    stuck.conn.transport.set_write_buffer_limits(0)  # type: ignore[union-attr]
    stuck.conn.transport.pause_reading()  # type: ignore[union-attr]
    talker = await Client.connect(server, keys.mint("talker"))
    listener = await Client.connect(server, keys.mint("listener"))
    for client in (talker, listener):
        await client.expect(Welcome)
    stuck.conn.transport.resume_reading()  # type: ignore[union-attr]
    await stuck.expect(Welcome)
    await stuck.join("slow")
    stuck.conn.transport.pause_reading()  # type: ignore[union-attr]
    await talker.join("slow")
    await listener.join("slow")

    body = "x" * 3000
    received = 0
    # ~1.5 MB per member: past the kernel buffers SOCKET_SEND_BUFFER_BYTES bounds (64 KiB
    # by default, plus the client's receive buffer) and the server's own bound
    total = 500

    acks = 0
    for i in range(total):
        await talker.send(Send(room="slow", body=body))
        if i % 10 == 9:
            # the listener and the talker keep up, never more than a few frames behind, far
            # below the bound (SOCKET_SEND_BUFFER_BYTES keeps kernel buffers small, so a
            # talker that never read its own acks and messages would be a slow consumer too)
            while received < i - 3:
                if isinstance(await listener.recv(), Message):
                    received += 1
            while acks < i - 3:
                if isinstance(await talker.recv(), Ack):
                    acks += 1
    while received < total:
        if isinstance(await listener.recv(), Message):
            received += 1
    assert received == total

    stats = server.stats()
    assert stats["slow_consumer_closes"] >= 1
    # the server's own buffer for the stuck client stayed bounded: at most the bound plus
    # the one frame that crossed it
    assert stats["peak_outbound_bytes"] <= max_outbound + 2 * len(body) + 1024

    # the stuck client, reading again, sees 1013 after what was buffered (or was dropped)
    stuck.conn.transport.resume_reading()  # type: ignore[union-attr]
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await stuck.recv(timeout_s=20)
    assert closed.value.rcvd is None or closed.value.rcvd.code == 1013
    if closed.value.rcvd is not None:
        assert closed.value.rcvd.reason == "slow consumer"


async def test_rate_limit_answers_then_closes_a_flood(start_server, keys: KeyPair):
    server = start_server(event_loop="asyncio", rate_limit_per_s=1, rate_limit_burst=5)
    alice = await Client.connect(server, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.join("rl")  # one token
    for i in range(4):
        await alice.say("rl", f"ok {i}")
    codes = []
    for _ in range(4):
        message = await alice.recv()
        while isinstance(message, Message):
            message = await alice.recv()
        codes.append(type(message).__name__)
    assert codes == ["Ack"] * 4
    await alice.say("rl", "one too many", ref="x")
    error = await alice.expect(Error, skip=(Message, Ack))
    assert error.code == "rate_limited"
    # keep flooding: BURST rate_limited replies within BURST/RATE seconds close with 1008
    for _ in range(10):
        try:
            await alice.say("rl", "flood")
        except ConnectionClosed:
            break
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await alice.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert "rate_limited" in closed.value.rcvd.reason


async def test_history_page_is_cut_to_max_history_bytes(start_server, keys: KeyPair):
    server = start_server(
        event_loop="asyncio",
        max_history_bytes=2048,
        rate_limit_per_s=100000,
        rate_limit_burst=100000,
    )
    alice = await Client.connect(server, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.join("big")
    for i in range(1, 41):
        await alice.say("big", f"{i:03d}" + "x" * 200)
    for _ in range(40):
        await alice.expect(Ack, skip=(Message,))
    page = await alice.history("big", limit=50)
    seqs = [m.seq for m in page.messages]
    assert 0 < len(seqs) < 40  # cut by size, not by limit
    assert seqs == list(range(41 - len(seqs), 41))  # the newest, ascending
    assert len(alice.codec.encode_server(page)) <= 2048
    collected = seqs
    while collected[0] > 1:  # page on with before = the first seq returned
        page = await alice.history("big", before=collected[0], limit=50)
        assert page.messages
        collected = [m.seq for m in page.messages] + collected
    assert collected == list(range(1, 41))


async def test_replay_is_paced_by_the_reader_and_never_trips_1013(start_server, keys: KeyPair):
    server = start_server(
        event_loop="asyncio",
        max_outbound_bytes=8192,
        socket_send_buffer_bytes=0,  # the kernel's own (autotuned) send buffer
        rate_limit_per_s=100000,
        rate_limit_burst=100000,
    )
    writer = await Client.connect(server, keys.mint("writer"))
    await writer.expect(Welcome)
    await writer.join("replay")
    total = 1500
    # the writer reads its echoes and acks as it goes, 10 sends at a time: one that read
    # its 6 MB only after sending relied on the kernel's autotuning to hold them all, as
    # MAX_OUTBOUND_BYTES is tiny here, and was itself closed 1013 in 1 to 6 runs of 12
    for start in range(1, total + 1, 10):
        for i in range(start, start + 10):
            await writer.say("replay", f"{i:05d}" + "r" * 3900)
        for _ in range(10):
            await writer.expect(Ack, skip=(Message,))

    reader = await Client.connect(server, keys.mint("reader"), max_queue=1)
    await reader.expect(Welcome)
    reader.conn.transport.pause_reading()  # type: ignore[union-attr]
    await reader.send(Join(room="replay", since=0))
    await asyncio.sleep(1.5)  # the stall under test: the server's replay waits for us meanwhile
    assert server.stats()["slow_consumer_closes"] == 0
    reader.conn.transport.resume_reading()  # type: ignore[union-attr]
    await reader.expect(Joined)
    seqs = []
    while len(seqs) < total:
        seqs.append((await reader.expect(Message, timeout_s=20)).seq)
    assert seqs == list(range(1, total + 1))
    await writer.say("replay", "live after replay")
    assert (await reader.expect(Message)).seq == total + 1
    assert server.stats()["slow_consumer_closes"] == 0


async def test_a_peer_that_does_not_answer_pings_is_closed_1011(start_server, keys: KeyPair):
    server = start_server(event_loop="asyncio", ping_interval_s=0.3, ping_timeout_s=0.3)
    silent = await Client.connect(server, keys.mint("silent"))
    awake = await Client.connect(server, keys.mint("awake"))
    for client in (silent, awake):
        await client.expect(Welcome)
    silent.conn.transport.pause_reading()  # type: ignore[union-attr]
    await asyncio.sleep(1.5)  # pings go unanswered: past interval and timeout, twice over
    silent.conn.transport.resume_reading()  # type: ignore[union-attr]
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await silent.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
    # a peer that answers is kept
    await awake.join("keepalive")
    assert server.stats()["connections"] == 1
