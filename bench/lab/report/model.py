"""The report's one data model: blocks (headings, paragraphs, lists, tables, images, code)
that the sections build once and both templates, Markdown and HTML, render."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


@dataclass
class Heading:
    """A section's title; level 1 is the report's own."""

    level: int
    text: str
    kind: ClassVar[str] = "heading"


@dataclass
class Para:
    """A paragraph of plain text."""

    text: str
    kind: ClassVar[str] = "para"


@dataclass
class Bullets:
    """A bulleted list of plain-text items."""

    items: list[str]
    kind: ClassVar[str] = "bullets"


#: how a cell of figures starts: digits, signs, ranges, ratios, verdicts, bounds
_NUMERIC_START = frozenset("0123456789+-.\u2013\u00d7\u2248\u00b1\u2713\u2717\u2264>")


@dataclass
class Table:
    """Rows of text cells under a header; ``right`` marks the columns of figures
    (right-aligned), worked out from the cells unless given."""

    header: list[str]
    rows: list[list[str]]
    right: list[bool] | None = None
    kind: ClassVar[str] = "table"

    def __post_init__(self) -> None:
        if self.right is None:
            self.right = _numeric_columns(self.header, self.rows)

    def aligned(self, cells: list[str]) -> list[tuple[str, bool]]:
        """Each of ``cells`` (the header or a row) with whether its column is right-aligned."""
        return list(zip(cells, self.right or [], strict=False))


def _numeric_columns(header: list[str], rows: list[list[str]]) -> list[bool]:
    """Which columns hold figures: every cell starts like a number (never the first column)."""
    return [
        i > 0
        and bool(rows)
        and any(len(row) > i and row[i] for row in rows)
        and all(len(row) <= i or not row[i] or row[i][0] in _NUMERIC_START for row in rows)
        for i in range(len(header))
    ]


@dataclass
class Image:
    """A PNG: a link in the Markdown, a ``data:`` URI in the HTML."""

    file: Path  # where the PNG is
    rel: str  # its path relative to the report
    alt: str
    kind: ClassVar[str] = "image"


@dataclass
class Code:
    """Preformatted text: a command, an error's traceback."""

    text: str
    kind: ClassVar[str] = "code"


Block = Heading | Para | Bullets | Table | Image | Code


def pipe_table(text: str) -> Table | None:
    """A Markdown pipe table made elsewhere (profiles.markdown_table) as a Table, its
    columns aligned as its separator row says; None when ``text`` is no such table."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2 or not all(line.startswith("|") for line in lines):
        return None
    if not re.fullmatch(r"\|?[\s:|-]+\|?", lines[1]):
        return None

    def cells(line: str) -> list[str]:
        return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip("|"))]

    return Table(
        cells(lines[0]),
        [cells(line) for line in lines[2:]],
        right=[c.endswith(":") for c in cells(lines[1])],
    )
