"""Process runtime: CPU affinity, open-files limit and signals.

SIGTERM and SIGINT stop the server; SIGUSR1 asks for a profile snapshot.

Each toggle is applied once, here, at start: nothing on the per-message path
asks which loop or which cores are in use.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
from collections.abc import Callable

import psutil

from chat_server.limits import open_files_wanted
from chatlab.supervision import RESTART, supervisor

log = logging.getLogger("chat_server")


def pin_cpus(cores: tuple[int, ...] | None) -> None:
    """Pin this process to ``cores`` (None: leave the scheduler free)."""
    if cores is not None:
        psutil.Process().cpu_affinity(list(cores))


def raise_open_files_limit(connections: int) -> int:
    """Raise the soft open-files limit towards what ``connections`` need; return the new limit.

    Each connection is one file descriptor; the reserve of :mod:`chat_server.limits`
    covers the rest. The limit never goes above the hard limit.
    """
    wanted = open_files_wanted(connections)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft < wanted:
        log.warning("open-files limit %d is below the %d that MAX_CONNECTIONS needs", soft, wanted)
    return soft


def on_stop_signals(callback: Callable[[], None]) -> None:
    """Call ``callback`` on the running loop when SIGTERM or SIGINT arrives."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, callback)


def on_snapshot_signal(callback: Callable[[], None]) -> None:
    """Call ``callback`` on the running loop when SIGUSR1 arrives (a profile snapshot).

    Installed whatever ``PROFILE`` is, so that SIGUSR1 never kills a server.
    """
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, callback)


def watch_parent(parent_pid: int, callback: Callable[[], None]) -> asyncio.Task[None]:
    """Call ``callback`` once this process' parent is not ``parent_pid`` (checked each second).

    A worker whose supervisor was killed is re-parented; this lets it stop
    gracefully instead of serving on alone.
    """

    async def watch() -> None:
        while os.getppid() == parent_pid:
            await asyncio.sleep(1.0)
        log.warning("supervisor %d is gone; stopping this worker", parent_pid)
        callback()

    return supervisor().start("chat-watch-supervisor", watch, RESTART)
