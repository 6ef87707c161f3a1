"""Idempotent sends on a real server: a send repeated with the same ``ref`` and body is
acked with the original ``seq`` and stored and broadcast once, also across a ``kill -9`` or a
SIGTERM of the server with sends in flight (the client retries every send it was not sure of)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
from collections.abc import Callable

import pytest
from websockets.exceptions import ConnectionClosed

from chat_server.messages import Ack, Error, Message, Presence, Send, Welcome
from chat_server.redis_rooms import connect_redis, read_range
from tests.support import (
    NO_LIMITS,
    Client,
    KeyPair,
    ServerProcess,
    note_answer,
    stored_history,
    wait_until,
)

ROOM = "retry"


async def _joined(server: ServerProcess, keys: KeyPair, user: str) -> Client:
    client = await Client.connect(server, keys.mint(user))
    await client.expect(Welcome)
    await client.join(ROOM)
    return client


async def test_a_resent_ref_gets_the_original_ack_and_is_not_stored_again(
    start_server, keys: KeyPair
):
    server = start_server(event_loop="asyncio", **NO_LIMITS)
    alice = await _joined(server, keys, "alice")
    bob = await _joined(server, keys, "bob")
    await alice.say(ROOM, "hello", ref="c-1")
    first = await alice.expect(Ack, skip=(Message, Presence))
    assert (await bob.expect(Message, skip=(Ack,))).seq == first.seq
    # the same ref and body: the original ack, nothing stored or broadcast
    await alice.say(ROOM, "hello", ref="c-1")
    again = await alice.expect(Ack)
    assert (again.seq, again.ref) == (first.seq, "c-1")
    # the same ref with another body is a new message; no ref is never a repeat
    await alice.say(ROOM, "hello again", ref="c-1")
    await alice.say(ROOM, "no ref")
    await alice.say(ROOM, "no ref")
    seqs = [(await alice.expect(Ack, skip=(Message,))).seq for _ in range(3)]
    assert seqs == [first.seq + 1, first.seq + 2, first.seq + 3]
    bodies = [(await bob.expect(Message)).body for _ in range(3)]
    assert bodies == ["hello again", "no ref", "no ref"]
    stored = await stored_history(server, keys.mint("reader"), ROOM)
    assert [m.body for m in stored] == ["hello", "hello again", "no ref", "no ref"]
    assert server.stats()["repeated_sends"] == 1


async def test_a_repeat_while_the_original_is_in_flight_is_not_duplicated(
    start_server, keys: KeyPair
):
    server = start_server(event_loop="asyncio", **NO_LIMITS)
    alice = await _joined(server, keys, "alice")
    # sent back to back: the repeat arrives while the original is being committed
    await alice.say(ROOM, "x", ref="p")
    await alice.say(ROOM, "x", ref="p")
    acks = [await alice.expect(Ack, skip=(Message,)) for _ in range(2)]
    assert acks[0].seq == acks[1].seq == 1
    stored = await stored_history(server, keys.mint("reader"), ROOM)
    assert [m.seq for m in stored] == [1]


@pytest.mark.transports
@pytest.mark.parametrize("store", ["sqlite", "redis"])
async def test_a_ref_reused_with_two_bodies_in_one_write_acks_each_with_its_own_seq(
    start_server, keys: KeyPair, store: str, request: pytest.FixtureRequest
):
    """A hostile (or careless) client reuses one ref for two bodies, in one write: each body
    is stored once and every repeat of either is acked with its own message's seq."""
    extra = {}
    if store == "redis":
        extra = {"broker": "redis", "redis_url": request.getfixturevalue("redis_server").url}
    server = start_server(event_loop="asyncio", **NO_LIMITS, **extra)
    alice = await _joined(server, keys, "alice")
    await _joined(server, keys, "bob")
    await alice.expect(Presence)
    # both frames in one write, so that they land in one read and one commit batch
    protocol = alice.conn.protocol
    for body in ("one", "two"):
        protocol.send_text(alice.codec.encode_client(Send(room=ROOM, body=body, ref="c")))
    alice.conn.transport.writelines(protocol.data_to_send())
    acks = [await alice.expect(Ack, skip=(Message,)) for _ in range(2)]
    assert sorted(ack.seq for ack in acks) == [1, 2]
    seq_of = {m.body: m.seq for m in await stored_history(server, keys.mint("reader"), ROOM)}
    assert sorted(seq_of) == ["one", "two"]
    # repeats of either body, in either order: each its own seq, nothing stored again
    for body in ("two", "one", "two"):
        await alice.say(ROOM, body, ref="c")
        again = await alice.expect(Ack, skip=(Message,))
        assert (again.seq, again.ref) == (seq_of[body], "c")
    stored = await stored_history(server, keys.mint("reader"), ROOM)
    assert [(m.seq, m.body) for m in stored] == [(seq_of["one"], "one"), (seq_of["two"], "two")]
    assert server.stats()["repeated_sends"] == 3


async def _fault_then_retry(
    start_server: Callable[..., ServerProcess],
    keys: KeyPair,
    fault: Callable[[ServerProcess], None],
) -> None:
    """Send 600 messages with refs, hit the server with ``fault`` mid-stream, restart it on
    the same database, resend every ref: each is acked, with its first seq if it had one,
    and the room holds each message exactly once."""
    server = start_server(event_loop="uvloop", drain_grace_s=0.2, **NO_LIMITS)
    alice = await _joined(server, keys, "alice")
    refs = [f"r{i}" for i in range(600)]
    acked: dict[str, int] = {}
    refused: dict[str, str] = {}

    async def collect() -> None:
        try:
            while True:
                note_answer(await alice.recv(timeout_s=30), acked, refused)
        except (ConnectionClosed, TimeoutError):
            return

    async def send_all() -> None:
        with contextlib.suppress(ConnectionClosed):
            for ref in refs:
                await alice.say(ROOM, f"body of {ref}", ref=ref)
                await asyncio.sleep(0.001)  # sends go on across the fault

    collector = asyncio.create_task(collect())
    sending = asyncio.create_task(send_all())
    await wait_until(lambda: len(acked) >= 100, 30, "100 acks before the fault", interval_s=0.002)
    fault(server)
    await sending
    await collector
    server.kill()
    unsure = [ref for ref in refs if ref not in acked]
    assert unsure, "the fault came after every send was acked: nothing was in doubt"

    restarted = start_server(
        workdir=server.workdir, event_loop="uvloop", chat_db=server.env["CHAT_DB"], **NO_LIMITS
    )
    # the README's promise: on a restart with history, too, the first line names the toggles
    first, *rest = restarted.log().splitlines()
    assert "chat_server listening on ws://" in first, restarted.log()
    assert any("remembering" in line and "sends with a ref" in line for line in rest), rest
    again = await _joined(restarted, keys, "alice")
    for ref in refs:  # every send, the acked ones too
        await again.say(ROOM, f"body of {ref}", ref=ref)
    answers: dict[str, int] = {}
    while len(answers) < len(refs):
        frame = await again.recv()
        assert not isinstance(frame, Error), frame
        if isinstance(frame, Ack):
            answers[frame.ref or ""] = frame.seq
    assert {ref: answers[ref] for ref in acked} == acked  # the original acks again
    stored = await stored_history(restarted, keys.mint("reader"), ROOM)
    counts = collections.Counter(m.ref for m in stored)
    assert set(counts) == set(refs)
    assert [ref for ref, n in counts.items() if n > 1] == []
    assert [m.seq for m in stored] == list(range(1, len(refs) + 1))
    assert {m.ref: m.seq for m in stored} == answers


async def test_retries_after_sigkill_store_each_message_exactly_once(start_server, keys: KeyPair):
    await _fault_then_retry(start_server, keys, lambda server: server.kill())


async def test_retries_after_sigterm_store_each_message_exactly_once(start_server, keys: KeyPair):
    await _fault_then_retry(start_server, keys, lambda server: server.signal(signal.SIGTERM))


class ReplyBlackhole:
    """A TCP proxy to Redis that can drop Redis' replies while passing every request on:
    what a connection lost after Redis ran a command looks like to the server."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.dropping = False
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(
            self._pipe(reader, up_writer, drop=False),
            self._pipe(up_reader, writer, drop=True),
            return_exceptions=True,
        )

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, drop: bool
    ) -> None:
        try:
            while data := await source.read(65536):
                if not (drop and self.dropping):
                    sink.write(data)
                    await sink.drain()
        finally:
            sink.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


async def test_retries_after_a_redis_outage_over_10s_store_each_message_once(
    start_server, redis_server, keys: KeyPair
):
    """Redis' replies lost past the store's 10 s in-doubt wait: the batch Redis ran
    meanwhile is answered ``unavailable`` and yet stored (the sends behind it are answered
    ``unavailable`` once Redis is known unreachable, unwritten); retried with the same
    refs, every send is acked once, with the stored seq, and stored once."""
    proxy = ReplyBlackhole(redis_server.port)
    await proxy.start()
    server = await asyncio.to_thread(  # the proxy serves on this loop meanwhile
        start_server,
        broker="redis",
        redis_url=f"redis://127.0.0.1:{proxy.port}/0",
        event_loop="uvloop",
        **NO_LIMITS,
    )
    alice = await _joined(server, keys, "alice")
    answers: dict[str, Ack | Error] = {}

    async def collect() -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                frame = await alice.recv(timeout_s=3600)
                if isinstance(frame, (Ack, Error)) and frame.ref:
                    answers[frame.ref] = frame

    collector = asyncio.create_task(collect())
    await alice.say(ROOM, "warm-up", ref="warm-up")  # the store's connection is open and idle
    await wait_until(lambda: "warm-up" in answers, 10, "the warm-up's ack")
    await asyncio.sleep(1)  # idle: what the ack set going on Redis is done (no client sees it)
    refs = [f"r{i}" for i in range(20)]
    proxy.dropping = True
    try:
        for ref in refs:
            await alice.say(ROOM, f"body of {ref}", ref=ref)
            await asyncio.sleep(0.01)  # sends spread over the store's batches
        # the in-doubt wait runs out
        await wait_until(lambda: all(ref in answers for ref in refs), 40, lambda: answers)
        assert {a.code for a in answers.values() if isinstance(a, Error)} == {"unavailable"}
    finally:
        proxy.dropping = False
    refused = {ref for ref, a in answers.items() if isinstance(a, Error)}
    reader = connect_redis(redis_server.url)
    stored_meanwhile = await read_range(reader, ROOM, 0, 2**62, 100)
    await reader.aclose()
    assert {m.ref for m in stored_meanwhile} & refused, "no refused send was stored"

    # the client retries every send not acked with its ref until it is acked
    async def all_acked() -> bool:
        unacked = [ref for ref in refs if not isinstance(answers.get(ref), Ack)]
        for ref in unacked:
            await alice.say(ROOM, f"body of {ref}", ref=ref)
        return not unacked

    await wait_until(all_acked, 30, lambda: answers, interval_s=0.5)
    collector.cancel()
    stored = await stored_history(server, keys.mint("reader"), ROOM)
    counts = collections.Counter(m.ref for m in stored)
    assert sorted(counts) == sorted([*refs, "warm-up"]) and max(counts.values()) == 1
    seqs = {ref: answers[ref].seq for ref in [*refs, "warm-up"]}  # type: ignore[union-attr]
    assert {m.ref: m.seq for m in stored} == seqs
    proxy.close()
