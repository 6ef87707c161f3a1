"""Overload that degrades: past what the loop can handle, new sends are refused with
``unavailable`` (not stored) while the loop is behind, and the rest are served.

The load shedder's control law is pure (:class:`LoadShedder`: examples and a model
check; ``cpu`` is the loop thread's demand clock, here equal to the wall clock for a loop
working flat out); a real server is pushed past its capacity by clients that send faster
than ``REGRESSION=cpu_per_send`` (each send burns 1 ms of CPU on the loop: at most ~1,000
sends/s) lets it handle, on each transport.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chat_server.messages import Ack, Error, Send, Welcome
from chat_server.overload import REFUSAL, LoadShedder
from tests.support import Client, KeyPair, ServerProcess, stored_history, wait_until

TARGET_S = 0.05
INTERVAL_S = 0.1


def test_one_long_pause_never_sheds():
    shedder = LoadShedder(TARGET_S, INTERVAL_S)
    shedder.observe(0.5, now=10.0, cpu=10.0)  # a 500-ms collection: one tick, very late
    assert not shedder.shedding
    shedder.observe(0.0, now=10.51, cpu=10.51)
    assert not shedder.shedding
    assert shedder.episodes == 0


def test_a_standing_lag_sheds_after_the_interval_until_a_tick_is_on_time():
    shedder = LoadShedder(TARGET_S, INTERVAL_S)
    shedder.observe(0.06, now=0.0, cpu=0.0)
    shedder.observe(0.06, now=0.06, cpu=0.06)
    assert not shedder.shedding  # late for 60 ms only
    shedder.observe(0.06, now=0.12, cpu=0.12)
    assert shedder.shedding
    assert shedder.episodes == 1
    shedder.observe(0.4, now=0.5, cpu=0.5)
    assert shedder.shedding
    assert shedder.episodes == 1
    shedder.observe(TARGET_S - 0.001, now=0.55, cpu=0.55)
    assert not shedder.shedding
    # the next run of late ticks waits the interval again
    shedder.observe(0.06, now=0.6, cpu=0.6)
    assert not shedder.shedding
    shedder.observe(0.06, now=0.75, cpu=0.75)
    assert shedder.shedding
    assert shedder.episodes == 2


def test_a_send_handled_deep_in_one_long_iteration_is_refused():
    shedder = LoadShedder(TARGET_S, INTERVAL_S)
    assert not shedder.refusing(100.0, cpu=100.0)  # no tick yet: the ticker has not started
    shedder.observe(0.0, now=0.0, cpu=0.0)
    assert not shedder.refusing(0.1, cpu=0.1)  # the loop held 100 ms: under target + interval
    assert shedder.refusing(TARGET_S + INTERVAL_S, cpu=TARGET_S + INTERVAL_S)
    assert shedder.shedding
    assert shedder.episodes == 1
    shedder.observe(0.3, now=0.31, cpu=0.31)  # the tick after that iteration: late, still shedding
    assert shedder.refusing(0.32, cpu=0.32)
    shedder.observe(0.0, now=0.33, cpu=0.33)  # on time: over
    assert not shedder.refusing(0.34, cpu=0.34)
    assert shedder.episodes == 1


def test_a_loop_behind_but_not_busy_never_sheds_until_its_own_work_holds_it():
    # the host took the vCPU, or a handler slept: late ticks, little demand for a CPU
    shedder = LoadShedder(TARGET_S, INTERVAL_S)
    for k in range(10):
        shedder.observe(0.06, now=k * 0.06, cpu=k * 0.01)
    assert not shedder.shedding
    assert shedder.episodes == 0
    # one iteration held 200 ms, but the thread ran 50 of them: not refused
    shedder.observe(0.0, now=1.0, cpu=1.0)
    assert not shedder.refusing(1.2, cpu=1.05)
    # its own work from here on: the next span that is late and busy sheds
    shedder.observe(0.06, now=1.3, cpu=1.3)
    shedder.observe(0.06, now=1.45, cpu=1.45)
    assert shedder.shedding
    assert shedder.episodes == 1


def test_a_target_of_zero_never_sheds():
    shedder = LoadShedder(0, INTERVAL_S)
    for tick in range(100):
        shedder.observe(5.0, now=tick * 5.0, cpu=tick * 5.0)
    assert not shedder.shedding
    assert not shedder.refusing(10_000.0, cpu=10_000.0)
    assert not shedder.enabled
    with pytest.raises(ValueError):
        LoadShedder(-1, INTERVAL_S)


@given(
    st.lists(
        st.tuples(st.floats(0, 0.3), st.sampled_from([0.0, 0.01, 0.049, 0.05, 0.2, 1.0])),
        max_size=60,
    )
)
def test_it_sheds_exactly_while_a_run_of_late_ticks_spans_the_interval(
    ticks: list[tuple[float, float]],
):
    # the model: shedding at a tick iff it is late and the run of late ticks it ends
    # began at least INTERVAL_S before it; an episode is each run that got that long
    shedder = LoadShedder(TARGET_S, INTERVAL_S)
    now, run_began, episodes, counted = 0.0, None, 0, False
    for gap, lag in ticks:
        now += gap
        shedder.observe(lag, now=now, cpu=now)
        if lag < TARGET_S:
            run_began, counted = None, False
        elif run_began is None:
            run_began = now
        expected = run_began is not None and now - run_began >= INTERVAL_S
        if expected and not counted:
            episodes, counted = episodes + 1, True
        assert shedder.shedding == expected
        assert shedder.episodes == episodes


# ---- a real server past its capacity ---------------------------------------------------

#: clients flooding, each in a room of its own; what each offers (sends/s) and how long
FLOODERS = 4
FLOOD_PER_S = 1000
FLOOD_S = 2.5


@dataclass
class Tally:
    """What one client sent and what the server answered, by ``ref``."""

    sent: list[str] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    details: set[str] = field(default_factory=set)

    def unanswered(self) -> set[str]:
        """The refs neither acked nor refused yet."""
        return set(self.sent) - set(self.acked) - set(self.refused)


async def _read_answers(client: Client, tally: Tally, on_ack: Callable[[str], None]) -> None:
    while True:
        message = await client.recv(timeout_s=120)
        if isinstance(message, Ack) and message.ref is not None:
            tally.acked[message.ref] = message.seq
            on_ack(message.ref)
        elif isinstance(message, Error):
            assert message.code == "unavailable", message
            assert message.ref is not None
            tally.refused.append(message.ref)
            tally.details.add(message.detail)


async def _flood(client: Client, room: str, tally: Tally, stop: asyncio.Event) -> None:
    """FLOOD_PER_S sends a second, ten every 10 ms, until ``stop``."""
    k = 0
    while not stop.is_set():
        for _ in range(10):
            ref = f"{room}-{k}"
            tally.sent.append(ref)
            await client.send(Send(room=room, body=f"m{k}", ref=ref))
            k += 1
        await asyncio.sleep(0.01)


async def _joined(server: ServerProcess, keys: KeyPair, user: str, room: str) -> Client:
    client = await Client.connect(server, keys.mint(user))
    await client.expect(Welcome)
    await client.join(room)
    return client


@pytest.mark.transports
async def test_past_its_capacity_the_server_refuses_sends_while_behind_and_serves_the_rest(
    start_server: Callable[..., ServerProcess], keys: KeyPair
):
    server = start_server(
        event_loop="asyncio",
        regression="cpu_per_send",
        rate_limit_per_s=100_000,
        rate_limit_burst=100_000,
        overload_lag_ms=round(TARGET_S * 1000),
        overload_interval_ms=round(INTERVAL_S * 1000),
    )
    flooders = [await _joined(server, keys, f"flooder{i}", f"flood{i}") for i in range(FLOODERS)]
    honest = await _joined(server, keys, "honest", "calm")
    tallies = [Tally() for _ in flooders]
    honest_tally = Tally()
    stop = asyncio.Event()
    acked_during_flood: list[str] = []

    def honest_acked(ref: str) -> None:
        if not stop.is_set():
            acked_during_flood.append(ref)

    readers = [
        asyncio.create_task(_read_answers(c, t, lambda ref: None))
        for c, t in zip(flooders, tallies, strict=True)
    ]
    readers.append(asyncio.create_task(_read_answers(honest, honest_tally, honest_acked)))
    floods = [
        asyncio.create_task(_flood(c, f"flood{i}", t, stop))
        for i, (c, t) in enumerate(zip(flooders, tallies, strict=True))
    ]
    # the honest client sends one message every 50 ms and retries a refused one (same ref)
    deadline = time.monotonic() + FLOOD_S
    k = 0
    while time.monotonic() < deadline:
        ref = f"calm-{k}"
        if ref not in honest_tally.sent:
            honest_tally.sent.append(ref)
        await honest.send(Send(room="calm", body=f"h{k}", ref=ref))
        await asyncio.sleep(0.05)
        if ref in honest_tally.acked:
            k += 1
    stop.set()
    await asyncio.gather(*floods)

    # every send is answered, the refused ones at once: nothing waits without end
    for tally in [*tallies, honest_tally]:
        await wait_until(
            lambda tally=tally: not tally.unanswered(),
            timeout_s=90,
            what=lambda tally=tally: f"{len(tally.unanswered())} of {len(tally.sent)} unanswered",
        )
    refused = sum(len(t.refused) for t in tallies) + len(honest_tally.refused)
    assert refused > 0, "the flood was never refused: nothing bounded the loop's lag"
    assert {REFUSAL} >= set().union(*(t.details for t in [*tallies, honest_tally]))
    # the honest client was served meanwhile: acked while the flood lasted
    assert acked_during_flood, "no send of the honest client was acked during the flood"
    # and so were the flooders, in part: shedding is a share, not a shutdown
    assert sum(len(t.acked) for t in tallies) > 0

    # the loop caught up: the shedder stopped, said so, and a send is served again
    overload = await wait_until(
        lambda: (o := server.stats()["tail"]["overload"])["shedding"] is False and o,
        timeout_s=30,
        what="the shedder to stop",
    )
    assert overload["refused"] == refused
    assert overload["episodes"] >= 1
    # the log tells of the overload, not of every episode (several a second)
    await wait_until(lambda: "overload: over after" in server.log(), what="the overload's end")
    starts = server.log().count("overload: the event loop is")
    assert starts == 1 or starts < overload["episodes"], (starts, overload)
    await honest.send(Send(room="calm", body="after", ref="calm-after"))
    await wait_until(lambda: "calm-after" in honest_tally.acked, timeout_s=30, what="an ack")

    for reader in readers:
        reader.cancel()
    for client in [*flooders, honest]:
        await client.close()
    # what was acked is stored once, in order; what was refused is not stored at all
    for i, tally in enumerate(tallies):
        stored = await stored_history(server, keys.mint("reader"), f"flood{i}")
        assert [m.ref for m in stored] == sorted(tally.acked, key=tally.acked.__getitem__)
        assert [m.seq for m in stored] == sorted(tally.acked.values())
        assert not {m.ref for m in stored} & set(tally.refused)
