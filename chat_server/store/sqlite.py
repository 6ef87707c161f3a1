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
outcome is reported on the event loop, in commit order, to the callback given to
:meth:`~chat_server.store.base.HistoryStore.report_to` (the service's ``committed``).

Checkpoints never run inside a commit (``wal_autocheckpoint`` is off): a
checkpointer thread with its own connection checkpoints the WAL and restarts it
(:class:`~chat_server.store.sqlite_wal.Checkpointer`, where the why is; the figures are
in ``docs/decisions/``). To restart it, it holds the commits (``_commit_lock``) for a few
milliseconds: commits on the loop wait in a list; the loop goes on. A reader that holds an old
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
from chat_server.store.sqlite_wal import Checkpointer
from chat_server.tail import COMMIT_BUCKETS_S, NOTABLE_KEPT, NOTABLE_LAG_S, PlainHistogram

__all__ = ["SCHEMA_VERSION", "SqliteHistoryStore", "StoreStats", "WriterThreadHook"]

logger = logging.getLogger("chat_server.store")

# How often an idle writer checks that its event loop still exists, so that a loop
# closed without close() does not keep this non-daemon thread (and the process) alive.
_IDLE_CHECK_S: Final = 1.0
#: a hand-over of this many sends is committed at once, whatever the commit interval
COMMIT_NOW_SIZE: Final = 32
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
        on_batch: BatchCallback | None = None,
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
        self._commit_interval_s = commit_interval_ms / 1000
        self.commit_seconds = (
            PlainHistogram(COMMIT_BUCKETS_S) if commit_seconds is None else commit_seconds
        )
        #: ``(unix time, seconds, messages)`` of the last commits of NOTABLE_LAG_S or more
        self.slow_commits: collections.deque[tuple[float, float, int]] = collections.deque(
            maxlen=NOTABLE_KEPT
        )

        # Shared between the loop and the writer, guarded by _cond.
        self._cond = threading.Condition(threading.Lock())
        #: held by whoever writes: each commit (on the loop it is only tried: a commit
        #: that cannot have it waits in _pending), and the checkpointer while it makes the
        #: WAL restart (see :meth:`Checkpointer._restart_wal`)
        self._commit_lock = threading.Lock()
        self._queue: collections.deque[_Item] = collections.deque()
        self._stopping = False

        # Owned by the writer thread.
        self._writer_seq: dict[str, int] = {}
        self._writer: threading.Thread | None = None
        self._writer_stopped: concurrent.futures.Future[None] = concurrent.futures.Future()

        # The read side: its own thread and connection (see SqliteReader).
        self._reads = SqliteReader(self._path, self._busy_timeout_s)

        # The WAL's checkpoints and restarts: its own thread (see Checkpointer).
        self._checkpointer = Checkpointer(
            path=self._path,
            synchronous=self._synchronous,
            checkpoint_pages=checkpoint_pages,
            idle_policy=checkpointer_idle,
            wal_max_bytes=wal_max_bytes,
            commit_lock=self._commit_lock,
            on_blocked=self._set_wal_blocked,
            after_hold=self._after_hold,
        )
        #: written by the checkpointer thread (through _set_wal_blocked), read by submit
        #: without a lock: what no checkpoint could copy back is past wal_max_bytes
        self._wal_blocked = False

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
            self._checkpointer.start(self._loop)
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
        await self._checkpointer.stop()
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
        iteration of a few messages each took a large share of the server's core; at
        light load messages arrive further apart than the interval and are committed at
        the end of their iteration as before. A wait under half the interval is not
        worth a timer (uvloop's have 1 ms steps), and a list of ``COMMIT_NOW_SIZE``
        sends is committed at once: near saturation the iterations are long and their
        lists big, and holding them cost capacity
        (``docs/decisions/0002-commit-interval.md``).
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
        checkpointer = self._checkpointer
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
        checkpointer = self._checkpointer
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

    # ---- the checkpointer (on its own thread, see Checkpointer) ---------------

    def _set_wal_blocked(self, blocked: bool) -> None:
        """Checkpointer thread: refuse (or accept again) submissions while the WAL is
        blocked past ``wal_max_bytes``."""
        self._wal_blocked = blocked

    @property
    def checkpoints(self) -> int:
        """The checkpoints run so far."""
        return self._checkpointer.checkpoints

    @property
    def checkpointer_tid(self) -> int | None:
        """The checkpointer's thread id (Linux), None until its thread runs."""
        return self._checkpointer.tid

    @property
    def checkpointer_idle(self) -> bool:
        """Whether the checkpointer runs as ``SCHED_IDLE`` now."""
        return self._checkpointer.idle

    @property
    def checkpoint_catch_ups(self) -> int:
        """Times a checkpoint ran past ``CATCH_UP_AFTER_S`` and was put at normal priority."""
        return self._checkpointer.catch_ups

    @property
    def restart_hold_seconds(self) -> PlainHistogram:
        """How long each of the checkpointer's holds of the commits lasted (s)."""
        return self._checkpointer.restart_hold_seconds

    @property
    def wal_restarts(self) -> int:
        """How many of the checkpointer's holds restarted the WAL."""
        return self._checkpointer.wal_restarts

    @property
    def wal_file_bytes(self) -> int:
        """The WAL file's size at the checkpointer's last look."""
        return self._checkpointer.wal_file_bytes

    @property
    def wal_file_bytes_max(self) -> int:
        """The largest WAL file the checkpointer saw."""
        return self._checkpointer.wal_file_bytes_max

    @property
    def slow_checkpoints(self) -> collections.deque[tuple[float, float, int]]:
        """``(unix time, seconds, frames copied)`` of the last slow checkpoints."""
        return self._checkpointer.slow_checkpoints

    @property
    def slow_restart_holds(self) -> collections.deque[tuple[float, float, int]]:
        """``(unix time, seconds, 1 if the WAL restarted)`` of the last slow restart holds."""
        return self._checkpointer.slow_restart_holds

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
