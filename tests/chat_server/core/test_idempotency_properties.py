"""Idempotent sends as properties (Hypothesis): any interleaving of sends, repeats, commits
and failures answers every repeat with its own message's ack and stores each (ref, body) at
most once.

Two levels: :class:`RecentSendsMachine` drives the I/O-free core through every interleaving
with batches that commit or fail (the store's contract: a batch is stored in order, or not at
all); :func:`test_real_stores_answer_every_repeat_with_its_own_seq` runs programs of sends
through the real service on a real SQLite file and on a real Redis shared by two services
(two processes' worth of state), reading back what was stored.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from chat_server.codecs import get_codec
from chat_server.core.idempotency import RecentSends
from chat_server.messages import Ack, Error, History, HistoryRequest, Join, Message, Send
from chat_server.settings import Settings
from chat_server.wiring import build_service
from tests.support import InProcessConnection, RedisProcess, settled, wait_until

USERS = st.sampled_from(["alice", "bob"])
#: few refs and bodies, so that reuse and repeats are the common case
REFS = st.sampled_from(["r1", "r2"])
BODIES = st.sampled_from(["x", "y", "z"])

Key = tuple[str, str, str]  # user, ref, body


class RecentSendsMachine(RuleBasedStateMachine):
    """The service's use of :class:`RecentSends` (look up, submit, then committed or failed
    per batch in order), against a store that numbers what it commits."""

    @initialize()
    def start(self) -> None:
        self.recent = RecentSends(window_ms=10**9, max_entries=10**6)
        self.stored: dict[int, Key] = {}  # seq -> what it holds
        self.pending: list[tuple[Message, int]] = []  # submitted, in store order
        self.answers: dict[int, tuple[str, int]] = {}  # send id -> ("ack", seq) / ("error", 0)
        self.keys: dict[int, Key] = {}  # send id -> what it sent
        self.ids = itertools.count()
        self.clock_ms = 1_000

    def _answer(self, send_id: int, answer: tuple[str, int]) -> None:
        assert send_id not in self.answers, "a send answered twice"
        self.answers[send_id] = answer

    @rule(user=USERS, ref=REFS, body=BODIES)
    def send(self, user: str, ref: str, body: str) -> None:
        send_id = next(self.ids)
        self.keys[send_id] = (user, ref, body)
        self.clock_ms += 1
        message = Message(room="r", seq=0, user=user, body=body, ts=self.clock_ms, ref=ref)
        earlier = self.recent.repeat_of(message)
        if earlier is None:
            self.pending.append((message, send_id))
            self.recent.submitted(message)
        elif earlier.seq:
            self._answer(send_id, ("ack", earlier.seq))
        else:
            earlier.wait(send_id)

    @precondition(lambda self: self.pending)
    @rule(size=st.integers(min_value=1, max_value=4))
    def commit(self, size: int) -> None:
        batch, self.pending = self.pending[:size], self.pending[size:]
        for message, send_id in batch:
            message.seq = len(self.stored) + 1
            self.stored[message.seq] = self.keys[send_id]
            self._answer(send_id, ("ack", message.seq))
        for message, _ in batch:  # the service reports a batch after storing all of it
            for waiting in self.recent.committed(message):
                self._answer(waiting, ("ack", message.seq))

    @precondition(lambda self: self.pending)
    @rule(size=st.integers(min_value=1, max_value=4))
    def fail(self, size: int) -> None:
        batch, self.pending = self.pending[:size], self.pending[size:]
        for message, send_id in batch:
            self._answer(send_id, ("error", 0))
            for waiting in self.recent.failed(message):
                self._answer(waiting, ("error", 0))

    @invariant()
    def each_ref_and_body_is_stored_at_most_once(self) -> None:
        assert len(set(self.stored.values())) == len(self.stored)

    @invariant()
    def every_ack_names_its_own_message(self) -> None:
        for send_id, (kind, seq) in self.answers.items():
            if kind == "ack":
                assert self.stored[seq] == self.keys[send_id]

    def teardown(self) -> None:
        if not hasattr(self, "pending"):
            return
        while self.pending:
            self.commit(len(self.pending))
        # nothing waits forever: every send was answered once the store settled
        assert set(self.answers) == set(self.keys)


RecentSendsMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=30, deadline=None
)
test_recent_sends_interleavings = RecentSendsMachine.TestCase


# ---- the real stores --------------------------------------------------------------------

#: a program: steps of sends (connection index, ref, body), a commit point after each step
PROGRAMS = st.lists(
    st.lists(st.tuples(st.integers(0, 2), REFS, BODIES), min_size=1, max_size=6),
    min_size=1,
    max_size=5,
)
ROOMS = (f"p{i}" for i in itertools.count())  # one room per example on the shared Redis
CODEC = get_codec("orjson")


@pytest.fixture(params=["sqlite", "redis"])
def store_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Settings of the service under test: SQLite (one service), or Redis shared by two
    services (a repeat may reach the other one, as it would another process)."""
    redis: RedisProcess | None = None
    if request.param == "redis":
        redis = request.getfixturevalue("redis_server")

    def settings_for(example: int) -> list[Settings]:
        if redis is None:
            path = tmp_path / f"chat-{example}.sqlite3"
            return [Settings.from_mapping({"CHAT_DB": str(path)})]
        shared = {"BROKER": "redis", "REDIS_URL": redis.url}
        return [Settings.from_mapping(shared), Settings.from_mapping(shared)]

    yield settings_for


async def _run_program(program: list[list[tuple[int, str, str]]], services: list[Any]) -> None:
    room = next(ROOMS)
    for service in services:
        await service.start()
    try:
        # connections 0 and 1 are alice's (on the first and, on Redis, the other service),
        # 2 is bob's; each sends what the program says, a commit point after each step
        conns = [
            InProcessConnection(services[0], "alice"),
            InProcessConnection(services[-1], "alice"),
            InProcessConnection(services[-1], "bob"),
        ]
        for conn in conns:
            conn.send(Join(room=room))
        for service in services:
            await settled(service)
        sent: dict[int, list[Key]] = {id(conn): [] for conn in conns}

        async def answered() -> bool:  # every send so far answered
            for service in services:
                await settled(service)
            return all(len(c.of(Ack)) + len(c.of(Error)) == len(sent[id(c)]) for c in conns)

        for step in program:
            for index, ref, body in step:
                conn = conns[index]
                conn.send(Send(room=room, body=body, ref=ref))
                sent[id(conn)].append((conn.session.user, ref, body))
            # a commit point: every send so far answered (on Redis an ack waits for the
            # batch to come back through the broker)
            await wait_until(answered, 10, "every send answered", interval_s=0.01)
        reader = conns[0]
        reader.send(HistoryRequest(room=room, limit=500))

        async def page() -> list[History]:
            await settled(services[0])
            return reader.of(History)

        (history,) = await wait_until(page, 10, "the history page", interval_s=0.01)
        stored = {m.seq: (m.user, m.ref, m.body) for m in history.messages}
        every_key = {key for keys in sent.values() for key in keys}
        # each (user, ref, body) stored once, and nothing stored that was not sent
        assert sorted(stored.values()) == sorted(every_key)
        # every send answered by an ack naming a message with its own user, ref and body
        for conn in conns:
            assert conn.of(Error) == []
            acked = [stored[ack.seq] for ack in conn.of(Ack)]
            assert sorted(acked) == sorted(sent[id(conn)])
            assert all(ack.ref == stored[ack.seq][1] for ack in conn.of(Ack))
    finally:
        for service in services:
            await service.drain()
            await service.close()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=PROGRAMS)
def test_real_stores_answer_every_repeat_with_its_own_seq(
    store_settings: Any, program: list[list[tuple[int, str, str]]]
) -> None:
    example = next(ROOMS)
    services = [build_service(s, CODEC) for s in store_settings(example)]
    asyncio.run(_run_program(program, services))
