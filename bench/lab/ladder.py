"""The capacity ladder: each configuration's knee over its repeats, and what may be claimed.

A configuration climbed by the fast driver (``Run.knee``, :func:`bench.lab.results.edge`)
has one knee per repeat: the highest delivered/s that held the SLO. This module turns them
into rungs (median, min-max, whether the knee is only a lower bound), compares each rung
with the baseline and with the relays, and writes the findings the report opens with.

What may be claimed: a rung is better or worse than the baseline only when the difference
holds in *every* repeat (repeat i against the baseline's repeat i) and exceeds the noise
floor: the A/A pair's own difference when the matrix has one, else the largest
repeat-to-repeat spread of any rung that is not a lower bound, and never less than the
climb's resolution. Otherwise it is "not confirmed", with the reason. A knee that is a
lower bound (the driver was the limit, or nothing broke up to the climb's top rate) makes
a "higher" claim a lower bound and a "lower" claim impossible.

No I/O: the report draws and renders what this returns.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench.lab.results import Results, Run, edge, parse_slo

#: the climb's bisection resolution: two knees closer than this are not told apart
RESOLUTION = 0.05
DASH = "\u2013"  # en dash: between the ends of a range
TIMES = "\u00d7"  # multiplication sign: before a ratio


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
    reruns: int = 0  # steps run again because they stalled
    stalled_steps: int = 0

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
    lower_bound: bool = False  # the ratio is only a lower bound (this rung's knee is)
    upper_bound: bool = False  # the ratio is only an upper bound (the reference's knee is)

    @property
    def median(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 0.0

    def ratio_text(self) -> str:
        """The median ratio and its range over the repeats, "≥" when a lower bound."""
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
    against_baseline: dict[str, Comparison] = field(default_factory=dict)
    against_relays: dict[str, dict[str, Comparison]] = field(default_factory=dict)

    @property
    def chat_rungs(self) -> list[Rung]:
        return [r for r in self.rungs if r.target == "chat"]


def rungs_of(results: Results) -> list[Rung]:
    """The configurations that were climbed, in matrix order (runs that failed left out)."""
    by_config: dict[str, list[Run]] = {}
    for run in results.runs:
        if run.knee and run.status == "ok":
            _rejudge(run, results)
            by_config.setdefault(run.config, []).append(run)
    rungs = []
    for config, runs in by_config.items():
        runs.sort(key=lambda r: r.repeat)
        knees = [r.knee for r in runs]
        first = knees[0]
        rungs.append(
            Rung(
                config=config,
                target=runs[0].target,
                runs=runs,
                knees=[float(k["capacity_delivered_per_s"]) for k in knees],
                lower_bound=any(k.get("lower_bound") for k in knees),
                driver_limited=any(
                    k.get("driver_limited", k.get("generator_limited_at_edge")) for k in knees
                ),
                connections=int(first.get("connections") or 0),
                room_size=int(first.get("room_size") or 0),
                body_chars=int(first.get("body_chars") or 0),
                frame_bytes=int(first.get("frame_bytes") or 0),
                deflate=bool(first.get("deflate")),
                reruns=sum(int(k.get("reruns") or 0) for k in knees),
                stalled_steps=sum(int(k.get("stalled_steps") or 0) for k in knees),
            )
        )
    order = {name: i for i, name in enumerate(results.configs)}
    rungs.sort(key=lambda r: order.get(r.config, len(order)))
    return rungs


def _rejudge(run: Run, results: Results) -> None:
    """Judge the run's climb from its steps with this lab's rules (a results.json saved by
    an older lab keeps its measurements; the verdicts are read again), under the SLO its
    configuration climbed to."""
    load = results.configs.get(run.config, {}).get("load") or {}
    climb = load.get("climb") if isinstance(load, dict) else None
    if climb:
        run.knee = {**run.knee, **edge(run, parse_slo(climb))}


def noise_floor(rungs: list[Rung], results: Results) -> tuple[float, str]:
    """The relative difference below which two knees are not told apart, and its source."""
    by_name = {r.config: r for r in rungs}
    if len(results.aa_pair) >= 2 and all(n in by_name for n in results.aa_pair[:2]):
        a, b = (by_name[n] for n in results.aa_pair[:2])
        diffs = [
            max(x, y) / min(x, y) - 1 for x, y in zip(a.knees, b.knees, strict=False) if x and y
        ]
        if diffs:
            return max(*diffs, RESOLUTION), f"the A/A pair ({a.config} = {b.config})"
    spreads = [(r.spread, r.config) for r in rungs if not r.lower_bound and len(r.knees) > 1]
    if spreads:
        spread, name = max(spreads)
        if spread > RESOLUTION:
            return spread, f"the largest repeat-to-repeat spread ({name})"
    return RESOLUTION, "the climb's resolution (no rung moved more between repeats)"


def compare(rung: Rung, reference: Rung, floor: float) -> Comparison:
    """``rung`` against ``reference``, repeat i with repeat i."""
    pairs = [(a, b) for a, b in zip(rung.knees, reference.knees, strict=False) if b > 0]
    ratios = [a / b for a, b in pairs]
    result = Comparison(rung.config, reference.config, ratios, "not confirmed")
    result.lower_bound, result.upper_bound = rung.lower_bound, reference.lower_bound
    if not ratios:
        result.reason = "no repeat of both to compare"
        return result
    above = [r > 1 + floor for r in ratios]
    below = [r < 1 / (1 + floor) for r in ratios]
    if all(above):
        # a higher claim stands on the reference's knee being a real edge
        if reference.lower_bound:
            result.reason = f"{reference.config}'s knee is only a lower bound"
        else:
            result.verdict = "higher"
        return result
    if all(below):
        if rung.lower_bound:
            result.reason = f"{rung.config}'s knee is only a lower bound"
        else:
            result.verdict = "lower"
        return result
    if rung.lower_bound and reference.lower_bound:
        result.reason = "both knees are only lower bounds (the driver was the limit)"
        return result
    within = [i + 1 for i, r in enumerate(ratios) if not (r > 1 + floor or r < 1 / (1 + floor))]
    if within:
        result.reason = f"within the ±{floor * 100:.0f} % floor in repeat " + ", ".join(
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
    found = Ladder(rungs, baseline, relays, floor, source)
    for rung in found.chat_rungs:
        if baseline is not None and rung is not baseline:
            found.against_baseline[rung.config] = compare(rung, baseline, floor)
        found.against_relays[rung.config] = {
            relay.config: compare(rung, relay, floor) for relay in relays
        }
    return found


def findings(found: Ladder) -> list[str]:
    """The sentences the report opens with: what held, what differed, what is unconfirmed."""
    sentences: list[str] = []
    base = found.baseline
    shape = _shape(found.rungs)
    if base is not None:
        sentences.append(
            f"{shape}: the baseline {base.config} held {base.label()} delivered/s "
            f"(median of {len(base.knees)}; {base.low:,.0f}{DASH}{base.high:,.0f})."
        )
    higher = [c for c in found.against_baseline.values() if c.verdict == "higher"]
    lower = [c for c in found.against_baseline.values() if c.verdict == "lower"]
    unconfirmed = [c for c in found.against_baseline.values() if c.verdict == "not confirmed"]
    if higher or lower:
        parts = [f"{c.config} {c.ratio_text()}" for c in higher + lower]
        sentences.append(
            f"Confirmed against the baseline (every repeat, beyond the ±{found.floor * 100:.0f} % "
            f"noise floor): {'; '.join(parts)}."
        )
    if unconfirmed:
        parts = [f"{c.config} ({c.ratio_text()}: {c.reason})" for c in unconfirmed]
        sentences.append(f"Not confirmed: {'; '.join(parts)}.")
    limited = [r.config for r in found.chat_rungs if r.driver_limited]
    if limited:
        sentences.append(
            f"The fast driver itself was the limit for {', '.join(limited)}: "
            "their knees are lower bounds, and so is any multiple of them."
        )
    for relay in found.relays:
        parts = []
        for rung in found.chat_rungs:
            comparison = found.against_relays.get(rung.config, {}).get(relay.config)
            if comparison is not None and comparison.ratios:
                doubt = "" if comparison.verdict != "not confirmed" else " (not confirmed)"
                parts.append(f"{rung.config} {comparison.ratio_text()}{doubt}")
        if parts:
            sentences.append(
                f"Against the ceiling {relay.config} ({relay.label()} delivered/s): "
                + "; ".join(parts)
                + "."
            )
    reruns = sum(r.reruns for r in found.rungs)
    stalled = sum(r.stalled_steps for r in found.rungs)
    if stalled:
        sentences.append(
            f"{stalled} climb step(s) showed a stall (a second over "
            f"10{TIMES} the step's median p99, "
            f"or with no delivery); {reruns} were run again and the re-run decided."
        )
    else:
        sentences.append("No climb step showed a stall.")
    return sentences


def _shape(rungs: list[Rung]) -> str:
    """ "At 2,000 connections in rooms of 10 (60-character bodies, 95-byte frames)"."""
    counts = sorted({r.connections for r in rungs if r.connections})
    sizes = sorted({r.room_size for r in rungs if r.room_size})
    frames = sorted({r.frame_bytes for r in rungs if r.frame_bytes})
    bodies = sorted({r.body_chars for r in rungs if r.body_chars})
    where = " and ".join(f"{n:,}" for n in counts) or "?"
    text = f"At {where} connections in rooms of {'/'.join(map(str, sizes)) or '?'}"
    details = []
    if bodies:
        details.append(f"{'/'.join(map(str, bodies))}-character bodies")
    if frames:
        details.append(
            DASH.join(map(str, (frames[0], frames[-1]) if len(frames) > 1 else frames))
            + "-byte send frames"
        )
    return text + (f" ({', '.join(details)})" if details else "")


def by_connections(found: Ladder) -> dict[int, list[Rung]]:
    """The rungs grouped by connection count (a ``capacity --connections 200,2000`` sweep)."""
    groups: dict[int, list[Rung]] = {}
    for rung in found.rungs:
        groups.setdefault(rung.connections, []).append(rung)
    return dict(sorted(groups.items()))
