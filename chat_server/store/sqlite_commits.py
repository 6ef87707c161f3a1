"""Where the SQLite history's group commits run: on the event loop or on a writer thread.

The store gathers one loop iteration's sends and decides when to hand them over
(:mod:`chat_server.store.sqlite_policy`); a :class:`CommitPlace` takes each hand-over
and runs the store's transaction on it:

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Final, Protocol

from chat_server.errors import StoreError, StoreUnavailable
from chat_server.messages import Message
from chatlab.supervision import STOP, supervisor

__all__ = [
    "CommitHold",
    "CommitPlace",
    "LoopCommits",
    "ThreadCommits",
    "WriterThreadHook",
]

logger = logging.getLogger("chat_server.store")

# How often an idle writer checks that its event loop still exists, so that a loop
# closed without close() does not keep this non-daemon thread (and the process) alive.
_IDLE_CHECK_S: Final = 1.0

Item = tuple[Message, Any]
#: one transaction's outcome: each message's seq, each room's last seq, and the error
#: (None: committed; then and only then are the seqs given)
Outcome = tuple[list[int], dict[str, int], StoreError | None]
#: the store's transaction: write one batch on the write connection
Transaction = Callable[[sqlite3.Connection, list[Item]], Outcome]
#: the store's report of one batch, on the loop, in commit order
Report = Callable[[list[Item], list[int], dict[str, int], StoreError | None], None]
#: opens the write connection (and loads the store's seq cache); the argument replaces
#: the configured busy timeout (s) when not None; raises ``StoreError``
OpenConnection = Callable[[float | None], sqlite3.Connection]


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

    def hand_over(self, items: list[Item]) -> bool:
        """Commit ``items`` (or queue them for it); each batch's outcome is reported on the
        loop, in order. False: the checkpointer holds the commits, nothing was taken, and
        the store's resume is called on the loop when it lets go."""

    def stop_soon(self) -> None:
        """Commit what was handed over, then stop; returns at once (also when cancelled)."""

    async def stop(self) -> None:
        """Commit what was handed over, then close the write connection; idempotent."""


class LoopCommits:
    """Commits on the event loop, in ``batch_max`` slices, as soon as they are handed over."""

    def __init__(
        self,
        *,
        open_connection: OpenConnection,
        transaction: Transaction,
        report: Report,
        hold: CommitHold,
        resume: Callable[[], None],
        batch_max: int,
    ) -> None:
        """``resume`` is called on the loop when the checkpointer lets go of ``hold``."""
        self.queue: collections.deque[Item] = collections.deque()  # nothing waits here
        self._open_connection = open_connection
        self._transaction = transaction
        self._report = report
        self._hold = hold
        self._resume = resume
        self._batch_max = batch_max
        self._conn: sqlite3.Connection | None = None

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open the write connection with a busy timeout of 0: the loop never waits on a lock."""
        self._conn = self._open_connection(0.0)
        self._hold.resume_on(loop, self._resume)

    def hand_over(self, items: list[Item]) -> bool:
        """Commit ``items`` now, unless the checkpointer holds the commits (then False)."""
        if not self._hold.try_take():
            return False
        try:
            conn = self._conn
            size = self._batch_max
            for start in range(0, len(items), size):
                batch = items[start : start + size]
                if conn is None:
                    self._report(batch, [], {}, StoreUnavailable("history store closed"))
                    continue
                seqs, room_seqs, error = self._transaction(conn, batch)
                self._report(batch, seqs, room_seqs, error)
        finally:
            self._hold.give_back()
        return True

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
    it) and reports each batch on the loop with ``call_soon_threadsafe``. ``hook`` runs
    on the writer thread at its start, between batches when it asks to, and at its end.
    """

    def __init__(
        self,
        *,
        open_connection: OpenConnection,
        transaction: Transaction,
        report: Report,
        hold: CommitHold,
        batch_max: int,
        hook: WriterThreadHook | None = None,
    ) -> None:
        self._open_connection = open_connection
        self._transaction = transaction
        self._report = report
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

    def hand_over(self, items: list[Item]) -> bool:
        """Queue ``items`` for the writer; always taken (the writer waits out a hold)."""
        with self._cond:
            self.queue.extend(items)
            self._cond.notify()
        return True

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
                conn = self._open_connection(None)
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
                seqs, room_seqs, error = self._transaction(conn, batch)
            try:
                loop.call_soon_threadsafe(self._report, batch, seqs, room_seqs, error)
            except RuntimeError:
                logger.error(
                    "history store: event loop closed; a batch of %d went unreported (%s)",
                    len(batch),
                    "committed" if error is None else "failed",
                )
                return
