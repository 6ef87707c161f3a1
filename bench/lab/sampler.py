"""CPU% and RSS of the processes under test, sampled every half second on a thread.

Each role ("server", "generator", "auth") names one process; its children are counted
with it (the supervisor's workers, a driver's helpers). CPU is in percent of one core
over the last interval (200 = two cores busy), RSS in bytes, summed over the tree.
Beside them, the machine: other processes' CPU (every process outside this process'
tree, which holds every role, kernel threads included: :func:`~bench.lab.machine.
cpu_split`) and the host's steal, as :class:`HostSample` s.
"""

from __future__ import annotations

import threading
import time
from contextlib import suppress

import psutil

from bench.lab.machine import CpuSplit, cpu_split, load_between
from bench.lab.results import HostSample, Sample
from chatlab.harness import pin_this_thread

INTERVAL_S = 0.5


class Sampler:
    """Samples every role's process tree until :meth:`stop`; roles can change while it runs."""

    def __init__(
        self, t0: float, interval_s: float = INTERVAL_S, cores: list[int] | None = None
    ) -> None:
        self.t0 = t0
        #: the cores the sampling thread runs on (the generator's: never the server's)
        self.cores = cores
        self.interval_s = interval_s
        self.samples: dict[str, list[Sample]] = {}
        self.host: list[HostSample] = []
        self._lab = psutil.Process()
        self._roles: dict[str, tuple[int, ...]] = {}
        self._procs: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lab-sampler", daemon=True)

    def start(self) -> Sampler:
        """Start sampling."""
        self._thread.start()
        return self

    def watch(self, role: str, pid: int | tuple[int, ...] | None) -> None:
        """Sample ``pid`` (and its children; or several, summed: a Redis Cluster's nodes) as
        ``role`` from now on; None stops that role."""
        with self._lock:
            if pid is None:
                self._roles.pop(role, None)
            else:
                self._roles[role] = pid if isinstance(pid, tuple) else (pid,)

    def stop(self) -> dict[str, list[Sample]]:
        """Stop sampling; the samples per role."""
        self._stop.set()
        self._thread.join(5)
        return self.samples

    def _tree(self, pid: int) -> list[psutil.Process]:
        """The process and its children, the same objects each time (cpu_percent needs that)."""
        procs: list[psutil.Process] = []
        with suppress(psutil.Error):
            root = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
            procs.append(root)
            for child in root.children(recursive=True):
                procs.append(self._procs.setdefault(child.pid, child))
        return procs

    def _sample_host(self, before: tuple[float, CpuSplit]) -> tuple[float, CpuSplit]:
        """Append the machine's load since ``before``; the counters now."""
        now = (time.monotonic(), cpu_split([self._lab]))
        load = load_between(before[1], now[1], now[0] - before[0])
        if load is not None and now[0] - before[0] > 0.05:
            self.host.append(
                HostSample(
                    round(now[0] - self.t0, 3),
                    round(load.others_percent, 1),
                    round(load.steal_ms_per_s, 2),
                )
            )
        return now

    def _loop(self) -> None:
        pin_this_thread(self.cores)
        next_at = time.monotonic()
        host_before = (next_at, cpu_split([self._lab]))
        while not self._stop.is_set():
            host_before = self._sample_host(host_before)
            with self._lock:
                roles = dict(self._roles)
            now = time.monotonic()
            for role, pids in roles.items():
                cpu = 0.0
                rss = 0
                primed = True
                for proc in (proc for pid in pids for proc in self._tree(pid)):
                    with suppress(psutil.Error):
                        first = getattr(proc, "_lab_primed", False) is False
                        value = proc.cpu_percent(None)
                        if first:
                            proc._lab_primed = True  # type: ignore[attr-defined]
                            primed = False
                        cpu += value
                        rss += proc.memory_info().rss
                if primed and rss:
                    self.samples.setdefault(role, []).append(
                        Sample(round(now - self.t0, 3), round(cpu, 1), rss)
                    )
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))
