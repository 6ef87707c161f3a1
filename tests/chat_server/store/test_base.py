"""The BatchLedger a drain waits on: true whatever order a store's lanes report in.

A Redis store has one writer per node, and each reports its rooms' batches as they
settle: a frozen node's batch may be reported seconds after later submissions to other
nodes. The ledger must still say "everything submitted before this mark is reported"
only when it is, count every batch once and hand each to ``on_batch``. Driven with
plain values (Hypothesis programs of submissions, reports and marks), and once through
``flush`` on an event loop.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chat_server.errors import StoreUnavailable
from chat_server.messages import Message
from chat_server.store.base import BatchLedger, BatchResult

LANES = st.integers(min_value=0, max_value=2)


def message(n: int, lane: int = 0) -> Message:
    return Message(room=f"room-{lane}", seq=0, user="alice", body=f"m{n}", ts=0)


class LanesReportingOutOfOrder(RuleBasedStateMachine):
    """Submissions spread over three lanes; each lane reports any of its unreported items
    in any grouping and order, the lanes interleaved as they come."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[BatchResult] = []
        self.ledger = BatchLedger(self.seen.append)
        #: each lane's unreported (ticket, item), and every reported ticket
        self.lanes: dict[int, list[tuple[int, tuple[Message, int]]]] = {0: [], 1: [], 2: []}
        self.reported: set[int] = set()
        self.submitted = 0
        self.marks: list[int] = []
        self.failed = 0

    @rule(lane=LANES)
    def submit(self, lane: int) -> None:
        ticket = self.ledger.submitted()
        assert ticket == self.submitted  # tickets follow submission order
        self.lanes[lane].append((ticket, (message(ticket, lane), ticket)))
        self.submitted += 1

    @rule()
    def mark(self) -> None:
        self.marks.append(self.ledger.mark())

    @precondition(lambda self: any(self.lanes.values()))
    @rule(data=st.data(), fail=st.booleans())
    def report(self, data: st.DataObject, fail: bool) -> None:
        lane = data.draw(st.sampled_from([n for n, items in self.lanes.items() if items]))
        waiting = self.lanes[lane]
        chosen = data.draw(st.lists(st.sampled_from(range(len(waiting))), min_size=1, unique=True))
        batch = [waiting[i] for i in chosen]
        self.lanes[lane] = [entry for i, entry in enumerate(waiting) if i not in chosen]
        error = StoreUnavailable("node refused") if fail else None
        self.ledger.report([item for _, item in batch], error, [t for t, _ in batch])
        self.reported.update(t for t, _ in batch)
        self.failed += len(batch) if fail else 0

    @invariant()
    def a_mark_is_reached_exactly_when_everything_before_it_is_reported(self) -> None:
        for mark in self.marks:
            expected = all(ticket in self.reported for ticket in range(mark))
            assert self.ledger.reached(mark) == expected

    @invariant()
    def every_item_is_counted_and_handed_on_once(self) -> None:
        assert self.ledger.outstanding == self.submitted - len(self.reported)
        handed = [ctx for result in self.seen for _, ctx in result.items]
        assert sorted(handed) == sorted(self.reported)
        stats = self.ledger.stats(queue_depth=0)
        assert stats.messages_committed + stats.messages_failed == len(self.reported)
        assert stats.messages_failed == self.failed


TestLanesReportingOutOfOrder = LanesReportingOutOfOrder.TestCase
TestLanesReportingOutOfOrder.settings = settings(max_examples=150, stateful_step_count=40)


@given(sizes=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=8))
def test_a_store_reporting_in_submission_order_needs_no_tickets(sizes: list[int]):
    """The SQLite store's way: one writer, reports in submission order, no tickets."""
    ledger = BatchLedger(lambda result: None)
    total = sum(sizes)
    for _ in range(total):
        ledger.submitted()
    mark = ledger.mark()
    done = 0
    for size in sizes:
        assert not ledger.reached(mark)
        ledger.report([(message(i), None) for i in range(size)], None)
        done += size
        assert ledger.outstanding == total - done
    assert ledger.reached(mark)


def test_a_ticket_reported_twice_is_refused():
    ledger = BatchLedger(lambda result: None)
    ticket = ledger.submitted()
    ledger.report([(message(0), None)], None, [ticket])
    with pytest.raises(ValueError, match="reported already"):
        ledger.report([(message(0), None)], None, [ticket])


async def test_flush_waits_for_a_slow_lane_though_later_lanes_reported_first():
    """A drain with one shard frozen: the healthy lanes' later batches are reported, the
    frozen lane's earlier one is not yet; flush returns only once it is."""
    ledger = BatchLedger(lambda result: None)
    slow = ledger.submitted()  # to the frozen node
    fast = [ledger.submitted() for _ in range(5)]  # to healthy nodes, submitted later
    flushing = asyncio.ensure_future(ledger.flush())
    random.shuffle(fast)
    for ticket in fast:
        ledger.report([(message(ticket, 1), None)], None, [ticket])
    await asyncio.sleep(0)
    assert not flushing.done()  # five of six reported: a count would have said "all"
    later = ledger.submitted()  # after the flush began: not waited for
    ledger.report([(message(slow), None)], StoreUnavailable("in doubt too long"), [slow])
    await asyncio.wait_for(flushing, 5)
    assert ledger.outstanding == 1 and not ledger.reached(later + 1)
