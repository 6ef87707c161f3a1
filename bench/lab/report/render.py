"""The blocks rendered by Jinja2 templates: GitHub-flavoured Markdown, and one HTML page
that stands alone (CSS inline, every image a ``data:`` URI), autoescaped."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from bench.lab.report.model import Block


def md_cell(text: str) -> str:
    """A Markdown table cell: ``|`` escaped, on one line."""
    return text.replace("|", "\\|").replace("\n", " ")


def data_uri(png: Path) -> str:
    """A PNG file as a ``data:`` URI, so the page needs no other file."""
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def is_code_span(text: str) -> bool:
    """Whether a cell is one whole Markdown code span (the profile tables' labels)."""
    return len(text) > 1 and text.startswith("`") and text.endswith("`")


def _environment() -> Environment:
    """Templates from this package's ``templates/``; ``*.html.j2`` autoescaped, ``*.md.j2`` not."""
    environment = Environment(
        loader=PackageLoader("bench.lab.report", "templates"),
        autoescape=select_autoescape(enabled_extensions=("html.j2",), default=False),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters["md_cell"] = md_cell
    environment.filters["data_uri"] = data_uri
    environment.tests["code_span"] = is_code_span
    return environment


_ENVIRONMENT = _environment()


def to_markdown(blocks: Iterable[Block]) -> str:
    """The blocks as GitHub-flavoured Markdown, one blank line between blocks."""
    return _ENVIRONMENT.get_template("report.md.j2").render(blocks=list(blocks))


def to_html(blocks: Iterable[Block], title: str) -> str:
    """The blocks as one HTML page with inline CSS and every image as a data: URI."""
    return _ENVIRONMENT.get_template("report.html.j2").render(blocks=list(blocks), title=title)
