"""``PROFILE=cprofile``: the server profiles itself while it serves, one window at a time.

:class:`ServerProfiler` writes ``<PROFILE_DIR>/<run>/<n>.prof`` (``n`` = 1, 2, 3, ...)
every ``PROFILE_INTERVAL_S``, at once on SIGUSR1, and a last one at a clean shutdown.
Each file is ``pstats`` data (``pstats.Stats(path)``, snakeviz, gprof2dot) covering
only the time since the previous one, and appears whole (written aside, then
renamed). ``<run>`` is ``PROFILE_RUN``, or ``<YYYYmmdd-HHMMSS>-<pid>`` when that is
empty; a worker of ``WORKERS`` > 1 appends ``-w<index>-<pid>`` (:func:`run_name`).

On Python 3.11 a ``cProfile.Profile`` sees only the thread that enabled it, so the
event loop thread and the SQLite history writer thread each run their own, and
each snapshot merges both. The history store's reader thread and executor threads
(JWKS refresh, snapshot writing) are not profiled.

Each thread swaps its own profiler because ``Profile.disable()`` (and
``create_stats()``, which ``pstats.Stats(profiler)`` calls) removes the profile
function of the *calling* thread, whichever profiler installed it: a profiler is
disabled only by the thread that enabled it, and its stats are read once it is off
(:class:`_Stopped`), never through ``create_stats``. The writer thread swaps when it
sees :attr:`ThreadProfile.pending` between batches (waking for it when idle), which
takes microseconds; a snapshot waits for that asynchronously.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import cProfile
import logging
import os
import pstats
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Final

from chat_server.settings import SettingError, Settings
from chatlab.supervision import RESTART, supervisor

log = logging.getLogger("chat_server.profiling")

#: how long a snapshot waits for the writer thread to close its window; past it the
#: writer's window goes into the next snapshot instead
HANDOVER_TIMEOUT_S: Final = 2.0


def run_name(settings: Settings, worker_index: int | None, pid: int, started_s: float) -> str:
    """The run directory's name: ``PROFILE_RUN`` or ``<timestamp>-<pid>``; a worker's adds
    ``-w<index>-<pid>``, so every worker process (a restarted one too) has its own."""
    if worker_index is None:
        return settings.profile_run or f"{_timestamp(started_s)}-{pid}"
    return f"{settings.profile_run or _timestamp(started_s)}-w{worker_index}-{pid}"


def _timestamp(seconds: float) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(seconds))


class _Stopped:
    """A disabled profiler's stats for ``pstats``, read without disabling anything again."""

    def __init__(self, profiler: cProfile.Profile) -> None:
        profiler.snapshot_stats()
        self.stats = profiler.stats

    def create_stats(self) -> None:
        """Nothing: pstats calls it; the stats were read in ``__init__``."""


def write_snapshot(profilers: Sequence[cProfile.Profile], path: Path) -> int:
    """Merge disabled profilers into one pstats file at ``path`` (written aside, then
    renamed, so a reader never sees half of it); returns how many functions it holds."""
    merged = pstats.Stats()
    for profiler in profilers:
        stopped = _Stopped(profiler)
        if stopped.stats:  # pstats refuses an empty profile
            merged.add(stopped)
    partial = path.with_name(f".{path.name}.tmp")
    merged.dump_stats(partial)
    os.replace(partial, path)
    return len(merged.stats)


class ThreadProfile:
    """A profiler for one thread other than the loop's, swapped by that thread itself.

    The thread calls :meth:`thread_started`, :meth:`checkpoint` (when :attr:`pending`)
    and :meth:`thread_stopped` (the history store's ``WriterThreadHook``); the event
    loop calls :meth:`collect`, which closes the thread's current window and returns
    every window closed since the last call. None of the thread's calls raises.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        #: set by :meth:`collect`, read by the thread without the lock
        self.pending = False
        self._profiler: cProfile.Profile | None = None  # the thread's own
        self._lock = threading.Lock()
        # guarded by _lock
        self._closed: list[cProfile.Profile] = []
        self._handed_over: concurrent.futures.Future[None] | None = None
        self._wake: Callable[[], None] | None = None  # None while the thread does not run

    # ---- on the profiled thread ----------------------------------------------------

    def thread_started(self, wake: Callable[[], None]) -> None:
        """Start profiling the calling thread; ``wake`` makes it look at :attr:`pending`."""
        try:
            with self._lock:
                self._wake = wake
            self._profiler = cProfile.Profile()
            self._profiler.enable()
        except Exception:
            log.exception("profiling: cannot profile the %s thread", self.name)

    def checkpoint(self) -> None:
        """Close this thread's window and open the next one."""
        self._close_window(reopen=True)

    def thread_stopped(self) -> None:
        """Close this thread's last window."""
        self._close_window(reopen=False)

    def _close_window(self, reopen: bool) -> None:
        try:
            closed = self._profiler
            if closed is not None:
                closed.disable()
            with self._lock:
                if closed is not None:
                    self._closed.append(closed)
                self.pending = False
                waiter, self._handed_over = self._handed_over, None
                if not reopen:
                    self._wake = None
            if waiter is not None and waiter.set_running_or_notify_cancel():
                waiter.set_result(None)
            self._profiler = cProfile.Profile() if reopen else None
            if self._profiler is not None:
                self._profiler.enable()
        except Exception:
            self.pending = False  # not asked again each batch
            log.exception("profiling: the %s thread's window was not closed", self.name)

    # ---- on the event loop -----------------------------------------------------------

    async def collect(self, timeout_s: float = HANDOVER_TIMEOUT_S) -> list[cProfile.Profile]:
        """Ask the thread to close its window, wait up to ``timeout_s`` for it, and return
        the disabled profilers of every window closed so far (none if the thread never ran)."""
        with self._lock:
            wake = self._wake
            waiter = None
            if wake is not None:
                if self._handed_over is None or self._handed_over.done():
                    self._handed_over = concurrent.futures.Future()
                waiter = self._handed_over
                self.pending = True
        if wake is not None and waiter is not None:
            wake()
            try:
                await asyncio.wait_for(asyncio.wrap_future(waiter), timeout_s)
            except TimeoutError:
                log.warning(
                    "profiling: the %s thread did not close its window within %.1f s "
                    "(busy in a batch); it goes into the next snapshot",
                    self.name,
                    timeout_s,
                )
        with self._lock:
            closed, self._closed = self._closed, []
        return closed


class ServerProfiler:
    """``PROFILE=cprofile`` in one server process: the loop's profiler, the history
    writer's (:attr:`writer_hook`, given to the store) and the snapshots of both."""

    def __init__(self, run_dir: Path, interval_s: float) -> None:
        self.run_dir = run_dir
        self.interval_s = interval_s
        self.writer_hook = ThreadProfile("history writer")
        self.snapshots = 0
        self._profiler: cProfile.Profile | None = None
        self._wanted = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def create(cls, settings: Settings, worker_index: int | None = None) -> ServerProfiler:
        """Make this process' run directory; SettingError if it cannot be made or already
        holds snapshots (a ``PROFILE_RUN`` used before)."""
        run_dir = Path(settings.profile_dir) / run_name(
            settings, worker_index, os.getpid(), time.time()
        )
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SettingError(
                "PROFILE_DIR",
                settings.profile_dir,
                f"cannot create {str(run_dir)!r}: {exc.strerror or exc}",
            ) from None
        if not os.access(run_dir, os.W_OK | os.X_OK):
            raise SettingError(
                "PROFILE_DIR", settings.profile_dir, f"cannot write in {str(run_dir)!r}"
            )
        if any(run_dir.glob("*.prof")):
            raise SettingError(
                "PROFILE_RUN",
                settings.profile_run,
                f"{str(run_dir)!r} already holds snapshots: name another run or remove them",
            )
        return cls(run_dir, settings.profile_interval_s)

    def start(self) -> None:
        """Profile the loop thread from now on and take snapshots (on the running loop)."""
        self._profiler = cProfile.Profile()
        self._profiler.enable()
        self._task = supervisor().start("chat-profile-snapshots", self._run, RESTART)
        log.warning(
            "PROFILE=cprofile is ON: every call is traced, so the server is slower; "
            "snapshots every %g s and on SIGUSR1 to %s/<n>.prof",
            self.interval_s,
            self.run_dir.resolve(),
        )

    def request_snapshot(self) -> None:
        """Take a snapshot now (SIGUSR1); the next periodic one comes an interval later."""
        self._wanted.set()

    async def stop(self) -> None:
        """Stop profiling and write the last snapshot (after the history store closed, so
        the writer's last window is in it)."""
        if self._task is None:
            return
        self._stopping = True
        self._wanted.set()
        await self._task
        self._task = None
        await self._snapshot(final=True)

    async def _run(self) -> None:
        while True:
            with suppress(TimeoutError):  # the interval passed without a SIGUSR1
                await asyncio.wait_for(self._wanted.wait(), self.interval_s)
            self._wanted.clear()
            if self._stopping:
                return
            await self._snapshot(final=False)

    async def _snapshot(self, final: bool) -> None:
        """Close the loop's window (opening the next unless ``final``) and the writer's,
        and write both as the next ``<n>.prof``; a failure is logged, never raised."""
        closed = self._profiler
        if closed is None:
            return
        closed.disable()
        self._profiler = None if final else cProfile.Profile()
        if self._profiler is not None:
            self._profiler.enable()
        self.snapshots += 1
        path = self.run_dir / f"{self.snapshots}.prof"
        try:
            profilers = [closed, *await self.writer_hook.collect()]
            functions = await asyncio.to_thread(write_snapshot, profilers, path)
        except Exception:
            log.exception("profiling: snapshot %s not written", path)
            return
        log.info("profile snapshot %s (%d functions%s)", path, functions, ", last" if final else "")
