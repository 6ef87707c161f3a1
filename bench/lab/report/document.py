"""The whole report: its sections in order, written as report.md and report.html."""

from __future__ import annotations

from pathlib import Path

from bench.lab.plots import draw_all
from bench.lab.report.analysis import Analysis, analyse
from bench.lab.report.figures import figures_markdown
from bench.lab.report.model import Block
from bench.lab.report.render import to_html, to_markdown
from bench.lab.report.sections import (
    ceiling_blocks,
    driver_blocks,
    figure_blocks,
    header_blocks,
    limit_blocks,
    noise_floor_blocks,
    slo_blocks,
)
from bench.lab.report.sections_ladder import findings_blocks, ladder_blocks, tail_blocks
from bench.lab.report.sections_scaling import scaling_blocks
from bench.lab.report.sections_server import capacity_blocks, metrics_blocks, profile_blocks
from bench.lab.report.sections_side import side_blocks
from bench.lab.report.sections_tls import tls_blocks
from bench.lab.results import Results


def report_blocks(
    analysis: Analysis, out_dir: Path, profiles_dir: Path | None = None
) -> list[Block]:
    """Every section of the report, drawing its PNGs under ``out_dir/plots``."""
    results = analysis.results
    plots = draw_all(results, out_dir / "plots")
    title, *header = header_blocks(results)
    return [
        title,
        *findings_blocks(analysis, plots, out_dir),
        *header,
        *slo_blocks(),
        *ladder_blocks(analysis.ladder),
        *tls_blocks(results),
        *side_blocks(results, analysis.ladder, out_dir),
        *tail_blocks(results, out_dir),
        *noise_floor_blocks(analysis),
        *driver_blocks(analysis),
        *limit_blocks(analysis),
        *ceiling_blocks(results),
        *capacity_blocks(results),
        *scaling_blocks(results),
        *metrics_blocks(results),
        *figure_blocks([p for p in plots if p.name != "ladder"], out_dir),
        *profile_blocks(results, out_dir, profiles_dir or out_dir, analysis.ladder),
    ]


def write_report(
    results: Results, out_dir: Path, profiles_dir: Path | None = None
) -> tuple[Path, Path]:
    """Write ``out_dir/report.md``, ``out_dir/report.html``, the PNGs under ``out_dir/plots``
    and, when something was climbed, ``out_dir/figures.md`` (the current-figures table).

    ``profiles_dir`` is where ``Run.profiles`` paths are relative to (default ``out_dir``).
    Returns the two documents' paths; the HTML needs no other file.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    analysis = analyse(results)
    blocks = report_blocks(analysis, out_dir, profiles_dir)
    md_path = out_dir / "report.md"
    html_path = out_dir / "report.html"
    md_path.write_text(to_markdown(blocks), encoding="utf-8")
    html_path.write_text(to_html(blocks, f"Lab report: {results.matrix}"), encoding="utf-8")
    figures = figures_markdown(results, analysis.ladder)
    if figures:
        (out_dir / "figures.md").write_text(figures, encoding="utf-8")
    return md_path, html_path
