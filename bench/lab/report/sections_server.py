"""The report's sections on what the server and the lab recorded besides the steps: the
capacity search, the server's Prometheus metrics and its cProfile snapshots."""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Any

from bench.lab.findings import profiling_sentence
from bench.lab.ladder import Ladder
from bench.lab.plots import config_names
from bench.lab.report.formatting import EMPTY, slug, value_text
from bench.lab.report.model import Block, Code, Heading, Image, Para, Table, pipe_table
from bench.lab.report.prometheus import metric_cells
from bench.lab.results import Results

logger = logging.getLogger(__name__)

TOP_FUNCTIONS = 15


def capacity_blocks(results: Results) -> list[Block]:
    """What ``python -m bench.lab capacity`` recorded, as tables."""
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
            blocks.append(Table(columns, [[value_text(v.get(c)) for c in columns] for v in value]))
        elif isinstance(value, dict) and any(isinstance(v, dict | list) for v in value.values()):
            blocks.append(Heading(level, str(name)))
            blocks += _free_form(value, min(level + 1, 4))
        elif isinstance(value, dict):
            scalars += [[f"{name}.{k}", value_text(v)] for k, v in value.items()]
        else:
            scalars.append([str(name), value_text(value)])
    return ([Table(["key", "value"], scalars)] if scalars else []) + blocks


def metrics_blocks(results: Results) -> list[Block]:
    """The server's Prometheus metrics at the end of each run, one column per configuration."""
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


def profile_blocks(
    results: Results, out_dir: Path, profiles_dir: Path, found: Ladder | None = None
) -> list[Block]:
    """What profiling cost (CPU per frame against the same configuration unprofiled), then
    each profiled configuration's top functions and call graph, from its snapshots."""
    by_config = {
        c: [p for r in results.runs if r.config == c for p in r.profiles]
        for c in config_names(results)
    }
    by_config = {c: p for c, p in by_config.items() if p}
    if not by_config:
        return []
    blocks: list[Block] = [Heading(2, "Profiles")]
    room = found.rungs[0].room_size if found is not None and found.rungs else 10
    for comparison in found.profiling if found is not None else []:
        blocks.append(Para(profiling_sentence(comparison, room)))
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
                table = profiles.markdown_table(top.get(order, []))
                blocks.append(pipe_table(table) or Code(table))
            png = profiles.call_graph_png(found, out_dir / "plots" / f"profile-{slug(config)}.png")
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
