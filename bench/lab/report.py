"""The lab report: ``report.md``, a self-contained ``report.html`` and PNGs from a Results.

Both documents are rendered from the same blocks (headings, paragraphs, tables, images),
so they always hold the same figures; the HTML has its CSS inline and every image as a
``data:`` URI, so it opens offline and can be mailed as one file. Every figure names
the driver that measured it; medians are over repeats, with their min-max spread; a
ratio to the baseline within the A/A noise floor or the repeats' spread reads
"≈ no difference". Re-render a saved run::

    python -m bench.lab.report reports/<time>-<matrix>/results.json [--out DIR]
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import logging
import math
import re
import statistics
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.lab.ladder import (
    RESOLUTION,
    Comparison,
    Rung,
    by_connections,
    compare,
    findings,
    ladder,
)
from bench.lab.plots import (
    DRIVER_TITLES,
    Plot,
    Spread,
    StepKey,
    compared_steps,
    config_names,
    draw_all,
    samples_during,
    server_tail,
    spread,
)
from bench.lab.results import HEADLINE_SLO_MS, SEED_SLO_MS, Results, Run, Step
from bench.lab.tailwatch import likely_cause

logger = logging.getLogger(__name__)

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
    "rss_peak_mib": "peak RSS",
}
TOP_FUNCTIONS = 15
NO_DIFFERENCE = "≈ no difference"
DASH = "\u2013"  # en dash: between the ends of a range
TIMES = "\u00d7"  # multiplication sign: before a ratio
EMPTY = DASH  # a cell with no figure
GENERATOR_LIMITED = "⚠"


# --- blocks: each section is built once, rendered twice ----------------------------------


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Image:
    file: Path  # where the PNG is
    rel: str  # its path relative to the report
    alt: str


@dataclass
class Code:
    text: str


@dataclass
class Markdown:
    """Markdown made elsewhere (profiles.markdown_table); the HTML side reads its table."""

    text: str


Block = Heading | Para | Bullets | Table | Image | Code | Markdown


# --- what the tables show ---------------------------------------------------------------


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


@dataclass
class Analysis:
    """Everything the report's sections need, computed once."""

    results: Results
    rows: dict[StepKey, dict[str, Row]]
    noise_floor: dict[StepKey, dict[str, float]]  # fraction: 0.05 is 5 %
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
            # server CPU per delivered frame: what one frame to one member costs the server
            "cpu_us_per_frame": (
                statistics.fmean(cpu) * 1e4 / step.delivered_per_s
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
                a = by_config[first].figures.get(name)
                b = by_config[second].figures.get(name)
                if a is None or b is None:
                    continue
                low, high = sorted((a.median, b.median))
                if low > 0:
                    floor.setdefault(key, {})[name] = high / low - 1
                elif high == 0:
                    floor.setdefault(key, {})[name] = 0.0
    analysis = Analysis(results, rows, floor)
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


# --- formatting -------------------------------------------------------------------------


def _num(x: float | None) -> str:
    if x is None or math.isnan(x):
        return EMPTY
    size = abs(x)
    if size >= 1000:
        return f"{x:,.0f}"
    if size >= 100:
        return f"{x:.0f}"
    if size >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _count(x: float) -> str:
    """A counter's value: whole numbers without decimals, others as :func:`_num`."""
    return f"{int(x):,}" if float(x).is_integer() else _num(x)


def _spread_cell(figure: Spread | None) -> str:
    if figure is None:
        return EMPTY
    if figure.n > 1 and figure.low != figure.high:
        return f"{_num(figure.median)} ({_num(figure.low)}{DASH}{_num(figure.high)})"
    return _num(figure.median)


def _verdict(held: int, n: int) -> str:
    return f"✓ {held}/{n}" if held == n else f"✗ {held}/{n}"


def ratio_cell(figure: Spread | None, base: Spread | None, floor: float | None) -> str:
    """The ratio of medians with its range from the repeats' min-max, or "≈ no difference"
    when the ratio is within the noise floor or the two ranges overlap."""
    if figure is None or base is None or base.median <= 0:
        return EMPTY
    ratio = figure.median / base.median
    low = figure.low / base.high if base.high > 0 else ratio
    high = figure.high / base.low if base.low > 0 else ratio
    overlaps = (figure.n > 1 or base.n > 1) and low <= 1 <= high
    in_floor = floor is not None and 1 / (1 + floor) <= ratio <= 1 + floor
    if overlaps or in_floor:
        return f"{NO_DIFFERENCE} ({TIMES}{ratio:.2f})"
    if f"{low:.2f}" != f"{high:.2f}":
        return f"{TIMES}{ratio:.2f} ({low:.2f}{DASH}{high:.2f})"
    return f"{TIMES}{ratio:.2f}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min {secs} s"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def _value(value: Any) -> str:
    if value is None:
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return _count(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "config"


# --- sections ---------------------------------------------------------------------------


def _inline(value: Any) -> str:
    """A settings value on one line: dicts as "key value, ...", lists comma-separated."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_inline(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return _value(value)


# keys of Results.configs entries with a column of their own
_DESCRIBED_APART = frozenset({"env", "description", "target", "load", "same_as"})


def _common(dicts: Sequence[Any]) -> dict[str, Any]:
    """The items every dict shares; {} unless all are dicts."""
    if not dicts or not all(isinstance(d, dict) for d in dicts):
        return {}
    return {k: v for k, v in dicts[0].items() if all(d.get(k) == v for d in dicts)}


def _given(items: dict[str, Any]) -> dict[str, Any]:
    """``items`` without the empty ones (None, "", False)."""
    return {k: v for k, v in items.items() if v not in (None, "", False)}


def _header(results: Results) -> list[Block]:
    runs = results.runs
    names = config_names(results)
    not_ok = [r for r in runs if r.status != "ok"]
    machine = "; ".join(f"{k} {_inline(v)}" for k, v in results.machine.items())
    common_load = _common([d.get("load") for d in results.configs.values()])
    common = _common(
        [
            {k: v for k, v in d.items() if k not in _DESCRIBED_APART}
            for d in results.configs.values()
        ]
    )
    facts = [
        f"matrix: {results.matrix}",
        f"started: {results.started}",
        f"duration: {_duration(results.duration_s)}",
        f"machine: {machine or 'not recorded'}",
        f"runs: {len(names)} configurations, {results.repeat} repeat(s) each, interleaved; "
        f"{len(runs)} runs, {len(not_ok)} not ok",
        f"baseline: {results.baseline}; A/A pair: {' = '.join(results.aa_pair) or 'none'}",
        "interrupted: yes \u2014 figures cover only the runs that finished"
        if results.interrupted
        else "interrupted: no",
    ]
    if _given(common_load):
        facts.append(f"load (every configuration unless noted): {_inline(_given(common_load))}")
    if _given(common):
        facts.append(f"every configuration: {_inline(_given(common))}")
    blocks: list[Block] = [
        Heading(1, f"Lab report: {results.matrix}"),
        Bullets(facts),
        Para("Command:"),
        Code(results.command or "(not recorded)"),
        Heading(2, "Configurations"),
    ]
    targets = {r.config: r.target for r in runs}
    table = []
    for name in names:
        description = dict(results.configs.get(name, {}))
        env = description.pop("env", None) or next((r.env for r in runs if r.config == name), {})
        text = str(description.pop("description", "") or "")
        target = description.pop("target", targets.get(name, "chat"))
        load = description.pop("load", None) or {}
        notes = [
            f"same as {v}" if k == "same_as" else f"{k} {_inline(v)}"
            for k, v in _given(description).items()
            if k not in common
        ]
        notes += [
            f"load {k} {_inline(v) if v not in (None, '') else '(none)'}"
            for k, v in load.items()
            if k not in common_load
        ]
        table.append(
            [
                name,
                str(target),
                " ".join(f"{k}={v}" for k, v in env.items()) or "defaults",
                "; ".join(notes),
                text,
            ]
        )
    blocks.append(Table(["configuration", "target", "settings", "notes", "description"], table))
    for run in not_ok:
        blocks.append(Para(f"{run.config}, repeat {run.repeat + 1}: {run.status}."))
        if run.error:
            blocks.append(Code(run.error.strip()))
    return blocks


def _slos() -> list[Block]:
    headline = ", ".join(f"{p} < {v:g} ms" for p, v in HEADLINE_SLO_MS.items())
    seed = ", ".join(f"{p} < {v:g} ms" for p, v in SEED_SLO_MS.items())
    return [
        Heading(2, "Service level objectives"),
        Table(
            ["SLO", "bounds on fan-out latency", "source"],
            [
                ["headline", headline, "this lab: what the chat server must hold"],
                ["seed", seed, "the seed report's, shown beside it"],
            ],
        ),
        Para(
            "A step holds an SLO when every named percentile is under its bound and no "
            "message was lost (every message reached every room member). Verdicts read "
            "✓ n/n when every repeat held, otherwise ✗ with how many repeats held."
        ),
    ]


def _noise_floor(analysis: Analysis) -> list[Block]:
    results = analysis.results
    blocks: list[Block] = [Heading(2, "Noise floor (A/A pair)")]
    if len(results.aa_pair) < 2 or not analysis.noise_floor:
        blocks.append(
            Para(
                "No A/A pair with data in these results: no noise floor; ratios are judged "
                "by the repeats' spread only."
            )
        )
        return blocks
    first, second = results.aa_pair[:2]
    worst = max(
        (
            (f, key, name)
            for key, floors in analysis.noise_floor.items()
            for name, f in floors.items()
        ),
        key=lambda x: x[0],
    )
    blocks.append(
        Para(
            f"Noise floor: {first} and {second} have identical settings, so their difference "
            f"is noise. The largest difference between them in a headline figure is "
            f"±{worst[0] * 100:.1f} % ({RATIO_FIGURES[worst[2]]}, {worst[1].title}). A ratio "
            "to the baseline within its own figure's floor below reads "
            f'"{NO_DIFFERENCE}".'
        )
    )
    table = [
        [key.title] + [_floor_cell(floors.get(name)) for name in RATIO_FIGURES]
        for key, floors in analysis.noise_floor.items()
    ]
    blocks.append(Table(["step (driver)", *RATIO_FIGURES.values()], table))
    return blocks


def _floor_cell(value: float | None) -> str:
    return EMPTY if value is None else f"±{value * 100:.1f} %"


def _driver_tables(analysis: Analysis) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Results by driver")]
    if not analysis.rows:
        blocks.append(Para("No run produced a step: nothing to tabulate."))
        return blocks
    blocks.append(
        Para(
            "One table per driver step: the fast driver is open loop (a fixed offered rate), "
            "Locust closed loop (users wait between sends), so their figures are never "
            "compared with each other. Cells are medians over repeats with (min-max). "
            "Latencies are fan-out latencies in ms measured by the named driver; sent/s and "
            "delivered/s by the same driver; CPU (% of one core, mean and p10-p90 of the "
            "0.5 s samples) and peak RSS by the lab's psutil sampler of the server process; "
            "CPU µs per delivered frame is the mean CPU over the delivered frames/s (for the "
            "relay, its own cost per frame)."
        )
    )
    whole_run_note = False
    for key, by_config in analysis.rows.items():
        blocks.append(Heading(3, key.title))
        table = []
        for config, row in by_config.items():
            f = row.figures
            cpu = _num(f["cpu_mean"].median) if f.get("cpu_mean") else EMPTY
            if f.get("cpu_p10") and f.get("cpu_p90"):
                cpu += f" ({_num(f['cpu_p10'].median)}{DASH}{_num(f['cpu_p90'].median)})"
            if row.whole_run_samples:
                cpu += " †"
                whole_run_note = True
            errors = str(row.errors)
            if row.error_detail:
                errors += (
                    " (" + ", ".join(f"{k} {v}" for k, v in sorted(row.error_detail.items())) + ")"
                )
            name = config + (" (relay)" if row.target == "relay" else "")
            table.append(
                [
                    name + analysis.marks.get((key, config), ""),
                    str(len(row.pairs)),
                    *(_spread_cell(f.get(p)) for p in LATENCIES),
                    _spread_cell(f.get("sent_per_s")),
                    _spread_cell(f.get("delivered_per_s")),
                    cpu,
                    _spread_cell(f.get("cpu_us_per_frame")),
                    _spread_cell(f.get("rss_peak_mib")),
                    errors,
                    _verdict(row.headline_held, len(row.pairs)),
                    _verdict(row.seed_held, len(row.pairs)),
                ]
            )
        blocks.append(
            Table(
                [
                    "configuration",
                    "repeats",
                    *(f"{p} ms" for p in LATENCIES),
                    "sent/s",
                    "delivered/s",
                    "server CPU % mean (p10-p90)",
                    "server CPU µs per delivered frame",
                    "peak RSS MiB",
                    "errors (all repeats)",
                    "headline p99 < 100 ms",
                    "seed SLO",
                ],
                table,
            )
        )
        blocks += _ratio_table(analysis, key, by_config)
    notes = [f"[{i}] {text}" for i, text in enumerate(analysis.footnotes, 1)]
    if notes:
        blocks.append(Para(f"{GENERATOR_LIMITED} generator-limited steps:"))
        blocks.append(Bullets(notes))
    if whole_run_note:
        blocks.append(
            Para(
                "† CPU and RSS over the whole run (all its steps): the step's start time "
                "was not recorded (Step.started_s)."
            )
        )
    return blocks


def _ratio_table(analysis: Analysis, key: StepKey, by_config: dict[str, Row]) -> list[Block]:
    baseline = analysis.results.baseline
    base = by_config.get(baseline)
    if base is None:
        return [Para(f"Ratios: the baseline {baseline} has no {key.title} step.")]
    floors = analysis.noise_floor.get(key, {})
    table = []
    for config, row in by_config.items():
        if config == baseline:
            continue
        table.append(
            [
                config + analysis.marks.get((key, config), ""),
                *(
                    ratio_cell(row.figures.get(n), base.figures.get(n), floors.get(n))
                    for n in RATIO_FIGURES
                ),
            ]
        )
    if not table:
        return []
    return [
        Para(
            f"Ratio to the baseline {baseline} ({key.title}): ratio of medians, with the "
            "range the repeats' min-max allow; above 1 means more (slower latency, more "
            f'throughput, more CPU or memory). "{NO_DIFFERENCE}": within the A/A noise '
            "floor or the repeats' spread."
        ),
        Table([f"configuration / {baseline}", *RATIO_FIGURES.values()], table),
    ]


def _best_holding(rows: dict[StepKey, dict[str, Row]], config: str) -> tuple[StepKey, Row] | None:
    """The fast-driver step with the most delivered/s that held the headline SLO in every repeat."""
    best: tuple[StepKey, Row] | None = None
    for key, by_config in rows.items():
        row = by_config.get(config)
        if key.driver != "fast" or row is None or row.headline_held < len(row.pairs):
            continue
        delivered = row.figures.get("delivered_per_s")
        if delivered is None:
            continue
        best_figure = best[1].figures.get("delivered_per_s") if best else None
        if best_figure is None or delivered.median > best_figure.median:
            best = (key, row)
    return best


def _limit(analysis: Analysis) -> list[Block]:
    results = analysis.results
    rows = analysis.rows
    blocks: list[Block] = [
        Heading(2, "Limit: the chat server against the bare relay"),
        Para(
            "From the fast driver only: each configuration's highest delivered/s at a step "
            "that held the headline SLO (p99 < 100 ms, nothing lost) in every repeat, as a "
            "fraction of the relay's (configurations whose target is the bare relay) and of "
            "the fast driver's own ceiling."
        ),
    ]
    relays = sorted({r.config for r in results.runs if r.target == "relay"})
    relay_best = max(
        (b for b in (_best_holding(rows, c) for c in relays) if b is not None),
        key=lambda b: b[1].figures["delivered_per_s"].median,  # type: ignore[union-attr]
        default=None,
    )
    deflated = {r.config for r in results.runs if r.env.get("WS_DEFLATE") == "on"}
    table = []
    for config in config_names(results):
        # a deflate configuration is driven with deflate: its driver's ceiling is that one
        ceiling = results.ceilings.get("fast+deflate" if config in deflated else "fast")
        if not any(config in by_config for key, by_config in rows.items() if key.driver == "fast"):
            continue
        best = _best_holding(rows, config)
        target = "relay" if config in relays else "chat"
        if best is None:
            table.append([config, target, "none held", EMPTY, EMPTY, EMPTY, EMPTY])
            continue
        key, row = best
        delivered = row.figures["delivered_per_s"]
        assert delivered is not None
        of_relay = EMPTY
        if relay_best is not None:
            relay_rate = relay_best[1].figures["delivered_per_s"]
            assert relay_rate is not None
            of_relay = f"{delivered.median / relay_rate.median:.0%}"
        of_ceiling = (
            f"{delivered.median / ceiling.delivered_per_s:.0%}"
            if ceiling is not None and ceiling.delivered_per_s > 0
            else EMPTY
        )
        table.append(
            [
                config + analysis.marks.get((key, config), ""),
                target,
                _spread_cell(delivered),
                key.name,
                _spread_cell(row.figures.get("p99")),
                of_relay,
                of_ceiling,
            ]
        )
    if not table:
        blocks.append(Para("No fast-driver step in these results: no limit to show."))
        return blocks
    blocks.append(
        Table(
            [
                "configuration",
                "target",
                "best delivered/s holding the SLO",
                "at step",
                "p99 ms there",
                "of the relay's",
                "of the fast driver's ceiling (with deflate where driven so)",
            ],
            table,
        )
    )
    fast_steps = [by_config for key, by_config in rows.items() if key.driver == "fast"]
    if not relays:
        blocks.append(Para("No relay configuration in this matrix: no fraction of the relay."))
    elif not any(relay in by_config for by_config in fast_steps for relay in relays):
        # a climb's steps are not rows: "did not hold at any rate" would be untrue
        blocks.append(
            Para(
                "The relays ran only climbs here, no fixed-rate step: their knees, and each"
                " configuration's against them, are in the capacity ladder."
            )
        )
    elif relay_best is None:
        blocks.append(Para("The relay did not hold the SLO at any rate tried."))
    else:
        relay_key = relay_best[0]
        fast_rates = [
            k.offered_per_s or 0
            for k, v in rows.items()
            if k.driver == "fast" and relay_best[1].config in v
        ]
        if relay_key.offered_per_s is not None and relay_key.offered_per_s >= max(fast_rates):
            blocks.append(
                Para(
                    f"The relay ({relay_best[1].config}) held the SLO at every rate tried, up "
                    "to the highest: its own limit is higher, so the fractions above are upper "
                    "bounds."
                )
            )
    return blocks


def _ceilings(results: Results) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Driver ceilings")]
    if not results.ceilings:
        blocks.append(Para("No driver ceiling was measured in this run."))
        return blocks
    blocks.append(
        Para(
            "Each driver against a trivial relay: the most it can send and receive on this "
            "machine. A configuration delivering near its driver's ceiling measures the driver."
        )
    )
    table = []
    for driver, step in results.ceilings.items():
        cpu = step.generator_cpu_percent
        table.append(
            [
                DRIVER_TITLES.get(driver, driver),
                step.name,
                str(step.connections),
                _num(step.offered_per_s),
                _num(step.sent_per_s),
                _num(step.delivered_per_s),
                _num(step.latency_ms.get("p50")),
                _num(step.latency_ms.get("p99")),
                _num(cpu),
                "yes" if step.generator_limited else "no",
            ]
        )
    blocks.append(
        Table(
            [
                "driver",
                "step",
                "connections",
                "offered/s",
                "sent/s",
                "delivered/s",
                "p50 ms",
                "p99 ms",
                "generator CPU %",
                "generator limited",
            ],
            table,
        )
    )
    return blocks


def _findings(results: Results, plots: list[Plot], out_dir: Path) -> list[Block]:
    """The sentences the report opens with, and the capacity-ladder chart under them."""
    found = ladder(results)
    if found is None:
        return []
    blocks: list[Block] = [Heading(2, "Findings"), Bullets(findings(found))]
    chart = next((p for p in plots if p.name == "ladder" and p.path is not None), None)
    if chart is not None and chart.path is not None:
        blocks.append(Image(chart.path, chart.path.relative_to(out_dir).as_posix(), chart.title))
    return blocks


def _ladder(results: Results) -> list[Block]:
    """Every climbed configuration: its knees, its multiples of the baseline and of the
    relays with their verdicts, the shape it was measured at, and its climb's steps."""
    found = ladder(results)
    if found is None:
        return []
    blocks: list[Block] = [
        Heading(2, "Capacity ladder"),
        Para(
            "Each configuration's knee: the highest delivered messages/s whose fan-out p99 "
            "stayed under the SLO with nothing lost, found by the fast driver's climb "
            "(multiply the offered rate while it holds, then bisect to within "
            f"{RESOLUTION * 100:.0f} %). A difference is claimed only when it holds in every "
            f"repeat and exceeds the noise floor, here ±{found.floor * 100:.1f} % "
            f'({found.floor_source}); otherwise it reads "not confirmed" with the reason. '
            "\u2265 marks a knee that is only a lower bound (the driver was the limit, or "
            "nothing broke up to the climb's top rate)."
        ),
    ]
    relays = found.relays
    header = ["configuration", "knee (median)", "min\u2013max", "per repeat", "vs baseline"]
    header += [f"vs {r.config}" for r in relays]
    header += ["stalls / re-runs"]
    rows = []
    for rung in found.rungs:
        versus = found.against_baseline.get(rung.config)
        if rung is found.baseline:
            cell = "baseline"
        elif versus is None:
            cell = EMPTY
        else:
            cell = f"{versus.ratio_text()} {_claim(versus)}"
        row = [
            rung.config + (" (relay)" if rung.target == "relay" else ""),
            rung.label() + (" (driver-limited)" if rung.driver_limited else ""),
            f"{rung.low:,.0f}{DASH}{rung.high:,.0f}",
            ", ".join(f"{k:,.0f}" for k in rung.knees),
            cell,
        ]
        for relay in relays:
            comparison = found.against_relays.get(rung.config, {}).get(relay.config)
            row.append(comparison.ratio_text() if comparison else EMPTY)
        row.append(f"{rung.stalled_steps} / {rung.reruns}")
        rows.append(row)
    blocks.append(Table(header, rows))
    blocks.append(
        Table(
            [
                "configuration",
                "connections",
                "room size",
                "body chars",
                "send frame bytes",
                "deflate",
            ],
            [
                [
                    r.config,
                    f"{r.connections:,}",
                    str(r.room_size),
                    str(r.body_chars),
                    str(r.frame_bytes),
                    "on (negotiated)" if r.deflate else "off",
                ]
                for r in found.rungs
            ],
        )
    )
    groups = by_connections(found)
    if len(groups) > 1:
        blocks += _sweep(groups)
    for rung in found.rungs:
        blocks.append(Heading(3, f"Climb: {rung.config}"))
        steps = [
            [
                str(run.repeat + 1),
                f"{s.offered_per_s or 0:,.0f}",
                f"{s.delivered_per_s:,.0f}",
                _num(s.latency_ms.get("p99")),
                _num(s.latency_ms.get("max")),
                "\u2713" if s.holds(HEADLINE_SLO_MS) else "\u2717",
                ", ".join(f"{t:.0f} s" for t in s.stall_s) or EMPTY,
                "re-run" if s.rerun else "superseded" if s.superseded else "",
                GENERATOR_LIMITED if s.generator_limited else "",
            ]
            for run in rung.runs
            for s in run.steps
            if s.driver == "fast"
        ]
        blocks.append(
            Table(
                [
                    "repeat",
                    "offered sends/s",
                    "delivered/s",
                    "p99 ms",
                    "max ms",
                    "held",
                    "stalled seconds",
                    "",
                    "driver limit",
                ],
                steps,
            )
        )
    return blocks


def _tail(results: Results, out_dir: Path) -> list[Block]:
    """Why the tail moved: per configuration, its latency over time above the server's GC
    pauses, loop lag and commits; every stalled second with its likely cause."""
    watched = [r for r in results.runs if r.metric_series or r.tail_events]
    if not watched:
        return []
    blocks: list[Block] = [
        Heading(2, "Why the tail moved"),
        Para(
            "The server's own view, read about once a second while it was driven: GC pause "
            "time by generation, event-loop lag (a 10 ms ticker's lateness; ticks 10 ms or "
            "more late are marked), commit time, and the notable events it keeps (GC pauses "
            "of 50 ms or more, slow commits and checkpoints of 10 ms or more). Red bands mark "
            "the seconds a climb step stalled (p99 over 10\u00d7 the step's median, or no "
            "delivery); each is named below with the likeliest cause the server saw."
        ),
    ]
    rows = []
    for run in results.runs:
        for step in run.steps:
            for t in step.stall_s:
                point = next((p for p in step.timeline if p.t_s == t), None)
                p99 = _num(point.p99_ms) if point is not None else EMPTY
                cause = (
                    likely_cause(run.tail_events, t - 1.0, t)
                    if run.metric_series or run.tail_events
                    else "the server's tail was not read (relay, or metrics off)"
                )
                note = (
                    "re-run"
                    if step.rerun
                    else "superseded by its re-run"
                    if step.superseded
                    else ""
                )
                rows.append(
                    [run.config, str(run.repeat + 1), step.name, f"{t:.0f} s", p99, cause, note]
                )
    if rows:
        blocks.append(
            Table(["configuration", "repeat", "step", "second", "p99 ms", "likely cause", ""], rows)
        )
    else:
        blocks.append(Para("No step stalled: no second passed 10\u00d7 its step's median p99."))
    summary = []
    for run in watched:
        events = run.tail_events
        gc = [e for e in events if e["kind"] == "gc"]
        late = [e for e in events if e["kind"] == "loop_lag"]
        slow = [e for e in events if e["kind"] in ("commit", "checkpoint")]
        summary.append(
            [
                run.config,
                str(run.repeat + 1),
                f"{len(gc)}" + (f" (max {max(e['ms'] for e in gc):.0f} ms)" if gc else ""),
                f"{len(late)}" + (f" (max {max(e['ms'] for e in late):.0f} ms)" if late else ""),
                f"{len(slow)}" + (f" (max {max(e['ms'] for e in slow):.0f} ms)" if slow else ""),
            ]
        )
    blocks.append(
        Table(
            ["configuration", "repeat", "GC pauses ≥ 50 ms", "late ticks ≥ 10 ms", "slow commits"],
            summary,
        )
    )
    shown: set[str] = set()
    for run in watched:
        if run.config in shown:
            continue
        stalled = [r for r in watched if r.config == run.config and any(s.stall_s for s in r.steps)]
        chosen = stalled[0] if stalled else run
        path = server_tail(chosen, out_dir / "plots" / f"tail-{_slug(run.config)}.png")
        if path is None:
            continue
        shown.add(run.config)
        blocks.append(Heading(3, f"{run.config}: latency over time, the server's tail under it"))
        blocks.append(Image(path, path.relative_to(out_dir).as_posix(), f"tail of {run.config}"))
    return blocks


def _claim(comparison: Comparison) -> str:
    if comparison.verdict == "not confirmed":
        return f"not confirmed: {comparison.reason}"
    return f"({comparison.verdict}, confirmed)"


def _sweep(groups: dict[int, list[Rung]]) -> list[Block]:
    """How the verdict moves with the connection count: each count's knees and ratios."""
    blocks: list[Block] = [
        Heading(3, "The shape is part of the result: by connection count"),
        Para(
            "The same configurations climbed at each connection count. A ratio measured at one "
            "count does not carry to another: read each row on its own."
        ),
    ]
    rows = []
    for count, rungs in groups.items():
        chats = [r for r in rungs if r.target == "chat"]
        relays = [r for r in rungs if r.target == "relay"]
        for chat in chats:
            ratios = [
                f"{compare(chat, relay, RESOLUTION).ratio_text()} of {relay.config}"
                for relay in relays
            ]
            rows.append([f"{count:,}", chat.config, chat.label(), "; ".join(ratios) or EMPTY])
    blocks.append(Table(["connections", "configuration", "knee", "against the relay"], rows))
    return blocks


def _capacity(results: Results) -> list[Block]:
    if not results.capacity:
        return []
    return [
        Heading(2, "Capacity search"),
        Para(
            "What `python -m bench.lab capacity` found (fast driver), as it recorded it: "
            "the highest delivered/s that held the SLO, the steps it climbed, the plan."
        ),
        *_free_form(results.capacity, 3),
    ]


def _free_form(data: dict[str, Any], level: int) -> list[Block]:
    """A nested dict as tables: scalars (and flat dicts) as key/value rows, lists of dicts
    as tables of their own, dicts of dicts as sub-sections."""
    scalars: list[list[str]] = []
    blocks: list[Block] = []
    for name, value in data.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            columns = list(dict.fromkeys(k for v in value for k in v))
            blocks.append(Heading(level, str(name)))
            blocks.append(Table(columns, [[_value(v.get(c)) for c in columns] for v in value]))
        elif isinstance(value, dict) and any(isinstance(v, dict | list) for v in value.values()):
            blocks.append(Heading(level, str(name)))
            blocks += _free_form(value, min(level + 1, 4))
        elif isinstance(value, dict):
            scalars += [[f"{name}.{k}", _value(v)] for k, v in value.items()]
        else:
            scalars.append([str(name), _value(value)])
    return ([Table(["key", "value"], scalars)] if scalars else []) + blocks


_SERIES = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?$")
# label values quoted (Prometheus text) or bare (the runner's scrape_metrics)
_LABEL = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|([^,]*))')


def metric_cells(metrics: dict[str, float]) -> dict[str, str]:
    """Prometheus samples (``name{labels}`` -> value) folded into one cell per family:
    counters and gauges as numbers, labelled series as "label count, ...", histograms as
    count and mean (and the bucket bounds holding p50 and p99 when buckets are there)."""
    plain: dict[str, float] = {}
    labelled: dict[str, list[tuple[str, float]]] = {}
    buckets: dict[str, list[tuple[float, float]]] = {}
    for series, value in metrics.items():
        match = _SERIES.match(series.strip())
        if match is None:
            plain[series] = value
            continue
        name = match["name"]
        labels = {k: quoted or bare for k, quoted, bare in _LABEL.findall(match["labels"] or "")}
        if name.endswith("_bucket") and "le" in labels:
            bound = math.inf if labels["le"] in ("+Inf", "inf") else float(labels["le"])
            buckets.setdefault(name.removesuffix("_bucket"), []).append((bound, value))
        elif labels:
            text = ",".join(v if len(labels) == 1 else f"{k}={v}" for k, v in labels.items())
            labelled.setdefault(name.removesuffix("_total"), []).append((text, value))
        elif not name.endswith("_created"):
            plain[name] = value
    histograms = set(buckets) | {
        n.removesuffix("_count")
        for n in plain
        if n.endswith("_count") and f"{n.removesuffix('_count')}_sum" in plain
    }
    cells: dict[str, str] = {}
    for base in histograms:
        bounds = sorted(buckets.get(base, []))
        count = plain.pop(f"{base}_count", None)
        total = plain.pop(f"{base}_sum", None)
        if count is None:
            count = bounds[-1][1] if bounds else 0.0
        unit = " ms" if base.endswith("_ms") else ""
        parts = [f"n {_count(count)}"]
        if count and total is not None:
            parts.append(f"mean {_num(total / count)}{unit}")
        for q in (0.5, 0.99):
            bound = next((b for b, c in bounds if count and c >= q * count), None)
            if bound is None:
                continue
            if math.isinf(bound):
                text = f"> {_num(bounds[-2][0])}" if len(bounds) > 1 else "unknown"
            else:
                text = f"\u2264 {_num(bound)}"
            parts.append(f"p{round(q * 100)} {text}{unit}")
        cells[base] = ", ".join(parts)
    for base, items in labelled.items():
        cells[base] = ", ".join(f"{k} {_count(v)}" for k, v in sorted(items))
    for name, value in plain.items():
        cells[name.removesuffix("_total")] = _count(value)
    return dict(sorted(cells.items()))


def _metrics(results: Results) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Server metrics")]
    columns: dict[str, dict[str, str]] = {}
    for config in config_names(results):
        runs = [r for r in results.runs if r.config == config and r.metrics]
        if not runs:
            continue
        keys = dict.fromkeys(k for r in runs for k in r.metrics)
        medians = {k: statistics.median(r.metrics[k] for r in runs if k in r.metrics) for k in keys}
        columns[config] = metric_cells(medians)
    if not columns:
        blocks.append(Para("No run scraped the server's metrics (METRICS_PORT off)."))
        return blocks
    blocks.append(
        Para(
            "The chat server's own Prometheus counters at the end of each run (median over "
            "repeats; counters cover the whole run, every driver). Histograms: count, mean "
            "and the bucket bound holding p50 and p99."
        )
    )
    names = sorted({n for cells in columns.values() for n in cells})
    blocks.append(
        Table(
            ["metric", *columns],
            [[n, *(cells.get(n, EMPTY) for cells in columns.values())] for n in names],
        )
    )
    return blocks


def _profiles(results: Results, out_dir: Path, profiles_dir: Path) -> list[Block]:
    by_config = {
        c: [p for r in results.runs if r.config == c for p in r.profiles]
        for c in config_names(results)
    }
    by_config = {c: p for c, p in by_config.items() if p}
    if not by_config:
        return []
    blocks: list[Block] = [Heading(2, "Profiles")]
    try:
        from bench.lab import profiles  # type: ignore[attr-defined]
    except ImportError as exc:
        logger.warning("profile tables skipped: %s", exc)
        blocks.append(Para(f"Profile snapshots exist but bench.lab.profiles is missing ({exc})."))
        return blocks
    for config, rel_paths in by_config.items():
        blocks.append(Heading(3, config))
        paths = [profiles_dir / p for p in rel_paths]
        found = [p for p in paths if p.is_file()]
        blocks.append(
            Para(
                f"cProfile snapshots of the server ({len(found)} of {len(paths)} found): "
                + ", ".join(rel_paths[:4])
                + (f" and {len(rel_paths) - 4} more" if len(rel_paths) > 4 else "")
            )
        )
        if not found:
            continue
        try:
            top = profiles.top_functions(found, TOP_FUNCTIONS)
            if "total_s" in top:
                blocks.append(
                    Para(
                        f"Own time over every profiled thread: {top['total_s']:.2f} s, of "
                        f"which {top.get('waiting_s', 0.0):.2f} s waiting for work (left out "
                        "of the tables; percentages are of the whole)."
                    )
                )
            for order in ("cumulative", "own"):
                blocks.append(Para(f"Top {TOP_FUNCTIONS} functions by {order} time:"))
                blocks.append(Markdown(profiles.markdown_table(top.get(order, []))))
            png = profiles.call_graph_png(found, out_dir / "plots" / f"profile-{_slug(config)}.png")
        except Exception as exc:  # a bad snapshot must not cost the rest of the report
            logger.warning("profiles of %s could not be read", config, exc_info=True)
            blocks.append(Para(f"The snapshots could not be read: {exc}"))
            continue
        if png is not None and Path(png).is_file():
            png = Path(png)
            blocks.append(Image(png, png.relative_to(out_dir).as_posix(), f"call graph, {config}"))
        else:
            blocks.append(Para("No call graph (gprof2dot or Graphviz' dot unavailable)."))
    return blocks


def _figures(plots: list[Plot], out_dir: Path) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Figures")]
    for plot in plots:
        blocks.append(Heading(3, plot.title))
        if plot.path is None:
            blocks.append(Para(f"Skipped: {plot.skipped}."))
        else:
            blocks.append(Image(plot.path, plot.path.relative_to(out_dir).as_posix(), plot.title))
    return blocks


# --- rendering --------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_NUMERIC_START = frozenset("0123456789+-.\u2013\u00d7\u2248\u00b1\u2713\u2717\u2264>")


def _numeric_columns(table: Table) -> list[bool]:
    """Which columns hold figures (right-aligned): every cell starts like a number."""
    return [
        i > 0
        and bool(table.rows)
        and any(len(row) > i and row[i] for row in table.rows)
        and all(len(row) <= i or not row[i] or row[i][0] in _NUMERIC_START for row in table.rows)
        for i in range(len(table.header))
    ]


def to_markdown(blocks: Iterable[Block]) -> str:
    """The blocks as GitHub-flavoured markdown."""
    out: list[str] = []
    for block in blocks:
        match block:
            case Heading(level, text):
                out.append(f"{'#' * level} {text}")
            case Para(text):
                out.append(text)
            case Bullets(items):
                out.append("\n".join(f"- {item}" for item in items))
            case Table(header, rows):
                numeric = _numeric_columns(block)
                lines = ["| " + " | ".join(map(_md_cell, header)) + " |"]
                lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
                lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows]
                out.append("\n".join(lines))
            case Image(_, rel, alt):
                out.append(f"![{alt}]({rel})")
            case Code(text):
                out.append(f"```\n{text}\n```")
            case Markdown(text):
                out.append(text.strip())
    return "\n\n".join(out) + "\n"


_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;
max-width:1500px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ccc}h3{margin-top:1.5em}
table{border-collapse:collapse;margin:0.8em 0;font-size:13px;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;white-space:nowrap}
th{background:#f2f2f2}.n{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:nth-child(even){background:#fafafa}
pre{background:#f5f5f5;padding:0.6em;overflow-x:auto;white-space:pre-wrap}
img{max-width:100%;height:auto;display:block;margin:0.5em 0}
"""

# tells a headless browser (and its tests) that every image decoded: "N/N" when all did,
# and how wide the page is against the window
_IMAGES_LOADED = """
window.addEventListener("load", function () {
  var images = document.images, loaded = 0;
  for (var i = 0; i < images.length; i++) {
    if (images[i].complete && images[i].naturalWidth > 0) loaded++;
  }
  document.body.setAttribute("data-images-loaded", loaded + "/" + images.length);
  // the page's own width against the window's: a wide table scrolls in its own box
  document.body.setAttribute("data-scroll-width", document.documentElement.scrollWidth);
  document.body.setAttribute("data-viewport-width", document.documentElement.clientWidth);
});
"""


def _pipe_table(text: str) -> Table | None:
    """A markdown pipe table (as profiles.markdown_table writes) as a Table, else None."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2 or not all(line.startswith("|") for line in lines):
        return None

    def cells(line: str) -> list[str]:
        return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip("|"))]

    if not re.fullmatch(r"\|?[\s:|-]+\|?", lines[1]):
        return None
    return Table(cells(lines[0]), [cells(line) for line in lines[2:]])


def _html_cell(text: str) -> str:
    """A cell's text, escaped; a whole-cell code span (profile tables' labels) as <code>."""
    if len(text) > 1 and text.startswith("`") and text.endswith("`"):
        return f"<code>{html.escape(text[1:-1])}</code>"
    return html.escape(text)


def to_html(blocks: Iterable[Block], title: str) -> str:
    """The blocks as one HTML page with inline CSS and every image as a data: URI."""
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
    ]
    for given in blocks:
        block = (
            (_pipe_table(given.text) or Code(given.text)) if isinstance(given, Markdown) else given
        )
        match block:
            case Heading(level, text):
                out.append(f"<h{level}>{esc(text)}</h{level}>")
            case Para(text):
                out.append(f"<p>{esc(text)}</p>")
            case Bullets(items):
                out.append("<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>")
            case Table(header, rows):
                cls = [' class="n"' if n else "" for n in _numeric_columns(block)]
                head = "".join(f"<th{k}>{esc(h)}</th>" for k, h in zip(cls, header, strict=True))
                body = "".join(
                    "<tr>"
                    + "".join(
                        f"<td{k}>{_html_cell(c)}</td>" for k, c in zip(cls, row, strict=False)
                    )
                    + "</tr>"
                    for row in rows
                )
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            case Image(file, _, alt):
                data = base64.b64encode(file.read_bytes()).decode("ascii")
                out.append(f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">')
            case Code(text):
                out.append(f"<pre>{esc(text)}</pre>")
    out.append(f"<script>{_IMAGES_LOADED}</script></body></html>")
    return "\n".join(out) + "\n"


# --- public API -------------------------------------------------------------------------


def report_blocks(results: Results, out_dir: Path, profiles_dir: Path | None = None) -> list[Block]:
    """Every section of the report, drawing its PNGs under ``out_dir/plots``."""
    analysis = analyse(results)
    plots = draw_all(results, out_dir / "plots")
    title, *header = _header(results)
    return [
        title,
        *_findings(results, plots, out_dir),
        *header,
        *_slos(),
        *_ladder(results),
        *_tail(results, out_dir),
        *_noise_floor(analysis),
        *_driver_tables(analysis),
        *_limit(analysis),
        *_ceilings(results),
        *_capacity(results),
        *_metrics(results),
        *_figures([p for p in plots if p.name != "ladder"], out_dir),
        *_profiles(results, out_dir, profiles_dir or out_dir),
    ]


def write_report(
    results: Results, out_dir: Path, profiles_dir: Path | None = None
) -> tuple[Path, Path]:
    """Write ``out_dir/report.md``, ``out_dir/report.html`` and the PNGs under ``out_dir/plots``.

    ``profiles_dir`` is where ``Run.profiles`` paths are relative to (default ``out_dir``).
    Returns the two documents' paths; the HTML needs no other file.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks = report_blocks(results, out_dir, profiles_dir)
    md_path = out_dir / "report.md"
    html_path = out_dir / "report.html"
    md_path.write_text(to_markdown(blocks), encoding="utf-8")
    html_path.write_text(to_html(blocks, f"Lab report: {results.matrix}"), encoding="utf-8")
    return md_path, html_path


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        first = row[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join([first, *rest]).rstrip())
    return "\n".join(lines)


def summary_table(results: Results) -> str:
    """Plain text for the terminal: per driver step, each configuration's median p50, p99,
    max, delivered/s and server CPU, its headline SLO verdict and p99 against the baseline."""
    analysis = analyse(results)
    if not analysis.rows:
        if any(run.knee for run in results.runs):
            return "every step was part of a climb: each configuration's knee is in the report"
        return "no run produced a step"
    parts = []
    for key, by_config in analysis.rows.items():
        base = by_config.get(results.baseline)
        floors = analysis.noise_floor.get(key, {})
        rows = []
        for config, row in by_config.items():
            f = row.figures
            versus = (
                "baseline"
                if config == results.baseline
                else ratio_cell(f.get("p99"), base.figures.get("p99"), floors.get("p99"))
                if base
                else EMPTY
            )
            rows.append(
                [
                    config + analysis.marks.get((key, config), ""),
                    _num(f["p50"].median) if f.get("p50") else EMPTY,
                    _num(f["p99"].median) if f.get("p99") else EMPTY,
                    _num(f["max"].median) if f.get("max") else EMPTY,
                    _num(f["delivered_per_s"].median) if f.get("delivered_per_s") else EMPTY,
                    _num(f["cpu_mean"].median) if f.get("cpu_mean") else EMPTY,
                    _verdict(row.headline_held, len(row.pairs)),
                    versus,
                ]
            )
        header = [
            f"{key.title} (medians)",
            "p50 ms",
            "p99 ms",
            "max ms",
            "delivered/s",
            "CPU %",
            "p99<100",
            "p99 vs baseline",
        ]
        parts.append(_text_table(header, rows))
    notes = [f"[{i}] {text}" for i, text in enumerate(analysis.footnotes, 1)]
    return "\n\n".join(parts + (["\n".join(notes)] if notes else []))


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.lab.report RESULTS_JSON [--out DIR]``: re-render a saved run."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.lab.report",
        description="Render report.md, report.html and plots/ from a lab run's results.json.",
    )
    parser.add_argument("results_json", type=Path, help="a results.json the lab wrote")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for the report (default: the results file's directory); "
        "profile paths stay relative to the results file's directory",
    )
    args = parser.parse_args(argv)
    if not args.results_json.is_file():
        parser.error(f"no such file: {args.results_json}")
    results = Results.load(args.results_json)
    out_dir = args.out or args.results_json.parent
    md_path, html_path = write_report(results, out_dir, profiles_dir=args.results_json.parent)
    print(summary_table(results))
    print(f"\nwrote {md_path} and {html_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    raise SystemExit(main())
