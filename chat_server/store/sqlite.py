"""Durable room history in one SQLite file, written by group commit.

:class:`SqliteHistoryStore` keeps every room's messages in a SQLite database in
WAL mode. Messages submitted during one event-loop iteration are handed over
together, once, at the end of it (one callback, not one per message), and
committed as one transaction (group commit). Hand-overs are at least
``commit_interval_ms`` apart (``CHAT_DB_COMMIT_INTERVAL_MS``, 1 ms): one coming
sooner waits on a timer and takes later iterations' messages along, unless it
already holds ``COMMIT_NOW_SIZE`` (the decision is
:func:`~chat_server.store.sqlite_policy.hand_over_wait_s`). Where that transaction
runs is ``commit_on`` (:mod:`chat_server.store.sqlite_commits`): ``loop``, on the
event loop right away (a WAL append without fsync costs less than waking a thread;
the loop never waits on a lock), or ``thread``, on a writer thread that owns the
write connection (required with ``synchronous=full``: an fsync per commit never
runs on the loop).

Each room's ``seq`` is assigned inside the transaction and handed to the messages
only after ``COMMIT`` succeeded, so a failed batch consumes none. Each batch's
outcome is reported on the event loop, in commit order, to the callback given to
:meth:`~chat_server.store.base.HistoryStore.report_to` (the service's ``committed``).

Checkpoints never run inside a commit (``wal_autocheckpoint`` is off): a
checkpointer thread with its own connection checkpoints the WAL and restarts it
(:class:`~chat_server.store.sqlite_wal.Checkpointer`, where the why is; the figures are
in ``docs/decisions/``). To restart it, it holds the commits (the
:class:`~chat_server.store.sqlite_commits.CommitHold`) for a few milliseconds: commits on
the loop wait in the store's list, the loop goes on, and they resume when the
checkpointer lets go. A reader that holds an old
snapshot open can keep checkpoints from catching up; once what is not checkpointed
passes ``wal_max_bytes`` new submissions are refused with ``unavailable``
("checkpoint blocked") until a checkpoint catches up, so what it holds unchecked
stays bounded.

Reads run on a reader thread with a connection of their own
(:mod:`chat_server.store.sqlite_reads`); the file's tables, statements and
pragmas are in :mod:`chat_server.store.sqlite_schema`.

Durability, by ``synchronous`` (SQLite's ``PRAGMA synchronous`` in WAL mode):

``normal``
    A committed batch survives a crash of the process (``kill -9``): the
    commit is in the WAL file in the OS page cache. A power loss or OS crash
    may lose the most recent commits (never corrupt the database); no fsync
    on commit, only at checkpoints and when the WAL restarts (its header).
``full``
    A committed batch also survives a power loss or OS crash, at the cost of
    one fsync of the WAL per group commit (not per message).

Every room's last ``seq`` is two facts, each with one owner, on purpose:

``numbered`` (:class:`~chat_server.store.sqlite_commits.SqliteWriter`'s)
    the last seq *committed*, what the next batch is numbered from: loaded from the file
    when the writer opens, raised by each commit, owned by the thread that commits.
``applied`` (:meth:`SqliteHistoryStore.last_seq`)
    the last seq *reported* (its batch applied on the loop and handed to ``on_batch``):
    what ``joined.last_seq`` and the replay seam read, owned by the loop.

With ``commit_on=loop`` the two are equal between iterations. With ``commit_on=thread``
``numbered`` runs ahead while outcomes are on their way to the loop, and one cache could
not be both: read on the loop it would show a seq before its message was delivered (a
member joining with ``since`` would wait for, or replay around, a message it is about to
receive live), and kept on the loop it would make the writer wait for the loop before
numbering each batch, losing the pipelining that is the thread's reason to exist.

The writer numbers from ``numbered``, so one process must own the file; several
processes writing the same file would need a shared store.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from chat_server.errors import StoreError, StoreUnavailable
from chat_server.messages import Message
from chat_server.store.base import BatchCallback, BatchLedger, LedgerStore, StoreStats
from chat_server.store.sqlite_commits import (
    BatchOutcome,
    CommitHold,
    CommitPlace,
    Item,
    LoopCommits,
    SqliteWriter,
    ThreadCommits,
    WriterThreadHook,
)
from chat_server.store.sqlite_policy import (
    COMMIT_NOW_SIZE,
    DEFAULT_BATCH_MAX,
    DEFAULT_CHECKPOINT_PAGES,
    DEFAULT_COMMIT_INTERVAL_MS,
    DEFAULT_QUEUE_MAX,
    DEFAULT_SYNCHRONOUS,
    DEFAULT_WAL_MAX_BYTES,
    commit_place,
    hand_over_wait_s,
)
from chat_server.store.sqlite_reads import SqliteReader
from chat_server.store.sqlite_schema import SCHEMA_VERSION, SYNCHRONOUS
from chat_server.store.sqlite_wal import Checkpointer
from chat_server.tail import COMMIT_BUCKETS_S, NOTABLE_KEPT, PlainHistogram

__all__ = [
    "COMMIT_NOW_SIZE",
    "SCHEMA_VERSION",
    "SqliteHistoryStore",
    "StoreStats",
    "WriterThreadHook",
]

logger = logging.getLogger("chat_server.store")


class SqliteHistoryStore(LedgerStore):
    """A :class:`HistoryStore` on one SQLite file: commits on the loop or a writer thread,
    reads on a reader thread, checkpoints on a checkpointer thread.

    ``submit`` never blocks the loop: it queues at most ``queue_max`` messages
    (beyond that it raises ``StoreUnavailable("history store overloaded")`` and
    queues nothing), while at most ``batch_max`` more are being committed. With
    ``history_max`` > 0 each commit also deletes its rooms' messages older than the
    newest ``history_max``; ``seq`` still continues from the newest, which trimming
    always keeps (:mod:`~chat_server.store.sqlite_schema`). Every method is called
    from the event loop thread that called :meth:`start`. ``writer_hook`` runs on the
    writer thread at its start, between batches when it asks to, and at its end
    (profiling).
    ``checkpointer`` is the WAL's :class:`~chat_server.store.sqlite_wal.Checkpointer`,
    whose counters tests and ``/stats`` read.
    """

    def __init__(
        self,
        *,
        path: str | Path,
        on_batch: BatchCallback | None = None,
        synchronous: str = DEFAULT_SYNCHRONOUS,
        queue_max: int = DEFAULT_QUEUE_MAX,
        batch_max: int = DEFAULT_BATCH_MAX,
        history_max: int = 0,
        busy_timeout_ms: int = 5000,
        writer_hook: WriterThreadHook | None = None,
        commit_on: str = "auto",
        checkpoint_pages: int = DEFAULT_CHECKPOINT_PAGES,
        checkpointer_idle: bool = True,
        wal_max_bytes: int = DEFAULT_WAL_MAX_BYTES,
        commit_seconds: PlainHistogram | None = None,
        commit_interval_ms: float = DEFAULT_COMMIT_INTERVAL_MS,
    ) -> None:
        """Configure the store; nothing is opened until :meth:`start`.

        ``commit_on`` is ``auto``, ``loop`` or ``thread`` (see
        :func:`~chat_server.store.sqlite_policy.commit_place`); ``commit_seconds``
        receives each transaction's duration; ``commit_interval_ms`` is the least time
        between two hand-overs (0: one per loop iteration; see
        :func:`~chat_server.store.sqlite_policy.hand_over_wait_s`). The defaults are
        the chat server's settings' defaults. Raises ``ValueError`` for a
        ``synchronous`` other than ``normal`` or ``full``, a ``commit_on`` that
        :func:`~chat_server.store.sqlite_policy.commit_place` refuses, a ``queue_max``,
        ``batch_max`` or ``checkpoint_pages`` below 1, or a negative ``history_max``,
        ``busy_timeout_ms`` or ``commit_interval_ms``.
        """
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be 'normal' or 'full', not {synchronous!r}")
        place = commit_place(commit_on, synchronous)
        if checkpoint_pages < 1:
            raise ValueError(f"checkpoint_pages must be at least 1, not {checkpoint_pages}")
        if queue_max < 1:
            raise ValueError(f"queue_max must be at least 1, not {queue_max}")
        if batch_max < 1:
            raise ValueError(f"batch_max must be at least 1, not {batch_max}")
        if history_max < 0:
            raise ValueError(f"history_max must be 0 (keep all) or more, not {history_max}")
        if busy_timeout_ms < 0:
            raise ValueError(f"busy_timeout_ms must be 0 or more, not {busy_timeout_ms}")
        if commit_interval_ms < 0:
            raise ValueError(f"commit_interval_ms must be 0 or more, not {commit_interval_ms}")
        self._path = Path(path)
        self._ledger = BatchLedger(on_batch)
        self._synchronous = SYNCHRONOUS[synchronous]
        self._queue_max = queue_max
        self._batch_max = batch_max
        self._busy_timeout_s = busy_timeout_ms / 1000
        self._commit_interval_s = commit_interval_ms / 1000
        self.commit_seconds = (
            PlainHistogram(COMMIT_BUCKETS_S) if commit_seconds is None else commit_seconds
        )
        #: ``(unix time, seconds, messages)`` of the last commits of NOTABLE_LAG_S or more
        self.slow_commits: collections.deque[tuple[float, float, int]] = collections.deque(
            maxlen=NOTABLE_KEPT
        )

        #: the write side (connection, numbering, transaction): used by whoever runs the
        #: transactions (the loop or the writer thread)
        self._writer = SqliteWriter(
            path=self._path,
            synchronous=self._synchronous,
            busy_timeout_s=self._busy_timeout_s,
            history_max=history_max,
            commit_seconds=self.commit_seconds,
            slow_commits=self.slow_commits,
        )
        # Every commit holds it; the checkpointer takes it to restart the WAL.
        hold = CommitHold()
        self._commits: CommitPlace
        if place == "loop":
            self._commits = LoopCommits(
                writer=self._writer, hold=hold, resume=self._resume_held, batch_max=batch_max
            )
        else:
            self._commits = ThreadCommits(
                writer=self._writer,
                apply=self._apply,
                hold=hold,
                batch_max=batch_max,
                hook=writer_hook,
            )
        #: what waits for the writer thread (always empty with commits on the loop)
        self._queue = self._commits.queue

        # The read side: its own thread and connection (see SqliteReader).
        self._reads = SqliteReader(self._path, self._busy_timeout_s)

        #: the WAL's checkpoints and restarts, on a thread of its own
        self.checkpointer = Checkpointer(
            path=self._path,
            synchronous=self._synchronous,
            checkpoint_pages=checkpoint_pages,
            idle_policy=checkpointer_idle,
            wal_max_bytes=wal_max_bytes,
            commit_hold=hold,
            on_blocked=self._set_wal_blocked,
        )
        #: written by the checkpointer thread (through _set_wal_blocked), read by submit
        #: without a lock: what no checkpoint could copy back is past wal_max_bytes
        self._wal_blocked = False

        # Owned by the event loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        #: submitted and not yet handed over (held too, while the checkpointer holds the
        #: commits on the loop)
        self._pending: list[Item] = []
        #: the hand-over to come: at the end of this iteration (``call_soon``), or when
        #: the commit interval has passed (a ``call_later`` timer); None when none is
        #: scheduled, and then the next submit schedules one
        self._next_hand_over: asyncio.Handle | None = None
        #: when the last hand-over ended (time.perf_counter)
        self._last_hand_over_s = 0.0
        self._accepting = False
        self._closed = False
        self._close_done: asyncio.Future[None] | None = None
        #: ``applied``: every room's last seq reported to ``on_batch`` (the writer's
        #: ``numbered`` as of start, then raised by each outcome applied; see the docstring)
        self._applied: dict[str, int] = {}

    # ---- life cycle ---------------------------------------------------------

    async def start(self) -> None:
        """Open (creating if needed) the database and load every room's last ``seq``.

        Raises ``StoreError`` naming the path when the database cannot be opened,
        created or read (a directory, an unwritable place, a newer schema).
        """
        if self._loop is not None or self._closed:
            raise StoreError("history store already started (or closed)")
        self._loop = asyncio.get_running_loop()
        try:
            await self._commits.start(self._loop)
            self._applied = dict(self._writer.numbered)
            await self._reads.open()
            self.checkpointer.start(self._loop)
        except BaseException:
            self._closed = self._reads.closed = True
            await self._stop_threads()
            raise
        self._accepting = True

    async def close(self) -> None:
        """Stop accepting, flush, then stop the threads and close both connections.

        Later ``submit`` calls raise ``StoreUnavailable("history store closed")``.
        Calling ``close`` again waits for the first call to finish.
        """
        if self._close_done is not None:
            await asyncio.shield(self._close_done)
            return
        self._accepting = False
        self._closed = self._reads.closed = True
        if self._loop is None:
            self._close_done = asyncio.get_running_loop().create_future()
            self._close_done.set_result(None)
            return
        self._close_done = self._loop.create_future()
        try:
            await self.flush()
            await self._stop_threads()
        finally:
            # Even when cancelled, let the writer drain and exit so the process can.
            self._commits.stop_soon()
            self._close_done.set_result(None)

    async def _stop_threads(self) -> None:
        """Let the commits drain and stop, then the checkpointer, then the reader; idempotent."""
        await self._commits.stop()
        await self.checkpointer.stop()
        await self._reads.close()

    # ---- writes ---------------------------------------------------------------

    def submit(self, message: Message, context: Any) -> None:
        """Queue ``message`` (``seq`` 0) for the group commit after this loop iteration.

        Never blocks. Raises ``StoreUnavailable`` and queues nothing when the store
        is not started, is closed or closing, already holds ``queue_max`` waiting
        messages, or its WAL is past ``wal_max_bytes`` because checkpoints are
        blocked. Otherwise the outcome arrives later through ``on_batch``.
        """
        if not self._accepting:
            self._ledger.refused("closed")
            reason = "closed" if self._closed else "not started"
            raise StoreUnavailable(f"history store {reason}")
        if len(self._pending) + len(self._queue) >= self._queue_max:
            self._ledger.refused("queue_full")
            raise StoreUnavailable("history store overloaded")
        if self._wal_blocked:
            self._ledger.refused("wal_full")
            raise StoreUnavailable("history store: WAL full, a checkpoint is blocked by a reader")
        self._pending.append((message, context))
        if self._next_hand_over is None:
            assert self._loop is not None
            self._next_hand_over = self._loop.call_soon(self._hand_over)
        self._ledger.submitted()

    def _hand_over(self) -> None:
        """At the end of a loop iteration, or when the commit interval has passed: hand
        what is pending to the commits, or wait as long as :func:`hand_over_wait_s` says.

        While the checkpointer holds the commits on the loop the commits refuse it: it
        stays pending, and :meth:`_resume_held` hands it over when the checkpointer lets go.
        """
        self._next_hand_over = None
        items = self._pending
        if not items:
            return
        wait_s = hand_over_wait_s(
            pending=len(items),
            now_s=time.perf_counter(),
            last_hand_over_s=self._last_hand_over_s,
            interval_s=self._commit_interval_s,
            batch_max=self._batch_max,
            closed=self._closed,
        )
        if wait_s:
            assert self._loop is not None
            self._next_hand_over = self._loop.call_later(wait_s, self._hand_over)
            return
        self._pending = []
        done = self._commits.hand_over(items)
        if done is None:
            self._pending = items  # held: nothing ran, so nothing was submitted meanwhile
            return
        for batch, outcome in done:
            self._apply(batch, outcome)
        self._last_hand_over_s = time.perf_counter()

    def _resume_held(self) -> None:
        """On the loop, when the checkpointer let go of the commits: hand over what it held."""
        if self._pending and self._next_hand_over is None:
            self._hand_over()

    def stats(self) -> StoreStats:
        """A snapshot of the batches so far (the queue counts what waits for its commit),
        with the WAL file's size, its restarts and the commits' holds for them."""
        checkpointer = self.checkpointer
        holds = checkpointer.restart_hold_seconds
        return dataclasses.replace(
            self._ledger.stats(queue_depth=len(self._queue) + len(self._pending)),
            wal_file_bytes=checkpointer.wal_file_bytes,
            wal_restarts=checkpointer.wal_restarts,
            restart_hold_counts=list(holds.counts),
            restart_hold_sum_s=holds.sum,
        )

    def notable(self) -> dict[str, Any]:
        """The last slow commits, checkpoints and restart holds (10 ms or more) with their
        times, and the checkpointer's counts (checkpoints, times it left SCHED_IDLE to catch
        up, restart holds and WAL restarts, the longest hold) and the WAL file's size now
        and at most, for /stats."""
        checkpointer = self.checkpointer
        notable: dict[str, Any] = {
            kind: [
                {"at": round(at, 3), "took_s": round(took, 6), "size": size}
                for at, took, size in events
            ]
            for kind, events in (
                ("slow_commits", list(self.slow_commits)),
                ("slow_checkpoints", list(checkpointer.slow_checkpoints)),
                ("slow_restart_holds", list(checkpointer.slow_restart_holds)),
            )
        }
        notable["checkpointer"] = checkpointer.counts()
        return notable

    def last_seq(self, room: str) -> int:
        """The last ``seq`` of ``room`` reported to ``on_batch`` (0 when it has none)."""
        return self._applied.get(room, 0)

    def _apply(self, items: list[Item], outcome: BatchOutcome) -> None:
        """On the loop, in commit order: give the messages their ``seq``, call ``on_batch``,
        wake flushers."""
        if outcome.error is None:
            # Set here rather than in the writer so that loop code never sees a seq
            # before the batch is reported.
            for (message, _), seq in zip(items, outcome.seqs, strict=True):
                message.seq = seq
            self._applied.update(outcome.room_seqs)
        self._ledger.report(items, outcome.error)

    # ---- the checkpointer (on its own thread, see Checkpointer) ---------------

    def _set_wal_blocked(self, blocked: bool) -> None:
        """Checkpointer thread: refuse (or accept again) submissions while the WAL is
        blocked past ``wal_max_bytes``."""
        self._wal_blocked = blocked

    # ---- reads (on the reader's thread, see SqliteReader) --------------------

    async def history(self, room: str, before: int | None, limit: int) -> list[Message]:
        """The latest ``limit`` messages with ``seq < before`` (no bound when None), ascending."""
        return await self._reads.history(room, before, limit)

    async def recent_sends(self, since_ms: int, limit: int) -> list[Message]:
        """The newest ``limit`` messages with a ``ref`` and ``ts >= since_ms``, oldest first."""
        return await self._reads.recent_sends(since_ms, limit)

    async def after(self, room: str, after_seq: int, limit: int) -> list[Message]:
        """Up to ``limit`` committed messages with ``seq > after_seq``, ascending."""
        return await self._reads.after(room, after_seq, limit)
