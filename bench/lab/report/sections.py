"""The report's sections on the measured steps: the header and configurations, the SLOs,
the noise floor, one table per driver step with its ratios, the limit against the relay,
the driver ceilings and the figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lab.ladder import delivered_label, floor_text
from bench.lab.matrix import offers_deflate
from bench.lab.pairs import FIGURE_BOUNDS
from bench.lab.plots import DRIVER_TITLES, Plot, StepKey, config_names
from bench.lab.report.analysis import LATENCIES, RATIO_FIGURES, Analysis, Row
from bench.lab.report.formatting import (
    DASH,
    EMPTY,
    GENERATOR_LIMITED,
    NO_DIFFERENCE,
    duration_text,
    inline,
    num,
    ratio_cell,
    spread_cell,
    verdict,
)
from bench.lab.report.model import Block, Bullets, Code, Heading, Image, Para, Table
from bench.lab.results import HEADLINE_SLO_MS, SEED_REPORT, SEED_SLO_MS, Results

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


def header_blocks(results: Results) -> list[Block]:
    """The title, the run's facts and command, the configurations, and every run not ok."""
    runs = results.runs
    names = config_names(results)
    not_ok = [r for r in runs if r.status != "ok"]
    machine = "; ".join(f"{k} {inline(v)}" for k, v in results.machine.items())
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
        f"duration: {duration_text(results.duration_s)}",
        f"machine: {machine or 'not recorded'}",
        f"runs: {len(names)} configurations, {results.repeat} repeat(s) each, interleaved; "
        f"{len(runs)} runs, {len(not_ok)} not ok",
        f"baseline: {results.baseline}; A/A pair: {' = '.join(results.aa_pair) or 'none'}",
        f"the seed report, named below: {SEED_REPORT}",
        "interrupted: yes \u2014 figures cover only the runs that finished"
        if results.interrupted
        else "interrupted: no",
    ]
    if _given(common_load):
        facts.append(f"load (every configuration unless noted): {inline(_given(common_load))}")
    if _given(common):
        facts.append(f"every configuration: {inline(_given(common))}")
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
            f"same as {v}" if k == "same_as" else f"{k} {inline(v)}"
            for k, v in _given(description).items()
            if k not in common
        ]
        notes += [
            f"load {k} {inline(v) if v not in (None, '') else '(none)'}"
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


def slo_blocks() -> list[Block]:
    """The headline and seed SLOs and what holding one means."""
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


def noise_floor_blocks(analysis: Analysis) -> list[Block]:
    """Every figure's floor, computed once and quoted the same in every section: the
    knee's and CPU per frame's (from the ladder), and each driver step's figures (from the
    A/A pair, repeat i against repeat i)."""
    results = analysis.results
    blocks: list[Block] = [Heading(2, "Noise floor")]
    found = analysis.ladder
    pair = " = ".join(results.aa_pair[:2]) or "none"
    blocks.append(
        Para(
            f"The A/A pair ({pair}) has identical settings, so the difference between its "
            "two configurations is noise. CPU per frame's floor is how far the A/A pair's "
            "paired ratio (its pairs' mean log-ratio with a 95 % t interval) reaches from "
            "1, and a difference is claimed when its own interval lies beyond it, whatever "
            "the machine did. Every other figure's floor is the largest relative difference "
            "between the two in any repeat, and a difference is claimed when it exceeds it "
            "in every repeat and no step it rests on was busy on the server's core. These "
            "are the floors every section quotes."
        )
    )
    rows = []
    if found is not None:
        rows.append(["knee (delivered/s)", floor_text(found.floor), found.floor_source])
        room = found.rungs[0].room_size if found.rungs else 10
        for rate in found.cost_rates:
            measured = found.cost_floor.get(rate)
            rows.append(
                [
                    f"server CPU µs per delivered frame at {delivered_label(rate, room)}",
                    floor_text(measured[0]) if measured else EMPTY,
                    measured[1] if measured else "one repeat and no A/A pair: no floor",
                ]
            )
    if rows:
        blocks.append(Table(["figure", "floor", "from"], rows))
    if not analysis.noise_floor:
        if not rows:
            blocks.append(
                Para(
                    "No A/A pair with data in these results: no noise floor; ratios are "
                    "judged by the repeats' spread only."
                )
            )
        return blocks
    blocks.append(
        Para(
            "Each driver step's figures, the same A/A pair: a ratio to the baseline within "
            f'its own figure\'s floor reads "{NO_DIFFERENCE}".'
        )
    )
    table = [
        [key.title] + [_floor_cell(floors.get(name)) for name in RATIO_FIGURES]
        for key, floors in analysis.noise_floor.items()
    ]
    blocks.append(Table(["step (driver)", *RATIO_FIGURES.values()], table))
    return blocks


def _floor_cell(value: float | None) -> str:
    return EMPTY if value is None else floor_text(value)


def driver_blocks(analysis: Analysis) -> list[Block]:
    """One table per driver step (medians with min-max), its ratios, and their footnotes."""
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
            cpu = num(f["cpu_mean"].median) if f.get("cpu_mean") else EMPTY
            if f.get("cpu_p10") and f.get("cpu_p90"):
                cpu += f" ({num(f['cpu_p10'].median)}{DASH}{num(f['cpu_p90'].median)})"
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
                    *(spread_cell(f.get(p)) for p in LATENCIES),
                    spread_cell(f.get("sent_per_s")),
                    spread_cell(f.get("delivered_per_s")),
                    cpu,
                    spread_cell(f.get("cpu_us_per_frame")),
                    spread_cell(f.get("rss_peak_mib")),
                    errors,
                    verdict(row.headline_held, len(row.pairs)),
                    verdict(row.seed_held, len(row.pairs)),
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
                    ratio_cell(
                        row.figures.get(n),
                        base.figures.get(n),
                        floors.get(n),
                        busy=(row.busy or base.busy) and FIGURE_BOUNDS.get(n) != "floor",
                    )
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


def limit_blocks(analysis: Analysis) -> list[Block]:
    """Each configuration's best rate holding the SLO against the relay's and the driver's."""
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
    # shared deflate's driver (fresh compression per send, each frame inflated once) is
    # held to the ceiling measured with deflate too: the lower, so its knees are more
    # readily lower bounds
    deflated = {r.config for r in results.runs if offers_deflate(r.env)}
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
                spread_cell(delivered),
                key.name,
                spread_cell(row.figures.get("p99")),
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


def ceiling_blocks(results: Results) -> list[Block]:
    """What each driver can send and receive against a trivial relay."""
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
                num(step.offered_per_s),
                num(step.sent_per_s),
                num(step.delivered_per_s),
                num(step.latency_ms.get("p50")),
                num(step.latency_ms.get("p99")),
                num(cpu),
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


def figure_blocks(plots: list[Plot], out_dir: Path) -> list[Block]:
    """Every plot under its title, or why it was skipped."""
    blocks: list[Block] = [Heading(2, "Figures")]
    for plot in plots:
        blocks.append(Heading(3, plot.title))
        if plot.path is None:
            blocks.append(Para(f"Skipped: {plot.skipped}."))
        else:
            blocks.append(Image(plot.path, plot.path.relative_to(out_dir).as_posix(), plot.title))
    return blocks
