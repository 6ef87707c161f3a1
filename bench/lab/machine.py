"""Is the machine quiet enough to measure the server? The rule, and the counters it reads.

A load measurement owns the machine. When other processes use a core the server or the
driver wanted, or the host steals the virtual CPUs, a figure measures the machine, not
the server. The lab samples both through every step (the driver over each step's exact
window, the sampler every half second) and this module decides, with plain numbers,
whether a step was *busy*: over the whole host (what the report says the machine did)
and over the server's own core (:func:`core_load`: what voids a knee or a percentile;
:mod:`bench.lab.pairs` says which figure each bound judges). CPU per frame, the
server's own CPU time, is judged against its paired floor instead, whatever the
machine did.

:func:`busy_reasons`, :func:`core_load` and :func:`machine_verdict` are pure;
:func:`read_host`, :func:`tree_cpu_s` and :func:`cpu_split` read ``/proc`` through
psutil. Other processes' CPU is counted process by process (:class:`CpuSplit`), not as
the host's busy time less the lab's: the two counters disagree by up to a core over a
step on a VM (``docs/decisions/0018-other-processes.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psutil

#: other processes may use this much of one core before a step counts as busy: a 2-core
#: machine's second core is the driver's, so a tenth of a core elsewhere is already a
#: tenth of someone's headroom
OTHERS_LIMIT_PERCENT = 10.0
#: the host may steal this many milliseconds per second (summed over cores) before a step
#: counts as busy: a 5-ms theft inside a 100-ms SLO step is visible in the tail
STEAL_LIMIT_MS_PER_S = 5.0
#: ``make demo`` waits at most this long for a quiet machine, then runs anyway (and says so)
QUIET_WAIT_S = 60.0
#: ... and wants this many quiet seconds in a row before it starts
QUIET_SECONDS = 3

#: why a knee or a percentile is not confirmed when a step that decided it was busy
CORE_BUSY = "the server's core was busy"


@dataclass(frozen=True)
class MachineLoad:
    """What else ran on the machine over one window: other processes' CPU in percent of
    one core, and the host's steal in milliseconds per second (summed over cores)."""

    others_percent: float
    steal_ms_per_s: float

    @classmethod
    def over(cls, seconds: float, others_cpu_s: float, steal_s: float) -> MachineLoad | None:
        """The load from a window's CPU seconds; None for an empty window."""
        if seconds <= 0:
            return None
        return cls(100 * max(0.0, others_cpu_s) / seconds, 1000 * max(0.0, steal_s) / seconds)


def core_load(
    seconds: float, others_on_core_s: float | None, core_steal_s: float | None
) -> MachineLoad | None:
    """What else ran on the server's own cores over a window: other processes' run time
    there (:attr:`CpuSplit.on_cores_s`: every process but the server and the lab's idle
    servers sharing its core, each by its own counters), and the host's steal from those
    cores; None when they were not read. This, not the whole host's "others", is what
    bends a knee or a percentile: work on the driver's core or elsewhere does not delay
    the server."""
    if others_on_core_s is None or seconds <= 0:
        return None
    return MachineLoad.over(seconds, others_on_core_s, core_steal_s or 0.0)


def core_share(affinity: Collection[int], cores: Collection[int]) -> float:
    """The share of a process' run time counted on ``cores``: all of it when it may run
    only there, none when it may not run there, else the even share of its allowed cores
    that are ``cores`` (no counter says on which core a free process ran; the scheduler
    spreads it over those it may use)."""
    allowed = set(affinity)
    if not allowed:
        return 0.0
    return len(allowed & set(cores)) / len(allowed)


def busy_reasons(load: MachineLoad) -> list[str]:
    """Why ``load`` makes a window busy (empty: it was quiet)."""
    reasons = []
    if load.others_percent > OTHERS_LIMIT_PERCENT:
        reasons.append(
            f"other processes used {load.others_percent:.0f} % of a core "
            f"(> {OTHERS_LIMIT_PERCENT:g} %)"
        )
    if load.steal_ms_per_s > STEAL_LIMIT_MS_PER_S:
        reasons.append(
            f"the host stole {load.steal_ms_per_s:.1f} ms/s (> {STEAL_LIMIT_MS_PER_S:g} ms/s)"
        )
    return reasons


def is_busy(load: MachineLoad | None) -> bool:
    """True when ``load`` passes a bound; an unknown load (None) is not busy."""
    return load is not None and bool(busy_reasons(load))


@dataclass(frozen=True)
class MachineVerdict:
    """Over a run's measured windows: how many were busy, and the worst of each figure."""

    windows: int  # windows with a known load
    busy_windows: int
    worst_others_percent: float
    worst_steal_ms_per_s: float
    mean_others_percent: float
    mean_steal_ms_per_s: float

    @property
    def busy(self) -> bool:
        return self.busy_windows > 0

    def sentence(self) -> str:
        """The report's first finding when busy, else how quiet it was."""
        figures = (
            f"other processes used {self.mean_others_percent:.0f} % of a core on average "
            f"(up to {self.worst_others_percent:.0f} %) and the host stole "
            f"{self.mean_steal_ms_per_s:.1f} ms/s (up to {self.worst_steal_ms_per_s:.1f})"
        )
        bounds = f"{OTHERS_LIMIT_PERCENT:g} % of a core, {STEAL_LIMIT_MS_PER_S:g} ms/s"
        if not self.windows:
            return "The machine's load around the server was not recorded in these results."
        if self.busy:
            return (
                f"This machine was busy: in {self.busy_windows} of {self.windows} measured "
                f"steps {figures}, past the bounds ({bounds}). What that voids is judged "
                "figure by figure: knees and percentiles by the server's own core, CPU per "
                "frame by its paired floor."
            )
        return f"The machine was quiet in all {self.windows} measured steps: {figures} ({bounds})."


def machine_verdict(loads: Iterable[MachineLoad | None]) -> MachineVerdict:
    """The verdict over ``loads`` (None: a window whose load is unknown, left out)."""
    known = [load for load in loads if load is not None]
    if not known:
        return MachineVerdict(0, 0, 0.0, 0.0, 0.0, 0.0)
    return MachineVerdict(
        windows=len(known),
        busy_windows=sum(is_busy(load) for load in known),
        worst_others_percent=max(load.others_percent for load in known),
        worst_steal_ms_per_s=max(load.steal_ms_per_s for load in known),
        mean_others_percent=sum(load.others_percent for load in known) / len(known),
        mean_steal_ms_per_s=sum(load.steal_ms_per_s for load in known) / len(known),
    )


def quiet_enough(recent: Sequence[MachineLoad], seconds: int = QUIET_SECONDS) -> bool:
    """True when the last ``seconds`` one-second loads were all quiet."""
    return len(recent) >= seconds and not any(is_busy(load) for load in recent[-seconds:])


# ---- reading the counters ---------------------------------------------------------------


@dataclass(frozen=True)
class HostTimes:
    """The host's CPU seconds so far, summed over cores: busy (everything but idle, I/O
    wait and steal) and stolen."""

    busy_s: float
    steal_s: float


def read_host() -> HostTimes:
    """The host's counters now (``/proc/stat``)."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    return HostTimes(busy, steal_s() or 0.0)


def steal_s(cores: Collection[int] | None = None) -> float | None:
    """How long the hypervisor has run something else on ``cores`` (None: every core)
    while this VM wanted them (steal time, ``/proc/stat``), in seconds, summed; None
    where the kernel counts no steal. The one reading of steal: the lab's samplers,
    its drivers' windows and ``bench.tail`` alike."""
    if cores is None:
        return getattr(psutil.cpu_times(), "steal", None)
    per_cpu = psutil.cpu_times(percpu=True)
    if not per_cpu or not hasattr(per_cpu[0], "steal"):
        return None
    return sum(per_cpu[core].steal for core in cores if 0 <= core < len(per_cpu))


def process_cpu_s(proc: psutil.Process) -> float:
    """CPU seconds (user + system) of one process so far: the sum of its threads' time on
    a CPU in nanoseconds (``/proc/PID/task/*/schedstat``), else psutil's clock ticks (10 ms
    each: a 3-s step at a third of a core would be ±1 % from ticks alone)."""
    total_ns = 0
    try:
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            with suppress(OSError, ValueError, IndexError):
                total_ns += int((task / "schedstat").read_text().split()[0])
    except OSError:
        total_ns = 0
    if total_ns:
        return total_ns / 1e9
    t = proc.cpu_times()
    return t.user + t.system


def cores_busy_s(cores: Sequence[int]) -> float:
    """Busy CPU seconds so far of ``cores`` (everything but idle, I/O wait and steal:
    processes and the kernel's work, such as the loopback's packets, alike)."""
    per_cpu = psutil.cpu_times(percpu=True)
    total = 0.0
    for core in cores:
        if core < len(per_cpu):
            t = per_cpu[core]
            total += (
                t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
            )
    return total


def tree_cpu_s(root: psutil.Process | None) -> float:
    """CPU seconds (user + system) of ``root`` and its living descendants so far, from
    their threads' nanosecond counters (:func:`process_cpu_s`)."""
    if root is None:
        return 0.0
    total = 0.0
    with suppress(psutil.Error):
        for proc in [root, *root.children(recursive=True)]:
            with suppress(psutil.Error):
                total += process_cpu_s(proc)
    return total


@dataclass(frozen=True)
class CpuSplit:
    """CPU seconds so far, every process counted once by its own counters (user +
    system, with the children it has reaped, so that a process ending inside a window
    stays counted): ``ours`` (the trees of the processes named) and ``others`` (every
    other process, kernel threads included); and the host's counters. What the host
    counts busy beyond both (:attr:`unattributed_s`) is no process' time: the kernel's
    interrupts and softirqs taken on an idle core, and the difference between the
    host's tick-sampled busy time and the processes' own run time. "Other processes"
    is ``others``, never the host's busy time less ours (docs/decisions/0018).

    ``on_cores_s``: the run time on the cores asked for of every process outside the
    trees set apart (the server and its idle neighbours), each weighted by
    :func:`core_share` of its affinity: what else ran on the server's core, by the same
    counters, not by ``/proc/stat``'s tick-sampled per-core busy time."""

    ours_s: float
    others_s: float
    host: HostTimes
    on_cores_s: float = 0.0

    @property
    def unattributed_s(self) -> float:
        return self.host.busy_s - self.ours_s - self.others_s


def _trees(roots: set[int], parent: dict[int, int]) -> set[int]:
    """The pids of ``roots`` and all their descendants in ``parent`` (pid -> ppid)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    tree: set[int] = set()
    todo = [pid for pid in roots if pid in parent]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += children.get(pid, [])
    return tree


def cpu_split(
    ours: Iterable[psutil.Process | None],
    cores: Collection[int] = (),
    apart: Iterable[psutil.Process | None] = (),
) -> CpuSplit:
    """The CPU split now between the trees of ``ours`` and every other process; with
    ``cores``, also the run time there of every process outside the trees of ``apart``
    (:attr:`CpuSplit.on_cores_s`)."""
    host = read_host()
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    affinity: dict[int, list[int]] = {}
    attrs = ["ppid", "cpu_times", *(["cpu_affinity"] if cores else [])]
    for proc in psutil.process_iter(attrs):
        t = proc.info["cpu_times"]
        if t is None:  # gone, or not ours to read
            continue
        parent[proc.pid] = proc.info["ppid"] or 0
        used[proc.pid] = t.user + t.system + t.children_user + t.children_system
        if cores:
            affinity[proc.pid] = proc.info["cpu_affinity"] or []
    tree = _trees({p.pid for p in ours if p is not None}, parent)
    ours_s = sum(used[pid] for pid in tree)
    on_cores_s = 0.0
    if cores:
        set_apart = _trees({p.pid for p in apart if p is not None}, parent)
        on_cores_s = sum(
            used[pid] * core_share(affinity[pid], cores) for pid in used if pid not in set_apart
        )
    return CpuSplit(ours_s, sum(used.values()) - ours_s, host, on_cores_s)


def load_between(before: CpuSplit, after: CpuSplit, seconds: float) -> MachineLoad | None:
    """Other processes' CPU and the host's steal between two splits ``seconds`` apart."""
    return MachineLoad.over(
        seconds, after.others_s - before.others_s, after.host.steal_s - before.host.steal_s
    )


def others_load_over(seconds: float, ours: psutil.Process | None = None) -> MachineLoad | None:
    """What processes outside ``ours``' tree (this process' by default) and the host's
    steal took over the next ``seconds``."""
    ours = ours or psutil.Process()
    before, t0 = cpu_split([ours]), time.monotonic()
    time.sleep(seconds)
    after, t1 = cpu_split([ours]), time.monotonic()
    return load_between(before, after, t1 - t0)


def wait_for_quiet(
    max_wait_s: float = QUIET_WAIT_S,
    say: Callable[[str], None] = print,
    sample: Callable[[], MachineLoad | None] = lambda: others_load_over(1.0),
) -> MachineVerdict:
    """Wait, at most ``max_wait_s``, until :data:`QUIET_SECONDS` quiet seconds in a row;
    say what it waits for once and every ten seconds. The verdict over the seconds it
    watched (busy when it gave up)."""
    recent: list[MachineLoad] = []
    started = time.monotonic()
    said_at = -10.0
    while True:
        load = sample()
        if load is not None:
            recent.append(load)
        if quiet_enough(recent):
            return machine_verdict(recent[-QUIET_SECONDS:])
        waited = time.monotonic() - started
        if waited >= max_wait_s:
            say(
                f"the machine is still busy after {waited:.0f} s "
                f"({'; '.join(busy_reasons(recent[-1])) if recent else 'no reading'}): "
                "starting anyway; the report will say the figures measure the machine"
            )
            return machine_verdict(recent)
        if waited - said_at >= 10 and recent and is_busy(recent[-1]):
            said_at = waited
            say(
                f"waiting for a quiet machine ({'; '.join(busy_reasons(recent[-1]))}); "
                f"{max_wait_s - waited:.0f} s left before starting anyway"
            )
