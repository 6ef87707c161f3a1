"""The report's summary for the terminal: one plain-text table per driver step."""

from __future__ import annotations

from bench.lab.findings import what_was_busy
from bench.lab.ladder import Comparison, Ladder, delivered_label, floor_text
from bench.lab.report.analysis import Analysis, analyse
from bench.lab.report.formatting import EMPTY, num, ratio_cell, verdict
from bench.lab.results import Results


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
    max, delivered/s and server CPU, its headline SLO verdict and p99 against the baseline;
    then the ladder (each rung's knee and CPU µs per frame); what was busy and what that
    voided first."""
    analysis = analyse(results)
    found = analysis.ladder
    if found is not None:
        busy = found.machine.busy or found.cost_core.busy or found.climb_core.busy
        parts = what_was_busy(found) if busy else []
    else:
        parts = [analysis.machine.sentence()] if analysis.machine.busy else []
    parts += _step_tables(results, analysis)
    if analysis.ladder is not None:
        parts.append(ladder_table(analysis.ladder))
    elif not parts:
        parts.append("no run produced a step")
    return "\n\n".join(parts)


def ladder_table(found: Ladder) -> str:
    """The ladder as plain text: per rung its knee (median, min-max) and CPU µs per frame
    at each cost rate with its ratio to the rung before."""
    room = found.rungs[0].room_size if found.rungs else 10
    header = ["ladder (medians)", "knee delivered/s", "min-max"]
    for rate in found.cost_rates:
        header += [f"µs/frame @{delivered_label(rate, room)}", "vs before"]
    rows = []
    for rung in found.rungs:
        row = [
            rung.config + (" (relay)" if rung.target == "relay" else ""),
            rung.label() + (" (driver)" if rung.driver_limited else ""),
            f"{rung.low:,.0f}-{rung.high:,.0f}",
        ]
        for rate in found.cost_rates:
            cost = rung.costs.get(rate)
            row.append(cost.label() if cost is not None else EMPTY)
            versus = found.cost_vs_previous.get(rung.config, {}).get(rate)
            row.append(_versus(versus))
        rows.append(row)
    floors = [f"knee {floor_text(found.floor)}"] + [
        f"µs/frame @{delivered_label(rate, room)} {floor_text(found.cost_floor[rate][0])}"
        for rate in found.cost_rates
        if rate in found.cost_floor
    ]
    return _text_table(header, rows) + "\nfloors: " + "; ".join(floors)


def _versus(comparison: Comparison | None) -> str:
    if comparison is None or not comparison.ratios:
        return EMPTY
    mark = {"lower": " less", "higher": " more"}.get(comparison.verdict, " ?")
    return comparison.ratio_text().split(" (")[0] + mark


def _step_tables(results: Results, analysis: Analysis) -> list[str]:
    """One table per fixed-rate driver step (climbs' steps are in the ladder)."""
    parts: list[str] = []
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
                    num(f["p50"].median) if f.get("p50") else EMPTY,
                    num(f["p99"].median) if f.get("p99") else EMPTY,
                    num(f["max"].median) if f.get("max") else EMPTY,
                    num(f["delivered_per_s"].median) if f.get("delivered_per_s") else EMPTY,
                    num(f["cpu_mean"].median) if f.get("cpu_mean") else EMPTY,
                    verdict(row.headline_held, len(row.pairs)),
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
    return parts + (["\n".join(notes)] if notes else [])
