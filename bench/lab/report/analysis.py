"""What the tables show: each configuration's steps grouped, summarised over repeats
(medians with min-max) and compared, with the A/A pair's noise floor."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.lab.ladder import Ladder, ladder, pairwise_floor
from bench.lab.machine import MachineVerdict, machine_verdict
from bench.lab.pairs import step_busy, step_load
from bench.lab.plots import Spread, StepKey, compared_steps, samples_during, spread
from bench.lab.report.formatting import GENERATOR_LIMITED
from bench.lab.results import HEADLINE_SLO_MS, SEED_SLO_MS, Results, Run, Step

_MIB = 2**20
LATENCIES = ("p50", "p90", "p95", "p99", "max")
#: the figures compared with the baseline and the A/A pair: key -> column title
RATIO_FIGURES = {
    "p50": "p50",
    "p90": "p90",
    "p95": "p95",
    "p99": "p99",
    "max": "max",
    "delivered_per_s": "delivered/s",
    "cpu_mean": "server CPU",
    "cpu_us_per_frame": "CPU µs/frame",
    "rss_peak_mib": "peak RSS",
}


@dataclass
class Row:
    """One configuration at one compared step, over its repeats."""

    config: str
    target: str
    pairs: list[tuple[Run, Step]]
    figures: dict[str, Spread | None]
    whole_run_samples: bool  # CPU and RSS are the whole run's: the step's start is unknown
    errors: int
    error_detail: dict[str, int]
    headline_held: int  # repeats that held the headline SLO
    seed_held: int
    limited: list[tuple[Run, Step]]
    # each figure per repeat, in repeat order (what the A/A floor pairs up)
    values: dict[str, list[float | None]] = field(default_factory=dict)
    # a step's server core was busy (bench.lab.ladder.step_busy): what it voids is not
    # confirmed (bench.lab.pairs.FIGURE_BOUNDS)
    busy: bool = False


@dataclass
class Analysis:
    """Everything the report's sections need, computed once."""

    results: Results
    rows: dict[StepKey, dict[str, Row]]
    noise_floor: dict[StepKey, dict[str, float]]  # fraction: 0.05 is 5 %
    ladder: Ladder | None = None  # the climbs' knees and costs, with their floors
    # the machine around every fast-driver step (the ladder's own when there are climbs)
    machine: MachineVerdict = field(default_factory=lambda: machine_verdict([]))
    footnotes: list[str] = field(default_factory=list)
    marks: dict[tuple[StepKey, str], str] = field(default_factory=dict)


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _row(config: str, pairs: list[tuple[Run, Step]]) -> Row:
    values: dict[str, list[float | None]] = {}
    whole_run = False
    errors = Counter[str]()
    for run, step in pairs:
        server, inside = samples_during(run, "server", step)
        whole_run |= bool(server) and not inside
        cpu = [s.cpu_percent for s in server]
        figures = {p: step.latency_ms.get(p) for p in LATENCIES}
        figures |= {
            "sent_per_s": step.sent_per_s,
            "delivered_per_s": step.delivered_per_s,
            "cpu_mean": statistics.fmean(cpu) if cpu else None,
            # server CPU per delivered frame: what one frame to one member costs the server,
            # over the step's exact window when the driver read it, else from the samples
            "cpu_us_per_frame": (
                step.server_us_per_frame
                if step.server_us_per_frame is not None
                else statistics.fmean(cpu) * 1e4 / step.delivered_per_s
                if cpu and step.delivered_per_s
                else None
            ),
            "cpu_p10": _percentile(cpu, 10),
            "cpu_p90": _percentile(cpu, 90),
            "rss_peak_mib": max(s.rss_bytes for s in server) / _MIB if server else None,
        }
        for name, value in figures.items():
            values.setdefault(name, []).append(value)
        errors.update(step.error_detail)
    return Row(
        config=config,
        target=pairs[0][0].target,
        pairs=pairs,
        figures={name: spread(v) for name, v in values.items()},
        whole_run_samples=whole_run,
        errors=sum(s.errors for _, s in pairs),
        error_detail=dict(errors),
        headline_held=sum(s.holds(HEADLINE_SLO_MS) for _, s in pairs),
        seed_held=sum(s.holds(SEED_SLO_MS) for _, s in pairs),
        limited=[(r, s) for r, s in pairs if s.generator_limited],
        values=values,
        busy=any(step_busy(s) for _, s in pairs),
    )


def analyse(results: Results) -> Analysis:
    """Group, summarise and compare every configuration's steps."""
    rows = {
        key: {config: _row(config, pairs) for config, pairs in by_config.items()}
        for key, by_config in compared_steps(results).items()
    }
    floor: dict[StepKey, dict[str, float]] = {}
    if len(results.aa_pair) >= 2:
        first, second = results.aa_pair[:2]
        for key, by_config in rows.items():
            if first not in by_config or second not in by_config:
                continue
            for name in RATIO_FIGURES:
                value = pairwise_floor(
                    by_config[first].values.get(name, []), by_config[second].values.get(name, [])
                )
                if value is not None:
                    floor.setdefault(key, {})[name] = value
    found = ladder(results)
    if found is not None:
        # CPU per frame at a cost rate has one floor, the ladder's, in every section
        for key in rows:
            cost = found.cost_floor.get(key.offered_per_s or 0.0)
            if key.name.startswith("cost ") and cost is not None:
                floor.setdefault(key, {})["cpu_us_per_frame"] = cost[0]
    machine = (
        found.machine
        if found is not None
        else machine_verdict(
            step_load(step)
            for run in results.runs
            for step in run.steps
            if step.driver == "fast" and not step.superseded
        )
    )
    analysis = Analysis(results, rows, floor, found, machine=machine)
    for key, by_config in rows.items():
        for config, row in by_config.items():
            refs = []
            for run, step in row.limited:
                analysis.footnotes.append(_limited_note(config, key, run, step))
                refs.append(f"[{len(analysis.footnotes)}]")
            if refs:
                analysis.marks[key, config] = f" {GENERATOR_LIMITED}{''.join(refs)}"
    return analysis


def _limited_note(config: str, key: StepKey, run: Run, step: Step) -> str:
    notes = "; ".join(step.generator_notes) or "no notes"
    cpu = step.generator_cpu_percent
    cpu_text = f", generator CPU {cpu:.0f} %" if cpu is not None else ""
    return (
        f"{config}, {key.title}, repeat {run.repeat + 1}: the load generator was the limit "
        f"({notes}{cpu_text}); this step measures the generator as much as the server."
    )
