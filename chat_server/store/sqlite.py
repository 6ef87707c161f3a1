"""Durable room history in one SQLite file, written by group commit.

:class:`SqliteHistoryStore` keeps every room's messages in a SQLite database in
WAL mode. Messages submitted during one event-loop iteration are handed over
together, once, at the end of it (one callback, not one per message), and
committed as one transaction (group commit). Hand-overs are at least
``commit_interval_ms`` apart (``CHAT_DB_COMMIT_INTERVAL_MS``, 1 ms): one coming
sooner waits on a timer and takes later iterations' messages along, unless it
already holds ``COMMIT_NOW_SIZE`` (see :meth:`SqliteHistoryStore._hand_over`).
Where that transaction runs is ``commit_on``:

``loop``
    On the event loop, right away. With ``synchronous=normal`` a commit is a WAL
    append without fsync (tens of microseconds for a batch), cheaper than waking
    a thread and switching the GIL twice; the loop never waits on a lock (the
    connection's busy timeout is 0: a database locked by another process fails
    the batch with ``unavailable``).
``thread``
    On a writer thread that owns the write connection; whatever queued up while
    the previous transaction committed goes into the next one. Required with
    ``synchronous=full`` (an fsync per commit never runs on the loop).

Each room's ``seq`` is assigned inside the transaction and handed to the messages
only after ``COMMIT`` succeeded, so a failed batch consumes none. Each batch's
outcome is reported on the event loop, in commit order, through the ``on_batch``
callback.

Checkpoints never run inside a commit (``wal_autocheckpoint`` is off): a
checkpointer thread with its own connection runs ``PRAGMA
wal_checkpoint(PASSIVE)`` whenever the WAL file reaches ``checkpoint_pages``
pages; PASSIVE never waits for readers or writers, so no commit waits on the
checkpoint's fsync. The checkpointer runs as ``SCHED_IDLE`` (only in the loop's idle
time on its core) unless one runs too long (see :meth:`_set_checkpointer_idle`).
Beside a commit every millisecond a PASSIVE checkpoint never ends with nothing left,
and SQLite starts the WAL again only after one did: so once the WAL holds
``WAL_RESTART_CHECKPOINTS`` checkpoints' worth, the checkpointer holds the commits for
a few milliseconds (commits on the loop wait in a list; the loop goes on), copies the
last frames and restarts the WAL itself (see :meth:`_restart_wal`). The WAL file
therefore stays near what comes in between two restarts, and a file grown past
``WAL_FILE_LIMIT_RESTARTS`` restarts' worth (a reader held checkpoints back) is cut
back on the checkpointer's thread, never on the loop. SQLite syncs the new WAL header
at every restart (so that a power loss cannot mix old and new frames); for these
restarts that happens in the checkpointer's restarting write, not in a commit. A WAL
that restarts by itself (a lull let a checkpoint finish) still has the commit that
restarts it sync the header: 0.3-0.5 ms under strace here. A reader that holds an old
snapshot open (an outside tool in a long transaction) can keep a checkpoint from
finishing; the WAL then grows, and once what is not checkpointed passes
``wal_max_bytes`` new submissions are refused with ``unavailable`` ("checkpoint
blocked") until a checkpoint catches up, so what it holds unchecked stays bounded.

Durability, by ``synchronous`` (SQLite's ``PRAGMA synchronous`` in WAL mode):

``normal``
    A committed batch survives a crash of the process (``kill -9``): the
    commit is in the WAL file in the OS page cache. A power loss or OS crash
    may lose the most recent commits (never corrupt the database); no fsync
    on commit, only at checkpoints and when the WAL restarts (its header).
``full``
    A committed batch also survives a power loss or OS crash, at the cost of
    one fsync of the WAL per group commit (not per message).

The store numbers messages from a cache of every room's last ``seq`` that its
writer loads at start, so one process must own the file; several processes
writing the same file would need a shared store.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

from chat_server.errors import StoreError, StoreUnavailable
from chat_server.messages import Message
from chat_server.store.base import BatchCallback, BatchLedger, LedgerStore, StoreStats
from chat_server.store.sqlite_reads import SqliteReader
from chat_server.store.sqlite_schema import (
    INSERT_MESSAGE,
    SCHEMA_VERSION,
    SYNCHRONOUS,
    TRIM_ROOM,
    UPSERT_ROOM,
    open_writer,
)
from chat_server.tail import COMMIT_BUCKETS_S, NOTABLE_KEPT, NOTABLE_LAG_S, PlainHistogram

__all__ = ["SCHEMA_VERSION", "SqliteHistoryStore", "StoreStats", "WriterThreadHook"]

logger = logging.getLogger("chat_server.store")

# How often an idle writer checks that its event loop still exists, so that a loop
# closed without close() does not keep this non-daemon thread (and the process) alive.
_IDLE_CHECK_S: Final = 1.0
#: a hand-over of this many sends is committed at once, whatever the commit interval
COMMIT_NOW_SIZE: Final = 32
#: how often the checkpointer looks at the WAL file's size
CHECKPOINT_POLL_S: Final = 0.25
#: a checkpoint still running after this long (s) had no idle time on its core: the loop
#: puts the checkpointer at normal priority until it ends. Five interleaved minutes each
#: at 68,640 delivered/s (2,000 connections in rooms of 10, the core 92 % busy,
#: ``python -m bench.tail --rate 6864 --repeat 5`` with ``--server-root`` of both): at
#: 0.5 s 1-5 raises a minute, each taking the loop's core mid-load, p99 25.8-256.6 ms
#: (median 65.8); at 2 s none, p99 18.5-48.9 ms (median 29.8), lower in 5 of 5 pairs,
#: CPU per frame unchanged. Past capacity (``--rate 12000``, one pair) the WAL file still
#: stays bounded, a little larger: 98 -> 153 MiB (docs/performance.md, seventh section).
CATCH_UP_AFTER_S: Final = 2.0
#: once the WAL holds this many checkpoints' worth of frames (``checkpoint_pages`` each)
#: since it last restarted, the checkpointer has it restart (see :meth:`_restart_wal`).
#: Each restart holds the commits for a few ms. Ten interleaved minutes each at 66,200
#: delivered/s (2,000 connections in rooms of 10, ``python -m bench.tail --rate 6620
#: --repeat 1``): at 4 (16 MB) 39-51 holds a minute, and 17 of the seconds with a
#: delivery of 50 ms or more overlapped a hold of 10 ms or more; at 16 (64 MB) 13-15
#: holds and 4 such seconds, for a WAL file of 72-81 MiB instead of 27-42; the maxima
#: were not told apart (docs/performance.md)
WAL_RESTART_CHECKPOINTS: Final = 16
#: a WAL file bigger than this many restarts' worth is cut back to it when the WAL restarts
WAL_FILE_LIMIT_RESTARTS: Final = 4
#: before it holds the commits, the checkpointer copies what came in meanwhile without
#: holding them, until one such pass takes less than this (s), at most
#: ``RESTART_PASSES_MAX`` times: what the held pass copies is what the last one let in
SHORT_PASS_S: Final = 0.005
RESTART_PASSES_MAX: Final = 3
_COMMIT_PLACES: Final = ("loop", "thread")

_Item = tuple[Message, Any]


class WriterThreadHook(Protocol):
    """Per-thread work the writer thread does for someone else (``PROFILE=cprofile``).

    Every method is called on the writer thread. ``pending`` is read between
    batches, without a lock: when true the writer calls :meth:`checkpoint` before
    its next batch, waking for it if idle (``wake``, given to :meth:`thread_started`,
    may be called from any thread to make it look). Methods must not raise.
    """

    pending: bool

    def thread_started(self, wake: Callable[[], None]) -> None:
        """The writer thread begins; ``wake`` makes it look at ``pending`` soon."""

    def checkpoint(self) -> None:
        """Between two batches, because ``pending`` was true."""

    def thread_stopped(self) -> None:
        """The writer thread ends (after its last batch)."""


class _NoHook:
    """The hook of a store nobody profiles: the writer reads ``pending`` once a batch."""

    pending = False

    def thread_started(self, wake: Callable[[], None]) -> None:
        pass

    def checkpoint(self) -> None:
        pass

    def thread_stopped(self) -> None:
        pass


_NO_HOOK: Final = _NoHook()


class SqliteHistoryStore(LedgerStore):
    """A :class:`HistoryStore` on one SQLite file: commits on the loop or a writer thread,
    reads on a reader thread, checkpoints on a checkpointer thread.

    ``submit`` never blocks the loop: it queues at most ``queue_max`` messages
    (beyond that it raises ``StoreUnavailable("history store overloaded")`` and
    queues nothing), while at most ``batch_max`` more are being committed. With
    ``history_max`` > 0 each commit also deletes its rooms' messages older than the
    newest ``history_max``; ``seq`` still continues, since each room's last ``seq``
    is kept apart from its messages. Every method is called from the event loop
    thread that called :meth:`start`. ``writer_hook`` runs on the writer thread at
    its start, between batches when it asks to, and at its end (profiling).
    """

    def __init__(
        self,
        *,
        path: str | Path,
        on_batch: BatchCallback,
        synchronous: str = "normal",
        queue_max: int = 10000,
        batch_max: int = 1000,
        history_max: int = 0,
        busy_timeout_ms: int = 5000,
        writer_hook: WriterThreadHook | None = None,
        commit_on: str | None = None,
        checkpoint_pages: int = 1000,
        checkpointer_idle: bool = True,
        wal_max_bytes: int = 256 << 20,
        commit_seconds: PlainHistogram | None = None,
        commit_interval_ms: float = 0.0,
    ) -> None:
        """Configure the store; nothing is opened until :meth:`start`.

        ``commit_on`` is ``loop`` or ``thread`` (None: ``loop`` with ``normal``,
        ``thread`` with ``full``); ``commit_seconds`` receives each transaction's
        duration; ``commit_interval_ms`` is the least time between two hand-overs
        (see :meth:`_hand_over`; 0: one per loop iteration). Raises ``ValueError`` for
        a ``synchronous`` other than ``normal`` or ``full``, ``commit_on="loop"`` with
        ``full``, a ``queue_max``, ``batch_max`` or ``checkpoint_pages`` below 1, or a
        negative ``history_max``, ``busy_timeout_ms`` or ``commit_interval_ms``.
        """
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be 'normal' or 'full', not {synchronous!r}")
        if commit_on is None:
            commit_on = "thread" if synchronous == "full" else "loop"
        if commit_on not in _COMMIT_PLACES:
            raise ValueError(f"commit_on must be 'loop' or 'thread', not {commit_on!r}")
        if commit_on == "loop" and synchronous == "full":
            raise ValueError("synchronous='full' fsyncs each commit: commit_on must be 'thread'")
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
        self._history_max = history_max
        self._busy_timeout_s = busy_timeout_ms / 1000
        self._writer_hook: WriterThreadHook = _NO_HOOK if writer_hook is None else writer_hook
        self._on_loop = commit_on == "loop"
        self._checkpoint_pages = checkpoint_pages
        #: whether the checkpointer runs as SCHED_IDLE at all (CHAT_DB_CHECKPOINTER)
        self._idle_policy = checkpointer_idle
        self._wal_max_bytes = wal_max_bytes
        self._commit_interval_s = commit_interval_ms / 1000
        self.commit_seconds = (
            PlainHistogram(COMMIT_BUCKETS_S) if commit_seconds is None else commit_seconds
        )
        #: ``(unix time, seconds, messages)`` of the last commits of NOTABLE_LAG_S or more
        self.slow_commits: collections.deque[tuple[float, float, int]] = collections.deque(
            maxlen=NOTABLE_KEPT
        )
        #: ``(unix time, seconds, frames copied)`` of the last checkpoints that long
        self.slow_checkpoints: collections.deque[tuple[float, float, int]] = collections.deque(
            maxlen=NOTABLE_KEPT
        )
        #: ``(unix time, seconds, 1 if the WAL restarted)`` of the last restart holds that long
        self.slow_restart_holds: collections.deque[tuple[float, float, int]] = collections.deque(
            maxlen=NOTABLE_KEPT
        )

        # Shared between the loop and the writer, guarded by _cond.
        self._cond = threading.Condition(threading.Lock())
        #: held by whoever writes: each commit (on the loop it is only tried: a commit
        #: that cannot have it waits in _pending), and the checkpointer while it makes the
        #: WAL restart (see :meth:`_restart_wal`)
        self._commit_lock = threading.Lock()
        self._queue: collections.deque[_Item] = collections.deque()
        self._stopping = False

        # Owned by the writer thread.
        self._writer_seq: dict[str, int] = {}
        self._writer: threading.Thread | None = None
        self._writer_stopped: concurrent.futures.Future[None] = concurrent.futures.Future()

        # The read side: its own thread and connection (see SqliteReader).
        self._reads = SqliteReader(self._path, self._busy_timeout_s)

        # Owned by the checkpointer thread (flags read by the loop without a lock).
        self._checkpointer: threading.Thread | None = None
        self._checkpointer_stop = threading.Event()
        self._wal_blocked = False
        self.checkpoints = 0
        #: the checkpointer's thread id (Linux), and whether it runs as SCHED_IDLE
        self.checkpointer_tid: int | None = None
        self.checkpointer_idle = False
        #: times a checkpoint ran past CATCH_UP_AFTER_S and was put at normal priority
        self.checkpoint_catch_ups = 0
        #: when the running checkpoint began (time.monotonic), None between checkpoints
        self._checkpoint_began: float | None = None
        #: how long each of the checkpointer's holds of the commits lasted (s), and how
        #: many of those holds restarted the WAL
        self.restart_hold_seconds = PlainHistogram(COMMIT_BUCKETS_S)
        self.wal_restarts = 0
        #: the WAL file's size at the checkpointer's last look, and the largest seen
        self.wal_file_bytes = 0
        self.wal_file_bytes_max = 0
        #: the loop's look at the checkpointer, every CHECKPOINT_POLL_S
        self._watch: asyncio.TimerHandle | None = None

        # Owned by the event loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the write connection when commits run on the loop
        self._loop_conn: sqlite3.Connection | None = None
        #: submitted during this loop iteration, handed over once at its end
        self._pending: list[_Item] = []
        self._handover_scheduled = False
        #: when the last hand-over ended (time.perf_counter)
        self._last_handover = 0.0
        self._accepting = False
        self._closed = False
        self._close_done: asyncio.Future[None] | None = None
        self._last_seq: dict[str, int] = {}

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
            if self._on_loop:
                self._writer_stopped.set_result(None)  # no writer thread
                try:
                    self._loop_conn = self._open_writer(busy_timeout_s=0.0)
                except StoreError:
                    raise
                except Exception as exc:
                    logger.exception("history store: opening %s failed", self._path)
                    raise StoreError(
                        f"cannot open history store {str(self._path)!r}: {exc}"
                    ) from exc
                self._last_seq = dict(self._writer_seq)
            else:
                ready: concurrent.futures.Future[dict[str, int]] = concurrent.futures.Future()
                self._writer = threading.Thread(
                    target=self._run_writer,
                    args=(ready,),
                    name="chat-history-writer",
                    daemon=False,
                )
                self._writer.start()
                self._last_seq = await asyncio.wrap_future(ready)
            await self._reads.open()
            self._checkpointer = threading.Thread(
                target=self._run_checkpointer, name="chat-history-checkpointer", daemon=False
            )
            self._checkpointer.start()
            self._watch = self._loop.call_later(CHECKPOINT_POLL_S, self._watch_checkpointer)
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
            self._signal_stop()
            self._close_done.set_result(None)

    async def _stop_threads(self) -> None:
        """Let the writer drain and exit, then close the reader's connection; idempotent."""
        self._signal_stop()
        if self._writer is not None:
            await asyncio.wrap_future(self._writer_stopped)
            self._writer.join()
            self._writer = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._checkpointer is not None:
            self._checkpointer_stop.set()
            checkpointer, self._checkpointer = self._checkpointer, None
            await asyncio.to_thread(checkpointer.join)
        if self._loop_conn is not None:
            self._loop_conn.close()
            self._loop_conn = None
        await self._reads.close()

    def _signal_stop(self) -> None:
        """Tell the writer to exit once the queue is empty."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def _wake_writer(self) -> None:
        """Make an idle writer look at its hook's ``pending`` (any thread)."""
        with self._cond:
            self._cond.notify()

    # ---- writes ---------------------------------------------------------------

    def submit(self, message: Message, context: Any) -> None:
        """Queue ``message`` (``seq`` 0) for the group commit after this loop iteration.

        Never blocks. Raises ``StoreUnavailable`` and queues nothing when the store
        is not started, is closed or closing, already holds ``queue_max`` waiting
        messages, or its WAL is past ``wal_max_bytes`` because checkpoints are
        blocked. Otherwise the outcome arrives later through ``on_batch``.
        """
        if not self._accepting:
            reason = "closed" if self._closed else "not started"
            raise StoreUnavailable(f"history store {reason}")
        if len(self._pending) + len(self._queue) >= self._queue_max:
            raise StoreUnavailable("history store overloaded")
        if self._wal_blocked:
            raise StoreUnavailable("history store: WAL full, a checkpoint is blocked by a reader")
        self._pending.append((message, context))
        if not self._handover_scheduled:
            self._handover_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._hand_over)
        self._ledger.submitted()

    def _hand_over(self) -> None:
        """At the end of a loop iteration: commit what it submitted, or give it to the writer.

        With a ``commit_interval_ms``, a hand-over that comes sooner than that after the
        last one waits for the rest of the interval (a timer), gathering later
        iterations' messages into the same transaction: under load a commit per
        iteration (3,300/s of ~4 messages at 140k delivered/s, 76 us each) cost a
        quarter of the server's core; at light load messages arrive further apart than
        the interval and are committed at the end of their iteration as before. A wait
        under half the interval is not worth a timer (uvloop's have 1 ms steps), and a
        list of ``COMMIT_NOW_SIZE`` sends is committed at once: near saturation the
        iterations are long and their lists big, and holding them cost capacity (two
        climbs at 2,000 connections: knees of 217k and 156k delivered/s against 257k
        and 264k without the interval).
        """
        self._handover_scheduled = False
        if not self._pending:
            return
        if (
            self._commit_interval_s
            and not self._closed
            and len(self._pending) < min(COMMIT_NOW_SIZE, self._batch_max)
        ):
            wait = self._last_handover + self._commit_interval_s - time.perf_counter()
            if wait > self._commit_interval_s / 2:
                self._handover_scheduled = True
                assert self._loop is not None
                self._loop.call_later(wait, self._hand_over)
                return
        if self._on_loop and not self._commit_lock.acquire(blocking=False):
            # the checkpointer holds the commits for a few ms; it calls _after_hold
            return
        items, self._pending = self._pending, []
        try:
            self._hand_over_items(items)
        finally:
            if self._on_loop:
                self._commit_lock.release()
            self._last_handover = time.perf_counter()

    def _after_hold(self) -> None:
        """On the loop, when the checkpointer let go of the commits: commit what waited."""
        if self._pending and not self._handover_scheduled:
            self._hand_over()

    def _hand_over_items(self, items: list[_Item]) -> None:
        """Commit ``items`` on the loop (in ``batch_max`` slices) or queue them for the writer."""
        if self._on_loop:
            conn = self._loop_conn
            size = self._batch_max
            for start in range(0, len(items), size):
                batch = items[start : start + size]
                if conn is None:
                    self._report(batch, [], {}, StoreUnavailable("history store closed"))
                    continue
                seqs, room_seqs, error = self._commit(conn, batch)
                self._report(batch, seqs, room_seqs, error)
            return
        with self._cond:
            self._queue.extend(items)
            self._cond.notify()

    def stats(self) -> StoreStats:
        """A snapshot of the batches so far (the queue counts what waits for its commit),
        with the WAL file's size, its restarts and the commits' holds for them."""
        holds = self.restart_hold_seconds
        return dataclasses.replace(
            self._ledger.stats(queue_depth=len(self._queue) + len(self._pending)),
            wal_file_bytes=self.wal_file_bytes,
            wal_restarts=self.wal_restarts,
            restart_hold_counts=list(holds.counts),
            restart_hold_sum_s=holds.sum,
        )

    def notable(self) -> dict[str, Any]:
        """The last slow commits, checkpoints and restart holds (10 ms or more) with their
        times, and the checkpointer's counts (checkpoints, times it left SCHED_IDLE to catch
        up, restart holds and WAL restarts, the longest hold) and the WAL file's size now
        and at most, for /stats."""
        notable: dict[str, Any] = {
            kind: [
                {"at": round(at, 3), "took_s": round(took, 6), "size": size}
                for at, took, size in events
            ]
            for kind, events in (
                ("slow_commits", list(self.slow_commits)),
                ("slow_checkpoints", list(self.slow_checkpoints)),
                ("slow_restart_holds", list(self.slow_restart_holds)),
            )
        }
        holds = self.restart_hold_seconds
        notable["checkpointer"] = {
            "checkpoints": self.checkpoints,
            "catch_ups": self.checkpoint_catch_ups,
            "idle": self.checkpointer_idle,
            "restart_holds": holds.count,
            "wal_restarts": self.wal_restarts,
            "restart_hold_max_s": round(holds.max, 6),
            # bucket upper bound (s, "inf" last) -> holds that long
            "restart_hold_buckets": {
                str(bound): n
                for bound, n in zip((*holds.bounds, "inf"), holds.counts, strict=True)
                if n
            },
            "wal_file_bytes": self.wal_file_bytes,
            "wal_file_bytes_max": self.wal_file_bytes_max,
        }
        return notable

    def last_seq(self, room: str) -> int:
        """The last ``seq`` of ``room`` reported to ``on_batch`` (0 when it has none)."""
        return self._last_seq.get(room, 0)

    def _report(
        self,
        items: list[_Item],
        seqs: list[int],
        room_seqs: dict[str, int],
        error: StoreError | None,
    ) -> None:
        """On the loop: give the messages their ``seq``, call ``on_batch``, wake flushers."""
        if error is None:
            # Set here rather than in the writer so that loop code never sees a seq
            # before the batch is reported.
            for (message, _), seq in zip(items, seqs, strict=True):
                message.seq = seq
            self._last_seq.update(room_seqs)
        self._ledger.report(items, error)

    # ---- the writer thread ------------------------------------------------------

    def _run_writer(self, ready: concurrent.futures.Future[dict[str, int]]) -> None:
        """Writer thread: open the database, then commit batches until told to stop."""
        hook = self._writer_hook
        hook.thread_started(self._wake_writer)
        try:
            try:
                conn = self._open_writer()
            except Exception as exc:
                if not isinstance(exc, StoreError):
                    logger.exception("history store: opening %s failed", self._path)
                    exc = StoreError(f"cannot open history store {str(self._path)!r}: {exc}")
                ready.set_exception(exc)
                return
            try:
                ready.set_result(dict(self._writer_seq))
                self._write_batches(conn)
            finally:
                conn.close()
        except Exception:
            logger.exception("history store: writer thread failed")
        finally:
            hook.thread_stopped()
            self._writer_stopped.set_result(None)

    def _open_writer(self, busy_timeout_s: float | None = None) -> sqlite3.Connection:
        """Open the write connection (see :func:`open_writer`) and load the writer's seq cache.

        ``busy_timeout_s`` replaces the configured busy timeout once the file is open.
        """
        conn, self._writer_seq = open_writer(
            self._path,
            synchronous=self._synchronous,
            open_timeout_s=self._busy_timeout_s,
            busy_timeout_s=self._busy_timeout_s if busy_timeout_s is None else busy_timeout_s,
        )
        return conn

    def _write_batches(self, conn: sqlite3.Connection) -> None:
        """Take up to ``batch_max`` queued messages at a time and commit them as one.

        Between batches, and when woken idle for it, runs the hook's checkpoint.
        """
        loop = self._loop
        assert loop is not None
        queue = self._queue
        hook = self._writer_hook
        while True:
            with self._cond:
                while not queue and not self._stopping and not hook.pending:
                    self._cond.wait(_IDLE_CHECK_S)
                    if not queue and loop.is_closed():
                        logger.warning("history store: event loop closed before close(); stopping")
                        return
                if not queue and self._stopping:
                    return  # everything queued has been written
                batch = [queue.popleft() for _ in range(min(len(queue), self._batch_max))]
            if hook.pending:
                hook.checkpoint()
            if not batch:
                continue  # woken for the hook only
            with self._commit_lock:
                seqs, room_seqs, error = self._commit(conn, batch)
            try:
                loop.call_soon_threadsafe(self._report, batch, seqs, room_seqs, error)
            except RuntimeError:
                logger.error(
                    "history store: event loop closed; a batch of %d went unreported (%s)",
                    len(batch),
                    "committed" if error is None else "failed",
                )
                return

    def _commit(
        self, conn: sqlite3.Connection, batch: list[_Item]
    ) -> tuple[list[int], dict[str, int], StoreError | None]:
        """Write ``batch`` in one transaction; return its seqs, each room's last seq, the error.

        On failure nothing was written, the writer's seq cache is unchanged and the
        returned seqs are empty.
        """
        cache = self._writer_seq
        room_seqs: dict[str, int] = {}
        seqs: list[int] = []
        rows: list[tuple[str, int, str, str, int, str | None]] = []
        for message, _ in batch:
            room = message.room
            seq = room_seqs.get(room)
            seq = (cache.get(room, 0) if seq is None else seq) + 1
            room_seqs[room] = seq
            seqs.append(seq)
            rows.append((room, seq, message.user, message.body, message.ts, message.ref))
        started = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(INSERT_MESSAGE, rows)
            conn.executemany(UPSERT_ROOM, room_seqs.items())
            if self._history_max:
                keep = self._history_max
                trims = [(room, seq - keep) for room, seq in room_seqs.items() if seq > keep]
                conn.executemany(TRIM_ROOM, trims)
            conn.execute("COMMIT")
        except Exception as exc:
            error = self._batch_error(exc)
            if isinstance(exc, sqlite3.Error):
                logger.warning("history store: batch of %d messages failed: %s", len(batch), exc)
            else:
                logger.exception("history store: batch of %d messages failed", len(batch))
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error as rollback_exc:
                    logger.error("history store: rollback failed: %s", rollback_exc)
            return [], {}, error
        took = time.perf_counter() - started
        self.commit_seconds.observe(took)
        if took >= NOTABLE_LAG_S:
            self.slow_commits.append((time.time(), took, len(batch)))
        cache.update(room_seqs)
        return seqs, room_seqs, None

    @staticmethod
    def _batch_error(exc: Exception) -> StoreError:
        """Map a failed write to the contract: locked or I/O trouble is ``unavailable``."""
        if isinstance(exc, sqlite3.OperationalError):
            return StoreUnavailable(f"history store unavailable: {exc}")
        return StoreError(f"history store failed: {exc}")

    # ---- the checkpointer thread ---------------------------------------------

    def _run_checkpointer(self) -> None:
        """Checkpointer thread: PASSIVE checkpoints whenever the WAL file is big enough,
        and a restart of the WAL whenever it holds ``WAL_RESTART_CHECKPOINTS``
        checkpoints' worth.

        Also decides whether the WAL is blocked: what no checkpoint could copy back
        (a reader holds an older snapshot) past ``wal_max_bytes``. Ends on
        :meth:`close` (or when the loop is gone) with a last PASSIVE checkpoint.
        """
        loop = self._loop
        assert loop is not None
        wal = self._path.with_name(self._path.name + "-wal")
        self.checkpointer_tid = threading.get_native_id()
        self._set_checkpointer_idle(True)
        try:
            # Never waits on a lock: PASSIVE does not, and the restart (see _restart_wal)
            # gives up at once where an outside reader or writer is in the way.
            conn = sqlite3.connect(self._path, timeout=0, isolation_level=None)
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            # The restart's write (see _restart_wal) cuts a WAL file grown past this back
            # to it, on this thread; the loop's connection never cuts it.
            restart_frames = WAL_RESTART_CHECKPOINTS * self._checkpoint_pages
            limit = WAL_FILE_LIMIT_RESTARTS * restart_frames * page_size
            conn.execute(f"PRAGMA journal_size_limit = {limit}")
        except sqlite3.Error:
            logger.exception("history store: the checkpointer cannot open %s", self._path)
            return
        threshold = self._checkpoint_pages * page_size
        try:
            while not self._checkpointer_stop.wait(CHECKPOINT_POLL_S) and not loop.is_closed():
                try:
                    size = wal.stat().st_size
                except FileNotFoundError:
                    continue
                self.wal_file_bytes = size
                self.wal_file_bytes_max = max(self.wal_file_bytes_max, size)
                if size >= threshold or self._wal_blocked:
                    frames = self._checkpoint(conn, page_size)
                    if frames >= restart_frames:
                        self._restart_wal(conn, page_size, loop)
            self._checkpoint(conn, page_size)
        finally:
            conn.close()

    def _set_checkpointer_idle(self, idle: bool) -> bool:
        """Run the checkpointer thread as ``SCHED_IDLE`` (only when its core has nothing
        else to run) or at normal priority; from any thread. Where Linux's policies are
        missing, it stays normal. Returns whether its policy changed.

        At normal priority the checkpointer took its share of the loop's core in the
        middle of a burst: at 170,000 delivered/s it ran 24 ms a second and the loop waited
        as long for its core. As ``SCHED_IDLE`` it runs in the loop's idle time, and a
        loop that wakes takes the core back at once. A core with no idle time (the server
        past its capacity) starves it: there 6 checkpoints ran in 45 s. So the loop
        (:meth:`_watch_checkpointer`) puts a checkpoint that runs past
        ``CATCH_UP_AFTER_S`` at normal priority, and the checkpointer goes back to
        ``SCHED_IDLE`` when it ends (48 checkpoints in 45 s there).
        """
        tid = self.checkpointer_tid
        if idle and not self._idle_policy:
            return False  # CHAT_DB_CHECKPOINTER=normal
        if idle == self.checkpointer_idle or tid is None or not hasattr(os, "SCHED_IDLE"):
            return False
        policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except OSError as exc:
            logger.warning("history store: cannot set the checkpointer's policy: %s", exc)
            return False
        self.checkpointer_idle = idle
        return True

    def _watch_checkpointer(self) -> None:
        """Event loop, every ``CHECKPOINT_POLL_S``: a checkpoint running past
        ``CATCH_UP_AFTER_S`` is starved (its core has no idle time), so it gets normal
        priority until it ends."""
        began = self._checkpoint_began
        if (
            began is not None
            and time.monotonic() - began > CATCH_UP_AFTER_S
            and self._set_checkpointer_idle(False)
        ):
            self.checkpoint_catch_ups += 1
        assert self._loop is not None
        self._watch = self._loop.call_later(CHECKPOINT_POLL_S, self._watch_checkpointer)

    def _checkpoint(self, conn: sqlite3.Connection, page_size: int, *, idle: bool = True) -> int:
        """One PASSIVE checkpoint; sets or clears the blocked flag from what it left.

        Returns the frames the WAL holds since it last restarted when the checkpoint
        copied all of them back, else 0 (some are held by a reader, or it failed).
        ``idle``: put the checkpointer back to ``SCHED_IDLE`` afterwards, in case the
        loop raised it.
        """
        started = time.perf_counter()
        self._checkpoint_began = time.monotonic()
        try:
            _busy, wal_frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            logger.warning("history store: checkpoint failed: %s", exc)
            return 0
        finally:
            self._checkpoint_began = None
        took = time.perf_counter() - started
        if took >= NOTABLE_LAG_S:
            self.slow_checkpoints.append((time.time() - took, took, copied))
        self.checkpoints += 1
        if idle:
            self._set_checkpointer_idle(True)
        left_bytes = max(0, wal_frames - copied) * page_size
        blocked = left_bytes > self._wal_max_bytes
        if blocked != self._wal_blocked:
            self._wal_blocked = blocked
            if blocked:
                logger.warning(
                    "history store: %d MiB of WAL not checkpointed (a reader holds an old"
                    " snapshot): refusing sends until a checkpoint catches up",
                    left_bytes >> 20,
                )
            else:
                logger.warning("history store: checkpoint caught up; accepting sends again")
        return wal_frames if wal_frames == copied else 0

    def _restart_wal(
        self, conn: sqlite3.Connection, page_size: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Checkpointer: make the WAL start again from its beginning, holding the
        commits for a few milliseconds.

        SQLite restarts the WAL only when a write begins after a checkpoint copied every
        frame back. Beside a commit every millisecond a PASSIVE checkpoint never ends
        with nothing left, so under steady load the WAL never restarted and its file grew
        by every commit (34 MB/s at 170,000 delivered/s, 2 GB a minute). So: PASSIVE
        passes without holding anything (still in the loop's idle time), each copying
        what came in during the one before, until one is short (``SHORT_PASS_S``); then,
        at normal priority and holding ``_commit_lock`` (a commit on the loop that finds
        it held waits in ``_pending``, the loop itself goes on), a ``RESTART`` checkpoint
        copies the few frames the last pass let in, and a one-page write (``PRAGMA
        user_version``, unchanged) restarts the WAL here. That write also syncs the new
        WAL header (otherwise the loop's first commit after the restart would), and cuts
        a file grown past ``WAL_FILE_LIMIT_RESTARTS`` restarts' worth back to that. An
        outside reader or writer in the way makes it give up until the next time.
        """
        try:
            for _ in range(RESTART_PASSES_MAX):
                started = time.perf_counter()
                if not self._checkpoint(conn, page_size, idle=False):
                    return  # a reader holds frames back: no restart now
                if time.perf_counter() - started < SHORT_PASS_S:
                    break
            # what follows holds the commits: it must not wait for the loop's idle time
            self._set_checkpointer_idle(False)
            with self._commit_lock:
                started = time.perf_counter()
                try:
                    busy, _frames, _copied = conn.execute(
                        "PRAGMA wal_checkpoint(RESTART)"
                    ).fetchone()
                    if not busy:
                        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                except sqlite3.Error as exc:
                    logger.warning("history store: restarting the WAL failed: %s", exc)
                    busy = 1
                held = time.perf_counter() - started
            try:
                loop.call_soon_threadsafe(self._after_hold)
            except RuntimeError:
                return  # the loop is closed
            self.restart_hold_seconds.observe(held)
            self.wal_restarts += not busy
            if held >= NOTABLE_LAG_S:
                self.slow_restart_holds.append((time.time() - held, held, int(not busy)))
        finally:
            self._set_checkpointer_idle(True)

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
