"""The report's one data model: blocks (headings, paragraphs, lists, tables, images, code)
built once by the sections and rendered as Markdown and as HTML."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
