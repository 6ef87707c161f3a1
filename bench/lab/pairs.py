"""Verdicts from pairs: the one statistic the lab confirms CPU per frame with, and which
bound applies to which figure.

Two steps taken a second apart see nearly the same host; two runs minutes apart do not.
So the cost steps of the configurations a matrix compares are taken side by side, in
A B B A order (:func:`pair_order`), and each comparison is a list of pairs: X's CPU µs per
frame and Y's, from the same round. :func:`paired_ratio` is the statistic: the mean of
the pairs' log-ratios with its two-sided 95 % Student t interval, as a ratio
(:class:`PairedRatio`). Drift slower than a round cancels within each pair; what is left
is the pairs' own scatter, which the interval carries.

The A/A pair (one configuration twice) gives the floor by the same statistic
(:func:`floor_of`: how far from 1 its interval reaches), and a comparison is confirmed
when its whole interval lies beyond that floor (:func:`paired_verdict`). The A/A pair
itself is judged by the same rule and so is never confirmed: what it says is the
floor's width.

Which bound judges which figure (:data:`FIGURE_BOUNDS`, :func:`voided`): CPU per frame
is the server's own CPU time (its threads' schedstat), which time the host steals is not
charged to, and other work on its core mostly is not either, so it is judged against
its paired floor whatever other work the machine did (the report says what it did);
only heavy steal from the server's core voids a step, and its pair is left out
(:data:`COST_STEAL_LIMIT_MS_PER_S`, :func:`unstolen`). A knee and a percentile are time
as the clients see it: a step whose server core was busy
(:func:`bench.lab.machine.core_load`, :func:`step_busy`) voids them.

No I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.lab.machine import MachineLoad, core_load, is_busy
from bench.lab.results import Step

#: two-sided 95 % quantiles of Student's t by degrees of freedom; between two rows the
#: lower row's (the wider interval), beyond the last the normal's 1.96
T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
    60: 2.000,
}
#: a comparison wants at least this many pairs (the matrix's ``pairs`` is checked against it)
MIN_PAIRS = 5

#: steal from the server's core past this, over a cost step, voids that step's CPU per
#: frame (its pair is left out): what the host takes is not charged to the server, but
#: past a point the server's work around it costs more. Measured on a 2-core VM
#: (docs/decisions/0017): 17.5 ms/s moved an A/A pair no more than a quiet host (3-4 %),
#: 248 ms/s moved a configuration 9 % and 412 ms/s 52 %; the bound sits at three times
#: the most seen harmless and a fifth of the least seen harmful
COST_STEAL_LIMIT_MS_PER_S = 50.0

#: which bound judges each figure: "floor" (its paired A/A floor, whatever other work
#: the machine did; only heavy steal from the server's core voids a step) or "core"
#: (voided by a step whose server core was busy)
FIGURE_BOUNDS = {
    "cpu_us_per_frame": "floor",
    "knee": "core",
    "p50": "core",
    "p90": "core",
    "p95": "core",
    "p99": "core",
    "max": "core",
    "delivered_per_s": "core",
    "cpu_mean": "core",
    "rss_peak_mib": "core",
}


def t_975(df: int) -> float:
    """Student's t two-sided 95 % quantile at ``df`` degrees of freedom (conservative
    between the tabulated rows)."""
    if df < 1:
        raise ValueError("an interval needs at least two pairs")
    rows = [d for d in T_975 if d <= df]
    return T_975[max(rows)] if df <= max(T_975) else 1.96


@dataclass(frozen=True)
class PairedRatio:
    """X against Y over ``n`` pairs: the geometric mean of the pairs' ratios and its
    95 % interval (``low``..``high``; both equal to ``ratio`` for a single pair)."""

    n: int
    ratio: float
    low: float
    high: float

    def text(self) -> str:
        """The ratio, its interval and its number of pairs, as the report quotes them."""
        if self.n < 2:
            return f"\u00d7{self.ratio:.2f} (1 pair)"
        return f"\u00d7{self.ratio:.2f} ({self.low:.2f}\u2013{self.high:.2f}, {self.n} pairs)"


def paired_ratio(xs: Sequence[float | None], ys: Sequence[float | None]) -> PairedRatio | None:
    """X over Y from the pairs ``(xs[i], ys[i])`` where both are known and positive: the
    mean log-ratio with its t interval, as ratios; None when no pair is complete."""
    logs = [
        math.log(x / y)
        for x, y in zip(xs, ys, strict=False)
        if x is not None and y is not None and x > 0 and y > 0
    ]
    if not logs:
        return None
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return PairedRatio(1, math.exp(mean), math.exp(mean), math.exp(mean))
    half = t_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return PairedRatio(len(logs), math.exp(mean), math.exp(mean - half), math.exp(mean + half))


def pairwise_floor(a: Sequence[float | None], b: Sequence[float | None]) -> float | None:
    """Two series that should be equal (an A/A pair, repeat i with repeat i): the largest
    relative difference between them, larger over smaller; None when no repeat has both.
    Every floor in the lab (knees, CPU per frame, the driver tables' figures) is this."""
    diffs = [
        max(x, y) / min(x, y) - 1
        for x, y in zip(a, b, strict=False)
        if x is not None and y is not None and min(x, y) > 0
    ]
    return max(diffs) if diffs else None


def floor_of(aa: PairedRatio | None) -> float | None:
    """The floor an A/A pair's paired ratio gives (a fraction: 0.03 is ±3 %): how far
    from 1 its interval reaches, either way; None without an interval (under two pairs)."""
    if aa is None or aa.n < 2:
        return None
    return max(aa.high - 1, 1 / aa.low - 1, 0.0)


def paired_verdict(paired: PairedRatio | None, floor: float | None) -> tuple[str, str]:
    """``("higher" | "lower" | "not confirmed", reason)``: confirmed only when the whole
    interval lies beyond the floor (above ``1 + floor``, or below ``1 / (1 + floor)``)."""
    if paired is None:
        return "not confirmed", "no pair of both to compare"
    if paired.n < 2:
        return "not confirmed", "one pair: no interval"
    if floor is None:
        return "not confirmed", "no A/A floor at this rate"
    if paired.low > 1 + floor:
        return "higher", ""
    if paired.high < 1 / (1 + floor):
        return "lower", ""
    return "not confirmed", f"its interval reaches within the \u00b1{floor * 100:.1f} % floor"


def voided(figure: str, core: MachineLoad | None) -> bool:
    """Whether a step with ``core`` (what else ran on its server's core; None: not read)
    voids ``figure``: for a figure judged by its paired floor, only when the host stole
    more than :data:`COST_STEAL_LIMIT_MS_PER_S` from that core; whenever the core was
    busy for one judged by the core (:data:`FIGURE_BOUNDS`)."""
    if FIGURE_BOUNDS.get(figure, "core") == "floor":
        return core is not None and core.steal_ms_per_s > COST_STEAL_LIMIT_MS_PER_S
    return is_busy(core)


def unstolen(
    xs: Sequence[float | None],
    ys: Sequence[float | None],
    stolen_x: Sequence[bool],
    stolen_y: Sequence[bool],
) -> tuple[list[float | None], list[float | None], int]:
    """The pairs ``(xs[i], ys[i])`` less those where either step was voided by heavy
    steal (``stolen_*[i]``, :data:`COST_STEAL_LIMIT_MS_PER_S`; a missing flag: not
    stolen), and how many complete pairs that left out."""
    kept_x: list[float | None] = []
    kept_y: list[float | None] = []
    left_out = 0
    for i, (x, y) in enumerate(zip(xs, ys, strict=False)):
        if (i < len(stolen_x) and stolen_x[i]) or (i < len(stolen_y) and stolen_y[i]):
            left_out += x is not None and y is not None
            continue
        kept_x.append(x)
        kept_y.append(y)
    return kept_x, kept_y, left_out


def stolen_note(left_out: int) -> str:
    """Why ``left_out`` pairs are missing from a comparison of CPU per frame ("" for none)."""
    if not left_out:
        return ""
    return (
        f"{left_out} pair(s) left out: the host stole more than "
        f"{COST_STEAL_LIMIT_MS_PER_S:g} ms/s from the server's core"
    )


def pair_order(names: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """``(round, name)`` in the order the paired steps are taken: the names forward in
    even rounds and backward in odd ones (A B, B A, A B, ...), so that a drift over a
    round pair weighs on both sides of each comparison alike."""
    order = []
    for k in range(rounds):
        for name in names if k % 2 == 0 else list(reversed(names)):
            order.append((k, name))
    return order


def step_load(step: Step) -> MachineLoad | None:
    """What else ran on the machine over ``step``'s window (None: not read)."""
    if step.others_cpu_s is None or step.steal_s is None:
        return None
    return MachineLoad.over(step.window_s, step.others_cpu_s, step.steal_s)


def core_step_load(step: Step) -> MachineLoad | None:
    """What else ran on ``step``'s server core (None: its core was not read): not the
    server, nor the lab's own processes beside it there (idle servers of a paired phase,
    a proxy in front of the server); for results saved before the core was counted
    process by process, its busy time less the server's and those processes' CPU."""
    others = step.server_core_others_s
    if others is None and step.server_core_busy_s is not None and step.server_cpu_s is not None:
        beside = (step.idle_cpu_s or 0.0) + (step.proxy_cpu_s or 0.0)
        others = step.server_core_busy_s - step.server_cpu_s - beside
    return core_load(step.window_s, others, step.server_core_steal_s)


def step_busy(step: Step) -> bool:
    """Whether ``step``'s knee and percentiles are void: its server core was busy
    (:func:`voided`); by the whole host's load where the core was not
    read (results saved before the lab read it)."""
    core = core_step_load(step)
    if core is not None:
        return voided("knee", core)
    return is_busy(step_load(step))
