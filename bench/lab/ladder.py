"""The capacity ladder: each configuration's knee over its repeats, and what may be claimed.

A configuration climbed by the fast driver has one knee per repeat
(:class:`~bench.lab.results.Knee`, judged by :func:`~bench.lab.results.edge`): the highest
delivered/s that held the SLO. :func:`rungs_of`, the lab's one summary of knees over
repeats, turns them into rungs (median, min-max, whether the knee is only a lower bound);
:func:`ladder` compares each rung with the baseline and with the relays, and
:mod:`bench.lab.findings` writes from it the findings the report opens with.

What may be claimed: a rung is better or worse than the baseline only when the difference
holds in *every* repeat (repeat i against the baseline's repeat i) and exceeds the noise
floor: the A/A pair's own difference when the matrix has one, else the largest
repeat-to-repeat spread of any rung that is not a lower bound, and never less than the
climb's resolution (a setting of each climb, read from the run: :func:`climb_resolution`).
Otherwise it is "not confirmed", with the reason; a knee that rests on a step whose
server core was busy (:func:`bench.lab.pairs.step_busy`) reads "not confirmed: the server's core was
busy", whatever its size. A knee that is a lower bound (the driver was the limit, or
nothing broke up to the climb's top rate) makes a "higher" claim a lower bound and a
"lower" claim impossible.

Beside each knee, what a frame costs: the server's CPU µs per delivered frame at the
matrix's stated cost rates (``Step.cost`` steps: from the paired phase where the
configuration took part, else made before each climb; :func:`costs_of`). It holds where a
knee is only a lower bound, so it is the first measure. Costs are compared with the rung
before (what that step of the ladder bought), the baseline and the relay of the same
transport pair by pair, by :mod:`bench.lab.pairs`' statistic against the A/A pair's
paired floor at that rate, whatever the machine did (:func:`compare_costs`).

No I/O: the report draws and renders what this returns.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.lab.machine import (
    CORE_BUSY,
    MachineVerdict,
    is_busy,
    machine_verdict,
)
from bench.lab.matrix import Load
from bench.lab.pairs import (
    PairedRatio,
    core_step_load,
    floor_of,
    paired_ratio,
    paired_verdict,
    pairwise_floor,
    step_busy,
    step_load,
    stolen_note,
    unstolen,
    voided,
)
from bench.lab.results import Knee, Results, Run, Step, climbed_steps, edge, parse_slo

#: the climb's bisection resolution where a run does not record its own (the default of
#: the matrices' ``resolution`` and of ``capacity --resolution``)
DEFAULT_RESOLUTION = Load.resolution
#: a knee above this share of the driver's ceiling at its shape measures the driver too:
#: it is labelled driver-limited and never ranked
CEILING_SHARE = 0.8
#: the driver is at its ceiling when it uses this much of its core (its own limit rule)
DRIVER_CORE_PERCENT = 90.0
DASH = "\u2013"  # en dash: between the ends of a range
TIMES = "\u00d7"  # multiplication sign: before a ratio


@dataclass
class Cost:
    """One rung's CPU µs per delivered frame at one offered rate, per repeat (None where
    the step is missing or its CPU was not read)."""

    rate: float  # offered sends/s
    values: list[float | None]
    delivered_per_s: list[float]
    busy: list[bool]  # the step's window was busy (bench.lab.machine): said, not voiding
    held: list[bool]  # the step held the SLO: a cost where it did not is an overload's
    # bytes on the wire per delivered message, per repeat (None: not counted)
    wire_bytes: list[float | None] = field(default_factory=list)
    # the values are per round of the paired phase (bench.lab.pairs), not per repeat
    paired: bool = False
    # heavy steal from the server's core voided the step (bench.lab.pairs.unstolen)
    stolen: list[bool] = field(default_factory=list)

    @property
    def known(self) -> list[float]:
        return [v for v in self.values if v is not None]

    @property
    def median(self) -> float | None:
        return statistics.median(self.known) if self.known else None

    def label(self) -> str:
        """The median with its range over repeats (or paired rounds)."""
        if not self.known:
            return DASH
        low, high = min(self.known), max(self.known)
        spread = f" ({low:.1f}{DASH}{high:.1f})" if len(self.known) > 1 else ""
        return f"{self.median:.1f}{spread}"

    @property
    def wire_median(self) -> float | None:
        """Median bytes on the wire per delivered message over repeats (None: not counted)."""
        known = [v for v in self.wire_bytes if v is not None]
        return statistics.median(known) if known else None


@dataclass
class Rung:
    """One configuration's knees over its repeats (delivered/s), in repeat order."""

    config: str
    target: str
    runs: list[Run]
    knees: list[float]
    lower_bound: bool  # some repeat's knee is only a lower bound
    driver_limited: bool  # ... because the fast driver itself was the limit
    connections: int = 0
    room_size: int = 0
    body_chars: int = 0
    frame_bytes: int = 0
    deflate: bool = False
    deflate_params: str = ""  # the server's Sec-WebSocket-Extensions reply (Step.deflate_params)
    reruns: int = 0  # steps run again because they stalled
    stalled_steps: int = 0
    busy_reruns: int = 0  # steps run again because the server's core was busy
    transport: str = "websockets"
    same_as: str = ""  # an A/A twin of that rung
    costs: dict[float, Cost] = field(default_factory=dict)  # offered sends/s -> cost
    # per repeat: a step that decided the knee (the best held, the first broken) was busy
    busy: list[bool] = field(default_factory=list)
    # the driver's ceiling at this rung's shape (delivered/s, median over repeats; None:
    # its CPU was not read): :func:`driver_ceiling`
    driver_ceiling: float | None = None
    # per repeat: whether a sustained step at a share of the knee held (None: none was
    # run, the knee is a burst's, from steps of ``step_s``)
    sustained: list[bool | None] = field(default_factory=list)
    step_s: float = 0.0
    relay_mode: str = ""  # a relay's way of writing (bench.relay --mode)

    @property
    def near_ceiling(self) -> bool:
        """The median knee is above :data:`CEILING_SHARE` of the driver's ceiling."""
        ceiling = self.driver_ceiling
        return ceiling is not None and self.median > CEILING_SHARE * ceiling

    def knee_kind(self) -> str:
        """ "sustained" when every repeat's sustained step held, else "burst (N-s steps)"."""
        if self.sustained and all(self.sustained):
            return "sustained"
        if any(held is False for held in self.sustained):
            return f"burst ({self.step_s:g}-s steps; not held when sustained)"
        return f"burst ({self.step_s:g}-s steps)"

    @property
    def median(self) -> float:
        return statistics.median(self.knees)

    @property
    def low(self) -> float:
        return min(self.knees)

    @property
    def high(self) -> float:
        return max(self.knees)

    @property
    def spread(self) -> float:
        """(max - min) / min over the repeats: how far this rung moved on its own."""
        return self.high / self.low - 1 if self.low > 0 else 0.0

    def label(self) -> str:
        """The median knee as text, "≥" when it is a lower bound."""
        return f"{'≥ ' if self.lower_bound else ''}{self.median:,.0f}"


@dataclass
class Comparison:
    """A rung against a reference rung (the baseline, or a relay), repeat by repeat."""

    config: str
    reference: str
    ratios: list[float]  # per repeat: this rung's knee / the reference's
    verdict: str  # "higher" | "lower" | "not confirmed"
    reason: str = ""
    figure: str = "knee"  # "knee", or "cost" (CPU µs per frame: lower is better)
    rate: float = 0.0  # a cost's offered sends/s
    lower_bound: bool = False  # the ratio is only a lower bound (this rung's knee is)
    upper_bound: bool = False  # the ratio is only an upper bound (the reference's knee is)
    # a cost's ratio from its pairs, with its interval (bench.lab.pairs)
    paired: PairedRatio | None = None

    @property
    def median(self) -> float:
        if self.paired is not None:
            return self.paired.ratio
        return statistics.median(self.ratios) if self.ratios else 0.0

    def ratio_text(self) -> str:
        """The median ratio and its range over the repeats, "≥" when a lower bound; a
        paired ratio with its 95 % interval and its number of pairs."""
        if self.paired is not None:
            return self.paired.text()
        if not self.ratios:
            return DASH
        if self.lower_bound and self.upper_bound:
            return "? (both knees are lower bounds)"
        low, high = min(self.ratios), max(self.ratios)
        spread = f" ({low:.2f}{DASH}{high:.2f})" if len(self.ratios) > 1 else ""
        bound = "≥ " if self.lower_bound else "≤ " if self.upper_bound else ""
        return f"{bound}{TIMES}{self.median:.2f}{spread}"


@dataclass
class Ladder:
    """Every rung of a run, the noise floor, and each rung's comparisons."""

    rungs: list[Rung]
    baseline: Rung | None
    relays: list[Rung]
    floor: float
    floor_source: str
    # the climb's resolution in this run (:func:`climb_resolution`)
    resolution: float = DEFAULT_RESOLUTION
    against_baseline: dict[str, Comparison] = field(default_factory=dict)
    against_relays: dict[str, dict[str, Comparison]] = field(default_factory=dict)
    # CPU µs per frame, per cost rate: its floor and source, and each chat rung against
    # the rung before it, the baseline, and the relay of its transport
    cost_rates: list[float] = field(default_factory=list)
    cost_floor: dict[float, tuple[float, str]] = field(default_factory=dict)
    cost_vs_previous: dict[str, dict[float, Comparison]] = field(default_factory=dict)
    cost_vs_baseline: dict[str, dict[float, Comparison]] = field(default_factory=dict)
    cost_vs_relay: dict[str, dict[float, Comparison]] = field(default_factory=dict)
    # what profiling costs: each profiled configuration's CPU per frame against the same
    # configuration unprofiled, at the same offered rate
    profiling: list[Comparison] = field(default_factory=list)
    # each transport's floor: of its relays, the one with the highest knee (the least its
    # library costs); the chat server is judged as a fraction of it
    floors: dict[str, Rung] = field(default_factory=dict)
    # the machine around every measured step of the ladder (bench.lab.machine)
    machine: MachineVerdict = field(default_factory=lambda: machine_verdict([]))
    # what else ran on the server's own core: over the cost steps (said, not voiding)
    # and over the climb steps as measured (busy ones were measured again)
    cost_core: MachineVerdict = field(default_factory=lambda: machine_verdict([]))
    cost_stolen: int = 0  # cost steps heavy steal voided (Cost.stolen)
    climb_core: MachineVerdict = field(default_factory=lambda: machine_verdict([]))
    # the cost steps' host steal (ms/s, summed over cores): mean and most
    cost_machine: MachineVerdict = field(default_factory=lambda: machine_verdict([]))
    # the idle servers' CPU on the server's core during the paired steps, in percent of
    # one core: mean and most (None: no paired phase)
    idle_percent: tuple[float, float] | None = None
    paired_rounds: int = 0
    # what else ran on the server's core over the fixed-rate steps (the step tables)
    fixed_core: MachineVerdict = field(default_factory=lambda: machine_verdict([]))

    @property
    def chat_rungs(self) -> list[Rung]:
        return [r for r in self.rungs if r.target == "chat"]


def climb_slo(results: Results, config: str) -> dict[str, float] | None:
    """The SLO ``config`` climbed to (its load's ``climb``; None: not recorded)."""
    load = results.configs.get(config, {}).get("load") or {}
    climb = load.get("climb") if isinstance(load, dict) else None
    return parse_slo(climb) if climb else None


def climb_resolution(results: Results) -> float:
    """The coarsest resolution any configuration's climb bisected to (its load's
    ``resolution``, a setting; :data:`DEFAULT_RESOLUTION` where none is recorded): two
    knees closer than this are not told apart."""
    recorded = [
        float(load["resolution"])
        for described in results.configs.values()
        if isinstance(load := described.get("load"), dict) and load.get("resolution")
    ]
    return max(recorded, default=DEFAULT_RESOLUTION)


def rungs_of(results: Results, slo: dict[str, float] | None = None) -> list[Rung]:
    """The configurations that were climbed, in matrix order (runs that failed left out):
    each run's knee judged from its steps by this lab's rules (a results.json saved by an
    older lab keeps its measurements; the verdicts are read again) under ``slo``, or the
    SLO its configuration climbed to, or as the run recorded it where neither is known."""
    by_config: dict[str, list[tuple[Run, Knee]]] = {}
    for run in results.runs:
        if run.knee is None or run.status != "ok":
            continue
        judge_by = slo or climb_slo(results, run.config)
        knee = edge(run, judge_by, run.knee.room_size) if judge_by else run.knee
        by_config.setdefault(run.config, []).append((run, knee))
    rungs = []
    for config, judged in by_config.items():
        judged.sort(key=lambda pair: pair[0].repeat)
        runs = [run for run, _ in judged]
        knees = [knee for _, knee in judged]
        first = knees[0]
        rungs.append(
            Rung(
                config=config,
                target=runs[0].target,
                runs=runs,
                knees=[float(k.capacity_delivered_per_s) for k in knees],
                lower_bound=any(k.lower_bound for k in knees),
                driver_limited=any(k.driver_limited for k in knees),
                connections=first.connections,
                room_size=first.room_size,
                body_chars=first.body_chars,
                frame_bytes=first.frame_bytes,
                deflate=first.deflate,
                deflate_params=first.deflate_params,
                reruns=sum(k.reruns for k in knees),
                stalled_steps=sum(k.stalled_steps for k in knees),
                busy_reruns=sum(k.busy_reruns for k in knees),
                transport=runs[0].env.get("TRANSPORT", "websockets"),
                same_as=str(results.configs.get(config, {}).get("same_as") or ""),
                costs=costs_of(results, config),
                busy=[_knee_busy(r, k) for r, k in judged],
                driver_ceiling=_median_or_none([driver_ceiling(r) for r in runs]),
                sustained=[_sustained(r) for r in runs],
                step_s=max((s.duration_s for r in runs for s in climbed_steps(r)), default=0.0),
                relay_mode=runs[0].env.get("RELAY_MODE", ""),
            )
        )
        if rungs[-1].near_ceiling:
            rungs[-1].driver_limited = True
    order = {name: i for i, name in enumerate(results.configs)}
    rungs.sort(key=lambda r: order.get(r.config, len(order)))
    return rungs


def costs_of(results: Results, config: str) -> dict[float, Cost]:
    """``config``'s cost steps per offered rate: from the paired phase, one value per
    round, where it took part; else from its runs, one per repeat (in repeat order)."""
    paired = [r for r in results.paired if r.config == config and r.status == "ok"]
    if paired:
        rounds = 1 + max((s.pair_round or 0 for r in paired for s in r.steps), default=0)
        by_rate: dict[float, list[Step | None]] = {}
        for step in (s for r in paired for s in r.steps if s.cost and s.offered_per_s):
            assert step.offered_per_s is not None
            slots = by_rate.setdefault(step.offered_per_s, [None] * rounds)
            slots[step.pair_round or 0] = step
        return {rate: _cost(rate, steps, paired=True) for rate, steps in sorted(by_rate.items())}
    runs = sorted(
        (r for r in results.runs if r.config == config and r.status == "ok"),
        key=lambda r: r.repeat,
    )
    rates = sorted({s.offered_per_s for r in runs for s in r.steps if s.cost and s.offered_per_s})
    return {
        rate: _cost(
            rate,
            [next((s for s in r.steps if s.cost and s.offered_per_s == rate), None) for r in runs],
        )
        for rate in rates
    }


def _cost(rate: float, steps: list[Step | None], *, paired: bool = False) -> Cost:
    return Cost(
        rate=rate,
        values=[s.server_us_per_frame if s is not None else None for s in steps],
        delivered_per_s=[s.delivered_per_s if s is not None else 0.0 for s in steps],
        busy=[s is not None and is_busy(step_load(s)) for s in steps],
        held=[s is not None and s.holds({"p99": 100.0}) for s in steps],
        wire_bytes=[s.wire_bytes_per_delivery if s is not None else None for s in steps],
        paired=paired,
        stolen=[s is not None and voided("cpu_us_per_frame", core_step_load(s)) for s in steps],
    )


def _median_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def driver_ceiling(run: Run) -> float | None:
    """The delivered/s at which the driver would fill :data:`DRIVER_CORE_PERCENT` of its
    core at this run's shape: its core's busy share (its own CPU and the kernel's work
    there, such as the loopback's packets; its own CPU where it was not pinned) at its
    highest step that did not saturate it, scaled linearly to that share (acks, for the
    chat server, scale with the deliveries).
    The driver's CPU per frame falls as the rate rises (more per wake-up), so this
    under-estimates: a conservative ceiling, measured in the run at the rung's own shape
    (with deflate where the rung is driven so). Where the driver did saturate (its core
    full, or it waited for it: the loopback's kernel work runs there too), the lowest
    rate it saturated at bounds the estimate."""
    usable = [
        s
        for s in run.steps
        if s.driver == "fast"
        and not s.superseded
        and not s.generator_saturated
        and (s.generator_core_busy_percent or s.generator_cpu_percent)
        and s.delivered > 0
    ]
    saturated = [
        s.delivered_per_s
        for s in run.steps
        if s.driver == "fast" and not s.superseded and s.generator_saturated
    ]
    if not usable:
        return min(saturated, default=None)
    top = max(usable, key=lambda s: s.delivered_per_s)
    busy = top.generator_core_busy_percent or top.generator_cpu_percent
    assert busy is not None
    estimate = DRIVER_CORE_PERCENT / busy * top.delivered_per_s
    return min([estimate, *saturated])


def _sustained(run: Run) -> bool | None:
    """Whether ``run``'s sustained step held the SLO (None: it ran none)."""
    steps = [s for s in run.steps if s.sustain]
    if not steps:
        return None
    return all(s.holds({"p99": 100.0}) for s in steps)


def _knee_busy(run: Run, knee: Knee) -> bool:
    """Whether a step that decided ``knee`` (the best held, the first broken) was busy."""
    deciding = [
        s
        for s in climbed_steps(run)
        if (
            knee.capacity_delivered_per_s
            and round(s.delivered_per_s) == knee.capacity_delivered_per_s
            and s.holds({"p99": 100.0})
        )
        or (
            knee.first_break_offered_per_s is not None
            and s.offered_per_s == knee.first_break_offered_per_s
        )
    ]
    return any(step_busy(s) for s in deciding)


def noise_floor(rungs: list[Rung], results: Results) -> tuple[float, str]:
    """The relative difference below which two knees are not told apart, and its source;
    never below the climb's resolution (:func:`climb_resolution`)."""
    resolution = climb_resolution(results)
    by_name = {r.config: r for r in rungs}
    if len(results.aa_pair) >= 2 and all(n in by_name for n in results.aa_pair[:2]):
        a, b = (by_name[n] for n in results.aa_pair[:2])
        floor = pairwise_floor(a.knees, b.knees)
        if floor is not None and not (a.lower_bound or b.lower_bound):
            return max(floor, resolution), f"the A/A pair ({a.config} = {b.config})"
    spreads = [(r.spread, r.config) for r in rungs if not r.lower_bound and len(r.knees) > 1]
    if spreads:
        spread, name = max(spreads)
        if spread > resolution:
            return spread, f"the largest repeat-to-repeat spread ({name})"
    return resolution, "the climb's resolution (no rung moved more between repeats)"


def cost_floor(rungs: list[Rung], results: Results, rate: float) -> tuple[float, str] | None:
    """The floor of CPU µs per frame at ``rate``, and its source: the A/A pair's paired
    ratio's reach (:func:`bench.lab.pairs.floor_of`, over its paired rounds, or over its
    repeats where it was not paired), else the largest repeat-to-repeat spread of a rung
    there."""
    by_name = {r.config: r for r in rungs}
    if len(results.aa_pair) >= 2 and all(n in by_name for n in results.aa_pair[:2]):
        a, b = (by_name[n].costs.get(rate) for n in results.aa_pair[:2])
        if a is not None and b is not None and a.paired == b.paired:
            twin, original, left_out = unstolen(b.values, a.values, b.stolen, a.stolen)
            aa = paired_ratio(twin, original)
            floor = floor_of(aa)
            if floor is not None and aa is not None:
                what = "paired steps" if a.paired else "repeats"
                note = stolen_note(left_out)
                return floor, (
                    f"the A/A pair ({results.aa_pair[0]} = {results.aa_pair[1]}), {aa.n} {what}"
                    + (f"; {note}" if note else "")
                )
    spreads = [
        (max(c.known) / min(c.known) - 1, r.config)
        for r in rungs
        if (c := r.costs.get(rate)) is not None and len(c.known) > 1 and min(c.known) > 0
    ]
    if spreads:
        spread, name = max(spreads)
        return spread, f"the largest repeat-to-repeat spread ({name}; no A/A pair at this rate)"
    return None


def compare_costs(rung: Rung, reference: Rung, rate: float, floor: float) -> Comparison | None:
    """``rung``'s CPU µs per frame at ``rate`` against ``reference``'s, pair by pair
    (round i with round i of the paired phase, else repeat i with repeat i), judged by
    the paired ratio's interval against ``floor`` whatever the machine did
    (:func:`bench.lab.pairs.paired_verdict`; lower is better: "lower" means it costs
    less); None when either lacks the rate."""
    mine, theirs = rung.costs.get(rate), reference.costs.get(rate)
    if mine is None or theirs is None:
        return None
    return judge_costs(rung.config, reference.config, mine, theirs, floor=floor)


def judge_costs(
    config: str, reference: str, mine: Cost, theirs: Cost, *, floor: float | None
) -> Comparison:
    """Two cost series at ``rate`` compared pair by pair (:func:`compare_costs`)."""
    result = Comparison(config, reference, [], "not confirmed", figure="cost", rate=mine.rate)
    if mine.paired != theirs.paired:
        result.reason = "one was measured in the paired phase, the other in its runs: no pairs"
        return result
    xs, ys, left_out = unstolen(mine.values, theirs.values, mine.stolen, theirs.stolen)
    result.ratios = [
        a / b
        for a, b in zip(xs, ys, strict=False)
        if a is not None and b is not None and a > 0 and b > 0
    ]
    result.paired = paired_ratio(xs, ys)
    result.verdict, result.reason = paired_verdict(result.paired, floor)
    result.reason = "; ".join(r for r in (result.reason, stolen_note(left_out)) if r)
    return result


def compare(rung: Rung, reference: Rung, floor: float) -> Comparison:
    """``rung``'s knee against ``reference``'s, repeat i with repeat i."""
    pairs = [
        (a, b, busy_a or busy_b)
        for a, b, busy_a, busy_b in zip(
            rung.knees,
            reference.knees,
            rung.busy or [False] * len(rung.knees),
            reference.busy or [False] * len(reference.knees),
            strict=False,
        )
        if b > 0
    ]
    result = Comparison(
        rung.config, reference.config, [a / b for a, b, _ in pairs], "not confirmed"
    )
    result.lower_bound, result.upper_bound = rung.lower_bound, reference.lower_bound
    busy = any(busy for *_, busy in pairs)
    near = [r.config for r in (rung, reference) if r.near_ceiling]
    if near and pairs and not busy:
        result.reason = (
            f"{' and '.join(near)}: knee above {CEILING_SHARE:.0%} of the driver's ceiling "
            "(compared by CPU per frame instead)"
        )
        return result
    return _judge(result, floor, busy=busy)


def _judge(result: Comparison, floor: float, *, busy: bool) -> Comparison:
    """The verdict on knees' ratios: beyond ``floor`` in every repeat, on a real edge,
    no deciding step busy on the server's core; otherwise "not confirmed" with the
    reason."""
    ratios = result.ratios
    rung, reference = result.config, result.reference
    if not ratios:
        result.reason = "no repeat of both to compare"
        return result
    if busy:
        result.reason = CORE_BUSY
        return result
    above = [r > 1 + floor for r in ratios]
    below = [r < 1 / (1 + floor) for r in ratios]
    if all(above):
        # a higher claim stands on the reference's knee being a real edge
        if result.upper_bound:
            result.reason = f"{reference}'s knee is only a lower bound"
        else:
            result.verdict = "higher"
        return result
    if all(below):
        if result.lower_bound:
            result.reason = f"{rung}'s knee is only a lower bound"
        else:
            result.verdict = "lower"
        return result
    if result.lower_bound and result.upper_bound:
        result.reason = "both knees are only lower bounds (the driver was the limit)"
        return result
    within = [i + 1 for i, r in enumerate(ratios) if not (r > 1 + floor or r < 1 / (1 + floor))]
    if within:
        result.reason = f"within the {floor_text(floor)} floor in repeat " + ", ".join(
            map(str, within)
        )
    else:
        result.reason = "the repeats disagree on the direction"
    return result


def ladder(results: Results) -> Ladder | None:
    """The run's ladder, or None when nothing was climbed."""
    rungs = rungs_of(results)
    if not rungs:
        return None
    floor, source = noise_floor(rungs, results)
    baseline = next((r for r in rungs if r.config == results.baseline), None)
    if baseline is None:
        baseline = next((r for r in rungs if r.target == "chat"), None)
    relays = [r for r in rungs if r.target == "relay"]
    found = Ladder(rungs, baseline, relays, floor, source, climb_resolution(results))
    found.machine = machine_verdict(
        step_load(s)
        for rung in rungs
        for run in rung.runs
        for s in run.steps
        if s.driver == "fast" and not s.superseded
    )
    cost_steps = [s for r in (*results.paired, *results.runs) for s in r.steps if s.cost]
    found.cost_machine = machine_verdict(step_load(s) for s in cost_steps)
    found.cost_core = machine_verdict(core_step_load(s) for s in cost_steps)
    found.cost_stolen = sum(voided("cpu_us_per_frame", core_step_load(s)) for s in cost_steps)
    found.climb_core = machine_verdict(
        core_step_load(s) for rung in rungs for run in rung.runs for s in climbed_steps(run)
    )
    found.fixed_core = machine_verdict(
        core_step_load(s)
        for r in results.runs
        if r.knee is None
        for s in r.steps
        if s.driver == "fast" and not s.cost and not s.superseded
    )
    idle = [
        100 * s.idle_cpu_s / s.window_s
        for r in results.paired
        for s in r.steps
        if s.idle_cpu_s is not None and s.window_s > 0
    ]
    if idle:
        found.idle_percent = (statistics.fmean(idle), max(idle))
    found.paired_rounds = 1 + max(
        (s.pair_round or 0 for r in results.paired for s in r.steps), default=-1
    )
    for rung in found.chat_rungs:
        if baseline is not None and rung is not baseline:
            found.against_baseline[rung.config] = compare(rung, baseline, floor)
        found.against_relays[rung.config] = {
            relay.config: compare(rung, relay, floor) for relay in relays
        }
    for relay in sorted(relays, key=lambda r: r.median, reverse=True):
        found.floors.setdefault(relay.transport, relay)
    found.cost_rates = sorted({rate for r in rungs for rate in r.costs})
    for rate in found.cost_rates:
        measured = cost_floor(rungs, results, rate)
        if measured is not None:
            found.cost_floor[rate] = measured
    previous: Rung | None = None
    for rung in found.chat_rungs:
        twin = next((r for r in rungs if r.config == rung.same_as), None)
        relay = found.floors.get(rung.transport)
        for rate, (cost_floor_value, _) in found.cost_floor.items():
            pairs = [
                (found.cost_vs_previous, twin or previous),
                (found.cost_vs_baseline, baseline if rung is not baseline else None),
                (found.cost_vs_relay, relay),
            ]
            for table, reference in pairs:
                if reference is None:
                    continue
                verdict = compare_costs(rung, reference, rate, cost_floor_value)
                if verdict is not None:
                    table.setdefault(rung.config, {})[rate] = verdict
        if not rung.same_as:
            previous = rung
    found.profiling = profiling_costs(results, found)
    return found


def profiling_costs(results: Results, found: Ladder) -> list[Comparison]:
    """Each profiled configuration's CPU µs per frame against its unprofiled twin (the
    same settings; the baseline first) at the same offered rate, pair by pair (the paired
    phase's rounds where both took part, else repeat by repeat), judged against that
    rate's cost floor (:func:`bench.lab.pairs.paired_verdict`)."""
    out = []
    for name, described in results.configs.items():
        if not described.get("profile"):
            continue
        twins = [
            other
            for other, d in results.configs.items()
            if not d.get("profile") and d.get("env") == described.get("env") and other != name
        ]
        twins.sort(key=lambda other: other != results.baseline)
        runs = sorted(
            (r for r in results.runs if r.config == name and r.status == "ok"),
            key=lambda r: r.repeat,
        )
        mine = costs_of(results, name)
        paired = next(
            (
                (twin, rate)
                for twin in twins
                for rate, cost in mine.items()
                if cost.paired
                and costs_of(results, twin).get(rate, cost).paired
                and rate in costs_of(results, twin)
            ),
            None,
        )
        if paired is not None:
            twin, rate = paired
            floor = found.cost_floor.get(rate)
            out.append(
                judge_costs(
                    name,
                    twin,
                    mine[rate],
                    costs_of(results, twin)[rate],
                    floor=floor[0] if floor else None,
                )
            )
            continue
        for twin in twins:
            twin_runs = sorted(
                (r for r in results.runs if r.config == twin and r.status == "ok"),
                key=lambda r: r.repeat,
            )
            comparison = _profiled_against(name, runs, twin, twin_runs, found)
            if comparison is not None:
                out.append(comparison)
                break
    return out


def _profiled_against(
    name: str, runs: list[Run], twin: str, twin_runs: list[Run], found: Ladder
) -> Comparison | None:
    """``name``'s fast steps against ``twin``'s at the first offered rate both ran."""
    for step in (s for r in runs[:1] for s in r.steps if s.driver == "fast"):
        rate = step.offered_per_s
        mine = [_at_rate(r, rate) for r in runs]
        theirs = [_at_rate(r, rate) for r in twin_runs]
        if not any(theirs):
            continue
        pairs = [
            (a, b)
            for a, b in zip(mine, theirs, strict=False)
            if a is not None and b is not None and a.server_us_per_frame and b.server_us_per_frame
        ]
        comparison = Comparison(
            name,
            twin,
            [a.server_us_per_frame / b.server_us_per_frame for a, b in pairs],  # type: ignore[operator]
            "not confirmed",
            figure="cost",
        )
        comparison.rate = rate or 0.0
        floor = found.cost_floor.get(rate or 0.0)
        comparison.paired = paired_ratio(
            [a.server_us_per_frame for a, _ in pairs], [b.server_us_per_frame for _, b in pairs]
        )
        comparison.verdict, comparison.reason = paired_verdict(
            comparison.paired, floor[0] if floor else None
        )
        return comparison
    return None


def _at_rate(run: Run, rate: float | None) -> Step | None:
    """``run``'s fast step at offered ``rate`` (a cost step first; never a superseded one)."""
    steps = [
        s for s in run.steps if s.driver == "fast" and s.offered_per_s == rate and not s.superseded
    ]
    steps.sort(key=lambda s: not s.cost)
    return steps[0] if steps else None


def floor_text(floor: float) -> str:
    """A floor as every section quotes it: ``±4.2 %``."""
    return f"±{floor * 100:.1f} %"


def delivered_label(rate: float, room_size: int) -> str:
    """A cost rate (sends/s) as the delivered frames/s it offers: ``10k delivered/s``."""
    delivered = rate * (room_size or 1)
    text = f"{delivered / 1000:.3g}k" if delivered >= 1000 else f"{delivered:g}"
    return f"{text} delivered/s"


def deflate_label(deflate: bool, params: str) -> str:
    """How a rung's driver talked to it: "off", or what the server's
    ``Sec-WebSocket-Extensions`` reply negotiated (context takeover or not, window)."""
    if not deflate:
        return "off"
    if not params:
        return "on (negotiated)"  # results written before the driver kept the reply
    if "server_no_context_takeover" in params:
        kind = "no context takeover (shared)"
    else:
        kind = "context takeover (on)"
    bits = re.search(r"server_max_window_bits=(\d+)", params)
    return f"{kind}, window 2^{bits.group(1)}" if bits else kind


def by_connections(found: Ladder) -> dict[int, list[Rung]]:
    """The rungs grouped by connection count (a ``capacity --connections 200,2000`` sweep)."""
    groups: dict[int, list[Rung]] = {}
    for rung in found.rungs:
        groups.setdefault(rung.connections, []).append(rung)
    return dict(sorted(groups.items()))
