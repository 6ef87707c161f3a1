"""The SQLite history's WAL upkeep: checkpoints and restarts on a thread of their own.

Checkpoints never run inside a commit (``wal_autocheckpoint`` is off): a
:class:`Checkpointer` thread with its own connection runs ``PRAGMA
wal_checkpoint(PASSIVE)`` whenever the WAL file reaches ``checkpoint_pages``
pages; PASSIVE never waits for readers or writers, so no commit waits on the
checkpoint's fsync. The checkpointer runs as ``SCHED_IDLE`` (only in the loop's idle
time on its core) unless one runs too long (see :meth:`Checkpointer._set_idle`).
Beside a commit every millisecond a PASSIVE checkpoint never ends with nothing left,
and SQLite starts the WAL again only after one did: so once the WAL holds
``WAL_RESTART_CHECKPOINTS`` checkpoints' worth, the checkpointer holds the commits for
a few milliseconds (the commits' :class:`~chat_server.store.sqlite_commits.CommitHold`:
commits on the loop wait in the store's list, the loop goes on, and they resume when the
checkpointer lets go), copies the last frames and restarts the WAL itself (see
:meth:`Checkpointer._restart_wal`). The WAL file therefore stays near what comes in
between two restarts, and a file grown past ``WAL_FILE_LIMIT_RESTARTS`` restarts' worth
(a reader held checkpoints back) is cut back on the checkpointer's thread, never on the
loop. SQLite syncs the new WAL header at every restart (so that a power loss cannot mix
old and new frames); for these restarts that happens in the checkpointer's restarting
write, not in a commit. A WAL that restarts by itself (a lull let a checkpoint finish)
still has the commit that restarts it sync the header (a fraction of a millisecond:
``docs/decisions/0004-checkpoints-off-the-commit.md``). A reader that holds an old
snapshot open (an outside tool in a long transaction) can keep a checkpoint from
finishing; the WAL then grows, and once what is not checkpointed
passes ``wal_max_bytes`` the checkpointer tells the store (``on_blocked``), which
refuses new submissions with ``unavailable`` until a checkpoint catches up, so what it
holds unchecked stays bounded.

The checkpointer never takes part in a commit: the per-message path meets it only in
the store's blocked flag and in the commits' hold, which it takes only while a restart
copies the last frames.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from chat_server.store.sqlite_commits import CommitHold
from chat_server.store.sqlite_schema import SCHEMA_VERSION
from chat_server.tail import COMMIT_BUCKETS_S, NOTABLE_KEPT, NOTABLE_LAG_S, PlainHistogram
from chatlab.supervision import RESTART, supervisor

__all__ = [
    "CATCH_UP_AFTER_S",
    "CHECKPOINT_POLL_S",
    "RESTART_PASSES_MAX",
    "SHORT_PASS_S",
    "WAL_FILE_LIMIT_RESTARTS",
    "WAL_RESTART_CHECKPOINTS",
    "Checkpointer",
]

logger = logging.getLogger("chat_server.store")

#: how often the checkpointer looks at the WAL file's size
CHECKPOINT_POLL_S: Final = 0.25
#: a checkpoint still running after this long (s) had no idle time on its core: the loop
#: puts the checkpointer at normal priority until it ends. Long enough that a busy core's
#: checkpoints finish in its idle time instead of taking the core from the loop mid-load
#: (0.5 s did; docs/decisions/0005-checkpointer-priority.md)
CATCH_UP_AFTER_S: Final = 2.0
#: once the WAL holds this many checkpoints' worth of frames (``checkpoint_pages`` each)
#: since it last restarted, the checkpointer has it restart (see
#: :meth:`Checkpointer._restart_wal`). Each restart holds the commits for a few ms: a
#: rarer restart means fewer holds for a larger WAL file
#: (docs/decisions/0006-wal-restart.md)
WAL_RESTART_CHECKPOINTS: Final = 16
#: a WAL file bigger than this many restarts' worth is cut back to it when the WAL restarts
WAL_FILE_LIMIT_RESTARTS: Final = 4
#: before it holds the commits, the checkpointer copies what came in meanwhile without
#: holding them, until one such pass takes less than this (s), at most
#: ``RESTART_PASSES_MAX`` times: what the held pass copies is what the last one let in
SHORT_PASS_S: Final = 0.005
RESTART_PASSES_MAX: Final = 3


class Checkpointer:
    """The history store's checkpointer thread and the loop's watch over its priority.

    :meth:`start`, :meth:`stop` and :meth:`counts` are called from the event loop; the
    counters and the flags are written by the checkpointer thread (``catch_ups`` and,
    when a checkpoint is starved, ``idle`` by the loop) and read by the loop without a
    lock. ``on_blocked`` is called on the checkpointer thread each time the WAL becomes
    blocked or free again.
    """

    def __init__(
        self,
        *,
        path: Path,
        synchronous: str,
        checkpoint_pages: int,
        idle_policy: bool,
        wal_max_bytes: int,
        commit_hold: CommitHold,
        on_blocked: Callable[[bool], None],
    ) -> None:
        """Configure the checkpointer; no thread runs until :meth:`start`.

        ``synchronous`` is the ``PRAGMA synchronous`` value; ``idle_policy`` whether the
        thread runs as ``SCHED_IDLE`` at all (``CHAT_DB_CHECKPOINTER``); ``commit_hold``
        is what every commit holds, taken here while a restart copies the last frames.
        """
        self._path = path
        self._synchronous = synchronous
        self._checkpoint_pages = checkpoint_pages
        self._idle_policy = idle_policy
        self._wal_max_bytes = wal_max_bytes
        self._commit_hold = commit_hold
        self._on_blocked = on_blocked

        # Owned by the checkpointer thread (read by the loop without a lock).
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: what no checkpoint could copy back is past ``wal_max_bytes``
        self.wal_blocked = False
        self.checkpoints = 0
        #: the checkpointer's thread id (Linux), and whether it runs as SCHED_IDLE
        self.tid: int | None = None
        self.idle = False
        #: times a checkpoint ran past CATCH_UP_AFTER_S and was put at normal priority
        self.catch_ups = 0
        #: when the running checkpoint began (time.monotonic), None between checkpoints
        self._checkpoint_began: float | None = None
        #: how long each of the checkpointer's holds of the commits lasted (s), and how
        #: many of those holds restarted the WAL
        self.restart_hold_seconds = PlainHistogram(COMMIT_BUCKETS_S)
        self.wal_restarts = 0
        #: the WAL file's size at the checkpointer's last look, and the largest seen
        self.wal_file_bytes = 0
        self.wal_file_bytes_max = 0
        #: ``(unix time, seconds, frames copied)`` of the last checkpoints of NOTABLE_LAG_S
        #: or more
        self.slow_checkpoints: collections.deque[tuple[float, float, int]] = collections.deque(
            maxlen=NOTABLE_KEPT
        )
        #: ``(unix time, seconds, 1 if the WAL restarted)`` of the last restart holds that long
        self.slow_restart_holds: collections.deque[tuple[float, float, int]] = collections.deque(
            maxlen=NOTABLE_KEPT
        )

        # Owned by the event loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the loop's look at the checkpointer, every CHECKPOINT_POLL_S
        self._watch_timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the thread, and the loop's watch over a starved checkpoint."""
        self._loop = loop
        # a checkpointer that failed starts again (the WAL only grows without one)
        self._thread = supervisor().thread(self._run, "chat-history-checkpointer", RESTART)
        self._thread.start()
        self._watch_timer = loop.call_later(CHECKPOINT_POLL_S, self._watch)

    async def stop(self) -> None:
        """Stop the watch, then let the thread run its last checkpoint and end; idempotent."""
        if self._watch_timer is not None:
            self._watch_timer.cancel()
            self._watch_timer = None
        if self._thread is not None:
            self._stop.set()
            thread, self._thread = self._thread, None
            await asyncio.to_thread(thread.join)

    def counts(self) -> dict[str, Any]:
        """The checkpoints, the times one left SCHED_IDLE to catch up, whether it runs
        as SCHED_IDLE, the restart holds (how many, how long) and WAL restarts, and the
        WAL file's size now and at most, for /stats."""
        holds = self.restart_hold_seconds
        return {
            "checkpoints": self.checkpoints,
            "catch_ups": self.catch_ups,
            "idle": self.idle,
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

    def _run(self) -> None:
        """Checkpointer thread: PASSIVE checkpoints whenever the WAL file is big enough,
        and a restart of the WAL whenever it holds ``WAL_RESTART_CHECKPOINTS``
        checkpoints' worth.

        Also decides whether the WAL is blocked: what no checkpoint could copy back
        (a reader holds an older snapshot) past ``wal_max_bytes``. Ends on
        :meth:`stop` (or when the loop is gone) with a last PASSIVE checkpoint.
        """
        loop = self._loop
        assert loop is not None
        wal = self._path.with_name(self._path.name + "-wal")
        self.tid = threading.get_native_id()
        self._set_idle(True)
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
            while not self._stop.wait(CHECKPOINT_POLL_S) and not loop.is_closed():
                try:
                    size = wal.stat().st_size
                except FileNotFoundError:
                    continue
                self.wal_file_bytes = size
                self.wal_file_bytes_max = max(self.wal_file_bytes_max, size)
                if size >= threshold or self.wal_blocked:
                    frames = self._checkpoint(conn, page_size)
                    if frames >= restart_frames:
                        self._restart_wal(conn, page_size)
            self._checkpoint(conn, page_size)
        finally:
            conn.close()

    def _set_idle(self, idle: bool) -> bool:
        """Run the checkpointer thread as ``SCHED_IDLE`` (only when its core has nothing
        else to run) or at normal priority; from any thread. Where Linux's policies are
        missing, it stays normal. Returns whether its policy changed.

        At normal priority the checkpointer took its share of the loop's core in the
        middle of a burst, and the loop waited as long for its core. As ``SCHED_IDLE`` it
        runs in the loop's idle time, and a loop that wakes takes the core back at once.
        A core with no idle time (the server past its capacity) starves it. So the loop
        (:meth:`_watch`) puts a checkpoint that runs past ``CATCH_UP_AFTER_S`` at normal
        priority, and the checkpointer goes back to ``SCHED_IDLE`` when it ends
        (``docs/decisions/0005-checkpointer-priority.md``).
        """
        tid = self.tid
        if idle and not self._idle_policy:
            return False  # CHAT_DB_CHECKPOINTER=normal
        if idle == self.idle or tid is None or not hasattr(os, "SCHED_IDLE"):
            return False
        policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except OSError as exc:
            logger.warning("history store: cannot set the checkpointer's policy: %s", exc)
            return False
        self.idle = idle
        return True

    def _watch(self) -> None:
        """Event loop, every ``CHECKPOINT_POLL_S``: a checkpoint running past
        ``CATCH_UP_AFTER_S`` is starved (its core has no idle time), so it gets normal
        priority until it ends."""
        began = self._checkpoint_began
        if (
            began is not None
            and time.monotonic() - began > CATCH_UP_AFTER_S
            and self._set_idle(False)
        ):
            self.catch_ups += 1
        assert self._loop is not None
        self._watch_timer = self._loop.call_later(CHECKPOINT_POLL_S, self._watch)

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
            self._set_idle(True)
        left_bytes = max(0, wal_frames - copied) * page_size
        blocked = left_bytes > self._wal_max_bytes
        if blocked != self.wal_blocked:
            self.wal_blocked = blocked
            self._on_blocked(blocked)
            if blocked:
                logger.warning(
                    "history store: %d MiB of WAL not checkpointed (a reader holds an old"
                    " snapshot): refusing sends until a checkpoint catches up",
                    left_bytes >> 20,
                )
            else:
                logger.warning("history store: checkpoint caught up; accepting sends again")
        return wal_frames if wal_frames == copied else 0

    def _restart_wal(self, conn: sqlite3.Connection, page_size: int) -> None:
        """Checkpointer: make the WAL start again from its beginning, holding the
        commits for a few milliseconds.

        SQLite restarts the WAL only when a write begins after a checkpoint copied every
        frame back. Beside a commit every millisecond a PASSIVE checkpoint never ends
        with nothing left, so under steady load the WAL never restarted and its file grew
        by every commit (``docs/decisions/0006-wal-restart.md``). So: PASSIVE
        passes without holding anything (still in the loop's idle time), each copying
        what came in during the one before, until one is short (``SHORT_PASS_S``); then,
        at normal priority and holding the commits (``commit_hold``: a commit on the loop
        that finds it held waits in the store's list, the loop itself goes on, and it
        resumes when this lets go), a ``RESTART`` checkpoint copies the few frames the
        last pass let in, and a one-page write (``PRAGMA user_version``, unchanged)
        restarts the WAL here. That write also syncs the new WAL header (otherwise the
        loop's first commit after the restart would), and cuts a file grown past
        ``WAL_FILE_LIMIT_RESTARTS`` restarts' worth back to that. An outside reader or
        writer in the way makes it give up until the next time.
        """
        try:
            for _ in range(RESTART_PASSES_MAX):
                started = time.perf_counter()
                if not self._checkpoint(conn, page_size, idle=False):
                    return  # a reader holds frames back: no restart now
                if time.perf_counter() - started < SHORT_PASS_S:
                    break
            # what follows holds the commits: it must not wait for the loop's idle time
            self._set_idle(False)
            with self._commit_hold.held_by_checkpointer():
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
            self.restart_hold_seconds.observe(held)
            self.wal_restarts += not busy
            if held >= NOTABLE_LAG_S:
                self.slow_restart_holds.append((time.time() - held, held, int(not busy)))
        finally:
            self._set_idle(True)
