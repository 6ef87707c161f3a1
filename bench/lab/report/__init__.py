"""The lab report: ``report.md``, a self-contained ``report.html`` and PNGs from a Results.

Both documents are rendered by Jinja2 templates (``templates/``) from the same blocks
(headings, paragraphs, tables, images), so they always hold the same figures; the HTML
has its CSS inline and every image as a ``data:`` URI, so it opens offline and can be
mailed as one file. Every figure names the driver that measured it; medians are over
repeats, with their min-max spread; a ratio to the baseline within the A/A noise floor or
the repeats' spread reads "≈ no difference". Re-render a saved run::

    python -m bench.lab.report reports/<time>-<matrix>/results.json [--out DIR]
"""

from __future__ import annotations

from bench.lab.report.analysis import Analysis, Row, analyse
from bench.lab.report.document import report_blocks, write_report
from bench.lab.report.formatting import ratio_cell
from bench.lab.report.prometheus import metric_cells
from bench.lab.report.render import to_html, to_markdown
from bench.lab.report.summary import summary_table

# the package's modules import one another directly, never this file, so re-exporting
# them here makes no circle
__all__ = [
    "Analysis",
    "Row",
    "analyse",
    "metric_cells",
    "ratio_cell",
    "report_blocks",
    "summary_table",
    "to_html",
    "to_markdown",
    "write_report",
]
