"""Where the SQLite history's group commits run: on the event loop or on a writer thread.

The store gathers one loop iteration's sends and decides when to hand them over
(:mod:`chat_server.store.sqlite_policy`); a :class:`CommitPlace` takes each hand-over
and runs the :class:`SqliteWriter`'s transaction on it, giving back each batch's
:class:`BatchOutcome` for the store to apply:

:class:`LoopCommits`
    On the event loop, right away. With ``synchronous=normal`` a commit is a WAL
    append without fsync (tens of microseconds for a batch), cheaper than waking a
    thread and switching the GIL twice; the loop never waits on a lock (the write
    connection's busy timeout is 0: a database locked by another process fails the
    batch with ``unavailable``).
:class:`ThreadCommits`
    On a writer thread that owns the write connection; whatever queued up while the
    previous transaction committed goes into the next one. Required with
    ``synchronous=full`` (an fsync per commit never runs on the loop).

Every commit runs holding the :class:`CommitHold`, which the checkpointer takes for a
few milliseconds to restart the WAL. The writer thread waits for it. The loop never
does: a hand-over that finds it taken is refused, its sends stay with the store, and
**held commits resume when the checkpointer lets go** (the hold schedules the store's
resume on the loop).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final, NamedTuple, Protocol

from chat_server.errors import StoreError, StoreUnavailable
from chat_server.messages import Message
from chat_server.store.sqlite_schema import INSERT_MESSAGE, INSERT_ROOM, TRIM_ROOM, open_writer
from chat_server.tail import NOTABLE_LAG_S, PlainHistogram
from chatlab.supervision import STOP, supervisor

__all__ = [
    "BatchOutcome",
    "CommitHold",
    "CommitPlace",
    "LoopCommits",
    "SqliteWriter",
    "ThreadCommits",
    "WriterThreadHook",
]

logger = logging.getLogger("chat_server.store")

# How often an idle writer checks that its event loop still exists, so that a loop
# closed without close() does not keep this non-daemon thread (and the process) alive.
_IDLE_CHECK_S: Final = 1.0

Item = tuple[Message, Any]


class BatchOutcome(NamedTuple):
    """One transaction's outcome: each message's seq and each room's last seq, given then
    and only then when it committed (``error`` None)."""

    seqs: list[int]
    room_seqs: dict[str, int]
    error: StoreError | None


#: a batch and its outcome, for the store to apply on the loop, in commit order
Applied = tuple[list[Item], BatchOutcome]
#: where a writer thread's outcomes go (called on the loop, in commit order)
Apply = Callable[[list[Item], BatchOutcome], None]


class SqliteWriter:
    """The write side: opens the write connection and numbers and writes each batch in one
    transaction. Used by one thread at a time (the loop's, or the writer thread's).

    ``numbered`` is every room's last seq this writer committed, loaded when the connection
    opens: what the next batch is numbered from. It is the writer's (read and raised only
    by the one thread that commits) and runs ahead of what the store has *applied* while
    a writer thread's outcomes are on their way to the loop: the store's
    ``SqliteHistoryStore.last_seq`` is that other fact, kept on the loop (see the store's
    docstring for why there are two).
    """

    def __init__(
        self,
        *,
        path: Path,
        synchronous: str,
        busy_timeout_s: float,
        history_max: int,
        commit_seconds: PlainHistogram,
        slow_commits: collections.deque[tuple[float, float, int]],
    ) -> None:
        self._path = path
        self._synchronous = synchronous
        self._busy_timeout_s = busy_timeout_s
        self._history_max = history_max
        self._commit_seconds = commit_seconds
        self._slow_commits = slow_commits
        #: room -> the last seq committed by this writer (what the next batch follows)
        self.numbered: dict[str, int] = {}

    def open(self, busy_timeout_s: float | None = None) -> sqlite3.Connection:
        """Open the write connection (see :func:`open_writer`) and load ``numbered``.

        ``busy_timeout_s`` replaces the configured busy timeout once the file is open.
        Raises ``StoreError`` naming the path when the file cannot be opened.
        """
        try:
            conn, self.numbered = open_writer(
                self._path,
                synchronous=self._synchronous,
                open_timeout_s=self._busy_timeout_s,
                busy_timeout_s=self._busy_timeout_s if busy_timeout_s is None else busy_timeout_s,
            )
        except StoreError:
            raise
        except Exception as exc:
            logger.exception("history store: opening %s failed", self._path)
            raise StoreError(f"cannot open history store {str(self._path)!r}: {exc}") from exc
        return conn

    def commit(self, conn: sqlite3.Connection, batch: list[Item]) -> BatchOutcome:
        """Number and write ``batch`` in one transaction.

        On failure nothing was written, ``numbered`` is unchanged and the outcome's seqs
        are empty.
        """
        cache = self.numbered
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
            new_rooms = [(room, seq) for room, seq in room_seqs.items() if room not in cache]
            if new_rooms:
                conn.executemany(INSERT_ROOM, new_rooms)
            if self._history_max:
                keep = self._history_max
                trims = [(room, seq - keep) for room, seq in room_seqs.items() if seq > keep]
                conn.executemany(TRIM_ROOM, trims)
            conn.execute("COMMIT")
        except Exception as exc:
            error = _batch_error(exc)
            if isinstance(exc, sqlite3.Error):
                logger.warning("history store: batch of %d messages failed: %s", len(batch), exc)
            else:
                logger.exception("history store: batch of %d messages failed", len(batch))
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error as rollback_exc:
                    logger.error("history store: rollback failed: %s", rollback_exc)
            return BatchOutcome([], {}, error)
        took = time.perf_counter() - started
        self._commit_seconds.observe(took)
        if took >= NOTABLE_LAG_S:
            self._slow_commits.append((time.time(), took, len(batch)))
        cache.update(room_seqs)
        return BatchOutcome(seqs, room_seqs, None)


def _batch_error(exc: Exception) -> StoreError:
    """Map a failed write to the contract: locked or I/O trouble is ``unavailable``."""
    if isinstance(exc, sqlite3.OperationalError):
        return StoreUnavailable(f"history store unavailable: {exc}")
    return StoreError(f"history store failed: {exc}")


class CommitHold:
    """The commits' turn at the WAL, which the checkpointer takes to restart it.

    Every commit runs holding it: on the writer thread it waits its turn
    (:meth:`wait_turn`), on the event loop it only tries (:meth:`try_take`). The
    checkpointer holds it with :meth:`held_by_checkpointer`, and when it lets go the
    hold calls ``resume`` on the loop (given to :meth:`resume_on`, by the loop's
    commits), so that sends a loop commit could not take resume then.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: where and what to call when the checkpointer lets go (the loop's commits only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resume: Callable[[], None] | None = None

    def resume_on(self, loop: asyncio.AbstractEventLoop, resume: Callable[[], None]) -> None:
        """Have ``resume`` called on ``loop`` each time the checkpointer lets go."""
        self._loop, self._resume = loop, resume

    def try_take(self) -> bool:
        """Event loop: take the hold if it is free, without waiting; True when taken."""
        return self._lock.acquire(blocking=False)

    def give_back(self) -> None:
        """Let go of a hold :meth:`try_take` took."""
        self._lock.release()

    def wait_turn(self) -> threading.Lock:
        """Writer thread: the hold as a context manager that waits until it is free."""
        return self._lock

    @contextmanager
    def held_by_checkpointer(self) -> Iterator[None]:
        """Checkpointer thread: no commit runs inside the block; afterwards the held
        commits resume (see :meth:`resume_on`)."""
        try:
            with self._lock:
                yield
        finally:
            if self._resume is not None:
                assert self._loop is not None
                with suppress(RuntimeError):  # a closed loop: nothing waits on it any more
                    self._loop.call_soon_threadsafe(self._resume)


class CommitPlace(Protocol):
    """Where the store's transactions run. Every method is called on the event loop."""

    #: hand-overs waiting for their commit (always empty where commits run at once)
    queue: collections.deque[Item]

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open the write connection; raise ``StoreError`` naming the path if it cannot."""

    def hand_over(self, items: list[Item]) -> list[Applied] | None:
        """Commit ``items`` now and return each batch's outcome (on the loop), or queue them
        and return none (a writer thread: its outcomes go to ``apply`` on the loop, in
        order). None: the checkpointer holds the commits, nothing was taken, and the
        store's resume is called on the loop when it lets go."""

    def stop_soon(self) -> None:
        """Commit what was handed over, then stop; returns at once (also when cancelled)."""

    async def stop(self) -> None:
        """Commit what was handed over, then close the write connection; idempotent."""


class LoopCommits:
    """Commits on the event loop, in ``batch_max`` slices, as soon as they are handed over;
    their outcomes are returned."""

    def __init__(
        self,
        *,
        writer: SqliteWriter,
        hold: CommitHold,
        resume: Callable[[], None],
        batch_max: int,
    ) -> None:
        """``resume`` is called on the loop when the checkpointer lets go of ``hold``."""
        self.queue: collections.deque[Item] = collections.deque()  # nothing waits here
        self._writer = writer
        self._hold = hold
        self._resume = resume
        self._batch_max = batch_max
        self._conn: sqlite3.Connection | None = None

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open the write connection with a busy timeout of 0: the loop never waits on a lock."""
        self._conn = self._writer.open(0.0)
        self._hold.resume_on(loop, self._resume)

    def hand_over(self, items: list[Item]) -> list[Applied] | None:
        """Commit ``items`` now and return each slice's outcome, unless the checkpointer
        holds the commits (then None)."""
        if not self._hold.try_take():
            return None
        done: list[Applied] = []
        try:
            conn = self._conn
            commit = self._writer.commit
            size = self._batch_max
            for start in range(0, len(items), size):
                batch = items[start : start + size]
                if conn is None:
                    closed = StoreUnavailable("history store closed")
                    done.append((batch, BatchOutcome([], {}, closed)))
                else:
                    done.append((batch, commit(conn, batch)))
        finally:
            self._hold.give_back()
        return done

    def stop_soon(self) -> None:
        """Nothing waits: every hand-over was committed when it came."""

    async def stop(self) -> None:
        """Close the write connection; later hand-overs fail with ``unavailable``."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


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


class ThreadCommits:
    """Commits on a writer thread that owns the write connection.

    Hand-overs queue up (``queue``, guarded by a condition the loop and the writer
    share); the writer takes up to ``batch_max`` at a time, commits them as one
    transaction holding the :class:`CommitHold` (waiting while the checkpointer holds
    it) and hands each batch's outcome to ``apply`` on the loop with
    ``call_soon_threadsafe``. ``hook`` runs
    on the writer thread at its start, between batches when it asks to, and at its end.
    """

    def __init__(
        self,
        *,
        writer: SqliteWriter,
        apply: Apply,
        hold: CommitHold,
        batch_max: int,
        hook: WriterThreadHook | None = None,
    ) -> None:
        """``apply`` gets each batch's outcome on the loop, in commit order."""
        self._writer = writer
        self._apply = apply
        self._hold = hold
        self._batch_max = batch_max
        self._hook: WriterThreadHook = _NO_HOOK if hook is None else hook

        # Shared between the loop and the writer, guarded by _cond.
        self._cond = threading.Condition(threading.Lock())
        self.queue: collections.deque[Item] = collections.deque()
        self._stopping = False

        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the writer thread and wait until it opened the write connection."""
        self._loop = loop
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        # no ack can come without the writer: the process stops if it fails
        self._thread = supervisor().thread(self._run, "chat-history-writer", STOP, args=(ready,))
        self._thread.start()
        await asyncio.wrap_future(ready)

    def hand_over(self, items: list[Item]) -> list[Applied] | None:
        """Queue ``items`` for the writer; always taken (the writer waits out a hold), their
        outcomes go to ``apply`` later."""
        with self._cond:
            self.queue.extend(items)
            self._cond.notify()
        return []

    def stop_soon(self) -> None:
        """Tell the writer to exit once the queue is empty."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    async def stop(self) -> None:
        """Let the writer commit what is queued and exit; idempotent."""
        self.stop_soon()
        if self._thread is not None:
            await asyncio.wrap_future(self._stopped)
            self._thread.join()
            self._thread = None

    def _wake(self) -> None:
        """Make an idle writer look at its hook's ``pending`` (any thread)."""
        with self._cond:
            self._cond.notify()

    def _run(self, ready: concurrent.futures.Future[None]) -> None:
        """Writer thread: open the database, then commit batches until told to stop."""
        hook = self._hook
        hook.thread_started(self._wake)
        try:
            try:
                conn = self._writer.open(None)
            except Exception as exc:  # a StoreError naming the path (see OpenConnection)
                ready.set_exception(exc)
                return
            try:
                ready.set_result(None)
                self._write_batches(conn)
            finally:
                conn.close()
        except Exception:
            logger.exception("history store: writer thread failed")
            raise  # to the supervisor, which stops the process (STOP)
        finally:
            hook.thread_stopped()
            self._stopped.set_result(None)

    def _write_batches(self, conn: sqlite3.Connection) -> None:
        """Take up to ``batch_max`` queued messages at a time and commit them as one.

        Between batches, and when woken idle for it, runs the hook's checkpoint.
        """
        loop = self._loop
        assert loop is not None
        queue = self.queue
        hook = self._hook
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
            with self._hold.wait_turn():
                outcome = self._writer.commit(conn, batch)
            try:
                loop.call_soon_threadsafe(self._apply, batch, outcome)
            except RuntimeError:
                logger.error(
                    "history store: event loop closed; a batch of %d went unreported (%s)",
                    len(batch),
                    "committed" if outcome.error is None else "failed",
                )
                return
