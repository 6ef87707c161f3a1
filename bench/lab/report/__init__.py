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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.lab.report.analysis import Analysis, Row, analyse
    from bench.lab.report.document import report_blocks, write_report
    from bench.lab.report.formatting import ratio_cell
    from bench.lab.report.prometheus import metric_cells
    from bench.lab.report.render import to_html, to_markdown
    from bench.lab.report.summary import summary_table

#: each public name -> the module of this package that defines it. Imported on first use
#: (PEP 562): the package's modules import one another, never this file, so no import
#: goes round in a circle, and importing one part (the Prometheus folding) loads neither
#: matplotlib nor the templates.
_EXPORTS = {
    "Analysis": "analysis",
    "Row": "analysis",
    "analyse": "analysis",
    "metric_cells": "prometheus",
    "ratio_cell": "formatting",
    "report_blocks": "document",
    "summary_table": "summary",
    "to_html": "render",
    "to_markdown": "render",
    "write_report": "document",
}

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


def __getattr__(name: str) -> Any:
    """A public name, imported from the module that defines it on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names with the public ones not yet imported."""
    return sorted({*globals(), *_EXPORTS})
