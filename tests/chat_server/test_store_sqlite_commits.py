"""LoopCommits, ThreadCommits and the CommitHold, around a transaction that writes nothing."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from chat_server.errors import StoreError
from chat_server.messages import Message
from chat_server.store.sqlite_commits import CommitHold, Item, LoopCommits, Outcome, ThreadCommits


def items(count: int) -> list[Item]:
    return [
        (Message(room="lobby", seq=0, user="alice", body=f"m{i}", ts=0), i) for i in range(count)
    ]


class FakeStore:
    """What a commit place calls: opens an in-memory connection, numbers each batch from 1
    on, and records the batches it ran and the reports it got (with their threads)."""

    def __init__(self) -> None:
        self.busy_timeouts: list[float | None] = []
        self.transactions: list[list[Item]] = []
        self.reports: list[tuple[list[Item], list[int], StoreError | None]] = []
        self.report_threads: set[int] = set()
        self._seq = 0

    def open_connection(self, busy_timeout_s: float | None) -> sqlite3.Connection:
        self.busy_timeouts.append(busy_timeout_s)
        return sqlite3.connect(":memory:", check_same_thread=False)

    def transaction(self, conn: sqlite3.Connection, batch: list[Item]) -> Outcome:
        self.transactions.append(batch)
        seqs = list(range(self._seq + 1, self._seq + 1 + len(batch)))
        self._seq += len(batch)
        return seqs, {"lobby": self._seq}, None

    def report(
        self,
        batch: list[Item],
        seqs: list[int],
        room_seqs: dict[str, int],
        error: StoreError | None,
    ) -> None:
        self.reports.append((batch, seqs, error))
        self.report_threads.add(threading.get_ident())

    def reported_seqs(self) -> list[int]:
        return [seq for _, seqs, _ in self.reports for seq in seqs]


@contextmanager
def checkpointer_holding(hold: CommitHold) -> Iterator[None]:
    """A checkpointer thread that holds the commits for the block, as a WAL restart does."""
    taken, let_go = threading.Event(), threading.Event()

    def restart() -> None:
        with hold.held_by_checkpointer():
            taken.set()
            let_go.wait(30)

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        assert taken.wait(30)
        yield
    finally:
        let_go.set()
        thread.join()


async def wait_until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition`` holds (a guard, not a timing assertion)."""
    async with asyncio.timeout(30):
        while not condition():
            await asyncio.sleep(0.005)


async def test_loop_commits_commit_each_hand_over_at_once_in_batch_max_slices() -> None:
    store = FakeStore()
    commits = LoopCommits(
        open_connection=store.open_connection,
        transaction=store.transaction,
        report=store.report,
        hold=CommitHold(),
        resume=lambda: None,
        batch_max=2,
    )
    await commits.start(asyncio.get_running_loop())
    assert store.busy_timeouts == [0.0]  # the loop never waits on another writer's lock

    handed = items(5)
    assert commits.hand_over(handed)
    # committed and reported before hand_over returned, two at most a transaction
    assert [len(batch) for batch in store.transactions] == [2, 2, 1]
    assert [item for batch, _, _ in store.reports for item in batch] == handed
    assert store.reported_seqs() == [1, 2, 3, 4, 5]
    assert not commits.queue
    await commits.stop()


async def test_held_loop_commits_resume_when_the_checkpointer_lets_go() -> None:
    store = FakeStore()
    hold = CommitHold()
    resumed: list[int] = []
    commits = LoopCommits(
        open_connection=store.open_connection,
        transaction=store.transaction,
        report=store.report,
        hold=hold,
        resume=lambda: resumed.append(threading.get_ident()),
        batch_max=100,
    )
    await commits.start(asyncio.get_running_loop())

    with checkpointer_holding(hold):
        # refused, not waited for: nothing ran, and the caller keeps the sends
        assert not commits.hand_over(items(3))
        assert store.transactions == []
    await wait_until(lambda: bool(resumed))
    assert resumed == [threading.get_ident()]  # on the loop, once

    assert commits.hand_over(items(3))
    assert store.reported_seqs() == [1, 2, 3]
    await commits.stop()


async def test_loop_commits_after_stop_fail_as_unavailable() -> None:
    store = FakeStore()
    commits = LoopCommits(
        open_connection=store.open_connection,
        transaction=store.transaction,
        report=store.report,
        hold=CommitHold(),
        resume=lambda: None,
        batch_max=100,
    )
    await commits.start(asyncio.get_running_loop())
    await commits.stop()
    assert commits.hand_over(items(2))
    assert store.transactions == []
    [(_, seqs, error)] = store.reports
    assert seqs == []
    assert error is not None
    assert "closed" in str(error)


async def test_thread_commits_wait_out_the_checkpointers_hold_and_report_on_the_loop() -> None:
    store = FakeStore()
    hold = CommitHold()
    commits = ThreadCommits(
        open_connection=store.open_connection,
        transaction=store.transaction,
        report=store.report,
        hold=hold,
        batch_max=1000,
    )
    await commits.start(asyncio.get_running_loop())
    assert store.busy_timeouts == [None]  # the configured busy timeout: the writer may wait

    with checkpointer_holding(hold):
        assert commits.hand_over(items(3))  # always taken: the writer waits its turn
        await asyncio.sleep(0.05)
        assert store.reports == []
    await wait_until(lambda: bool(store.reports))
    assert store.reported_seqs() == [1, 2, 3]
    assert store.report_threads == {threading.get_ident()}

    await commits.stop()
    assert not [t for t in threading.enumerate() if t.name == "chat-history-writer"]


async def test_thread_commits_stop_after_committing_what_was_queued() -> None:
    store = FakeStore()
    commits = ThreadCommits(
        open_connection=store.open_connection,
        transaction=store.transaction,
        report=store.report,
        hold=CommitHold(),
        batch_max=4,
    )
    await commits.start(asyncio.get_running_loop())
    for _ in range(5):
        commits.hand_over(items(3))
    await commits.stop()
    await asyncio.sleep(0)  # the last reports were scheduled on the loop
    assert store.reported_seqs() == list(range(1, 16))
    assert all(len(batch) <= 4 for batch in store.transactions)
    await commits.stop()  # idempotent
