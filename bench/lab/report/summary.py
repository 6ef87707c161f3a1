"""The report's summary for the terminal: one plain-text table per driver step."""

from __future__ import annotations

from bench.lab.report.analysis import analyse
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
    return "\n\n".join(parts + (["\n".join(notes)] if notes else []))
