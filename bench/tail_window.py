"""What ``bench.tail`` reads of a server around a steady window: its ``/metrics``
scraped with the loop's schedstat wait and the host's steal, and the figures the scrapes
bracketing the window give (GC pauses, late ticks, commits, errors, CPU, histograms),
the late ticks with what they coincided with, and the commits' holds in a second. Pure
functions of the scrapes, apart from :func:`scrape` and :func:`core_wait_s`, which read
them (the host's steal: :func:`bench.lab.machine.steal_s`)."""

from __future__ import annotations

from typing import Any

from bench.lab.scrape import scrape_metrics

#: a pause or lateness above this (s) is a tail event
TAIL_BOUND_S = 0.01
SCRAPE_EVERY_S = 0.5
#: host steal (ms in a second) the summary names as a likely cause of a slow second
STEAL_NOTABLE_MS = 30.0
#: a scrape's entry for the server loop's wait for its core, in s (not a metric: schedstat)
WAITED = "core_wait_seconds"
#: a scrape's entry for the time the host took the server's cores from this VM, in s
#: (not a metric: the steal column of /proc/stat)
STOLEN = "core_steal_seconds"
#: the server's CPU seconds (the process collector's; from psutil where there is none)
CPU = "process_cpu_seconds_total{}"
#: a scrape that has this reports its GC pauses (and loop lag, commits, errors)
GC_PAUSES = "chat_gc_pause_seconds_count{generation=0}"


def scrape(port: int) -> dict[str, float]:
    """Every sample of the server's /metrics, buckets included, as ``name{labels}: value``
    (a family without labels as ``name{}``)."""
    return {
        name if "{" in name else f"{name}{{}}": value
        for name, value in scrape_metrics(port, buckets=True).items()
    }


def core_wait_s(pids: list[int]) -> float | None:
    """How long the main threads of ``pids`` (the servers' event loops) have waited,
    runnable, for their cores (Linux schedstat), in seconds, summed; None where there is
    no schedstat."""
    try:
        total = 0
        for pid in pids:
            with open(f"/proc/{pid}/schedstat") as f:
                total += int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return total / 1e9


def second_figures(
    scrapes: list[tuple[float, dict[str, float]]], start: float, end: float
) -> dict[str, float]:
    """The server's CPU % and the ms its loop waited for its core over the scrapes that
    bracket ``[start, end]`` (monotonic): what a slow second looked like from the server."""
    before = max((s for s in scrapes if s[0] <= start), key=lambda s: s[0], default=None)
    after = min((s for s in scrapes if s[0] >= end), key=lambda s: s[0], default=None)
    if before is None or after is None or after[0] <= before[0]:
        return {}
    span = after[0] - before[0]
    figures = {}
    cpu = CPU
    if cpu in before[1] and cpu in after[1]:
        figures["cpu_percent"] = 100 * (after[1][cpu] - before[1][cpu]) / span
    if WAITED in before[1] and WAITED in after[1]:
        figures["core_wait_ms_per_s"] = 1e3 * (after[1][WAITED] - before[1][WAITED]) / span
    if STOLEN in before[1] and STOLEN in after[1]:
        figures["core_steal_ms_per_s"] = 1e3 * (after[1][STOLEN] - before[1][STOLEN]) / span
    return figures


def above(samples: dict[str, float], family: str, bound_s: float, labels: str = "") -> float:
    """How many observations of ``family`` (with ``labels``) exceeded ``bound_s``."""
    prefix = f"{labels}," if labels else ""
    total = samples.get(f"{family}_count{{{labels}}}", 0.0)
    return total - samples.get(f"{family}_bucket{{{prefix}le={bound_s}}}", 0.0)


def window_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the server counted between two scrapes."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    def delta_above(family: str, labels: str = "") -> float:
        return above(after, family, TAIL_BOUND_S, labels) - above(
            before, family, TAIL_BOUND_S, labels
        )

    figures: dict[str, float] = {}
    for generation in "012":
        labels = f"generation={generation}"
        figures[f"gc{generation}_pauses"] = delta(f"chat_gc_pause_seconds_count{{{labels}}}")
        figures[f"gc{generation}_over_10ms"] = delta_above("chat_gc_pause_seconds", labels)
    figures["loop_ticks"] = delta("chat_loop_lag_seconds_count{}")
    figures["loop_late_over_10ms"] = delta_above("chat_loop_lag_seconds")
    figures["commits"] = delta("chat_commit_seconds_count{}")
    figures["commits_over_10ms"] = delta_above("chat_commit_seconds")
    commit_s = delta("chat_commit_seconds_sum{}")
    figures["commit_mean_ms"] = 1e3 * commit_s / figures["commits"] if figures["commits"] else 0.0
    figures["unavailable"] = delta("chat_errors_total{code=unavailable}")
    figures["cpu_s"] = delta(CPU)
    return figures


#: the histograms whose window counts each run keeps (and ``--histograms`` prints)
WINDOW_HISTOGRAMS = {
    "gc_pause": ("chat_gc_pause_seconds", ("generation=0", "generation=1", "generation=2")),
    "commit": ("chat_commit_seconds", ("",)),
    "loop_lag": ("chat_loop_lag_seconds", ("",)),
    # the commits' holds for WAL restarts (SQLite store only: none with BROKER=redis)
    "restart_hold": ("chat_wal_restart_hold_seconds", ("",)),
}


def window_histogram(
    before: dict[str, float], after: dict[str, float], family: str, label_sets: tuple[str, ...]
) -> dict[str, int]:
    """Observations of ``family`` between two scrapes per bucket (``"le 0.01"``: at most
    10 ms and over the bucket below), summed over ``label_sets``; empty buckets left out."""
    cumulative: dict[float, float] = {}
    for labels in label_sets:
        prefix = f"{labels}," if labels else ""
        head = f"{family}_bucket{{{prefix}le="
        for name, value in after.items():
            if name.startswith(head):
                bound = float(name[len(head) : -1])
                cumulative[bound] = cumulative.get(bound, 0.0) + value - before.get(name, 0.0)
    counts: dict[str, int] = {}
    below = 0.0
    for bound in sorted(cumulative):
        if (count := round(cumulative[bound] - below)) > 0:
            counts[f"le {bound:g}"] = count
        below = cumulative[bound]
    return counts


def stalls(tail: dict[str, Any], start: float, end: float) -> dict[str, Any]:
    """The loop's late ticks in ``[start, end]`` (unix time), each with what it coincided
    with: a checkpoint running, a slow commit, a GC pause, or nothing the server saw."""
    # .get throughout: a server from an older commit (--server-root) remembers less
    checkpoints = [(e["at"], e["at"] + e["took_s"]) for e in tail.get("slow_checkpoints", [])]
    commits = [(e["at"] - e["took_s"], e["at"]) for e in tail.get("slow_commits", [])]
    pauses = [(e["at"] - e["pause_s"], e["at"]) for e in tail.get("gc", {}).get("notable", [])]
    causes: dict[str, int] = {}
    late = []
    times = []
    for event in tail.get("loop_lag", {}).get("notable", []):
        at, lag = event["at"], event["lag_s"]
        if not start <= at <= end:
            continue
        late.append(round(lag * 1e3, 1))
        times.append(round(at, 4))
        # the tick was due at (at - lag): what ran between then and now?
        due = at - lag - 0.01
        cause = "nothing seen"
        for name, spans in (("gc", pauses), ("commit", commits), ("checkpoint", checkpoints)):
            if any(begin <= at and finish >= due for begin, finish in spans):
                cause = name
                break
        causes[cause] = causes.get(cause, 0) + 1
    return {"late_ticks_ms": late, "late_ticks_at": times, "late_tick_causes": causes}


#: :func:`stalls` of a target without /stats (the relay)
NO_STALLS: dict[str, Any] = {"late_ticks_ms": [], "late_ticks_at": [], "late_tick_causes": {}}


def held_commits(tail: dict[str, Any], second_end: float) -> dict[str, list[float]]:
    """The checkpointer's holds of the commits of 10 ms or more (ms) that overlapped the
    second ending at ``second_end`` (unix time); empty when none did."""
    held = [
        round(e["took_s"] * 1e3, 1)
        for e in tail.get("slow_restart_holds", [])
        if e["at"] <= second_end and e["at"] + e["took_s"] >= second_end - 1
    ]
    return {"holds_ms": held} if held else {}
