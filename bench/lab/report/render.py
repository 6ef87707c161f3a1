"""The blocks as GitHub-flavoured Markdown and as one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterable

from bench.lab.report.model import Block, Bullets, Code, Heading, Image, Markdown, Para, Table


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_NUMERIC_START = frozenset("0123456789+-.\u2013\u00d7\u2248\u00b1\u2713\u2717\u2264>")


def _numeric_columns(table: Table) -> list[bool]:
    """Which columns hold figures (right-aligned): every cell starts like a number."""
    return [
        i > 0
        and bool(table.rows)
        and any(len(row) > i and row[i] for row in table.rows)
        and all(len(row) <= i or not row[i] or row[i][0] in _NUMERIC_START for row in table.rows)
        for i in range(len(table.header))
    ]


def to_markdown(blocks: Iterable[Block]) -> str:
    """The blocks as GitHub-flavoured markdown."""
    out: list[str] = []
    for block in blocks:
        match block:
            case Heading(level, text):
                out.append(f"{'#' * level} {text}")
            case Para(text):
                out.append(text)
            case Bullets(items):
                out.append("\n".join(f"- {item}" for item in items))
            case Table(header, rows):
                numeric = _numeric_columns(block)
                lines = ["| " + " | ".join(map(_md_cell, header)) + " |"]
                lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
                lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows]
                out.append("\n".join(lines))
            case Image(_, rel, alt):
                out.append(f"![{alt}]({rel})")
            case Code(text):
                out.append(f"```\n{text}\n```")
            case Markdown(text):
                out.append(text.strip())
    return "\n\n".join(out) + "\n"


_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;
max-width:1500px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ccc}h3{margin-top:1.5em}
table{border-collapse:collapse;margin:0.8em 0;font-size:13px;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;white-space:nowrap}
th{background:#f2f2f2}.n{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:nth-child(even){background:#fafafa}
pre{background:#f5f5f5;padding:0.6em;overflow-x:auto;white-space:pre-wrap}
img{max-width:100%;height:auto;display:block;margin:0.5em 0}
"""

# tells a headless browser (and its tests) that every image decoded: "N/N" when all did,
# and how wide the page is against the window
_IMAGES_LOADED = """
window.addEventListener("load", function () {
  var images = document.images, loaded = 0;
  for (var i = 0; i < images.length; i++) {
    if (images[i].complete && images[i].naturalWidth > 0) loaded++;
  }
  document.body.setAttribute("data-images-loaded", loaded + "/" + images.length);
  // the page's own width against the window's: a wide table scrolls in its own box
  document.body.setAttribute("data-scroll-width", document.documentElement.scrollWidth);
  document.body.setAttribute("data-viewport-width", document.documentElement.clientWidth);
});
"""


def _pipe_table(text: str) -> Table | None:
    """A markdown pipe table (as profiles.markdown_table writes) as a Table, else None."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2 or not all(line.startswith("|") for line in lines):
        return None

    def cells(line: str) -> list[str]:
        return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip("|"))]

    if not re.fullmatch(r"\|?[\s:|-]+\|?", lines[1]):
        return None
    return Table(cells(lines[0]), [cells(line) for line in lines[2:]])


def _html_cell(text: str) -> str:
    """A cell's text, escaped; a whole-cell code span (profile tables' labels) as <code>."""
    if len(text) > 1 and text.startswith("`") and text.endswith("`"):
        return f"<code>{html.escape(text[1:-1])}</code>"
    return html.escape(text)


def to_html(blocks: Iterable[Block], title: str) -> str:
    """The blocks as one HTML page with inline CSS and every image as a data: URI."""
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
    ]
    for given in blocks:
        block = (
            (_pipe_table(given.text) or Code(given.text)) if isinstance(given, Markdown) else given
        )
        match block:
            case Heading(level, text):
                out.append(f"<h{level}>{esc(text)}</h{level}>")
            case Para(text):
                out.append(f"<p>{esc(text)}</p>")
            case Bullets(items):
                out.append("<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>")
            case Table(header, rows):
                cls = [' class="n"' if n else "" for n in _numeric_columns(block)]
                head = "".join(f"<th{k}>{esc(h)}</th>" for k, h in zip(cls, header, strict=True))
                body = "".join(
                    "<tr>"
                    + "".join(
                        f"<td{k}>{_html_cell(c)}</td>" for k, c in zip(cls, row, strict=False)
                    )
                    + "</tr>"
                    for row in rows
                )
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            case Image(file, _, alt):
                data = base64.b64encode(file.read_bytes()).decode("ascii")
                out.append(f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">')
            case Code(text):
                out.append(f"<pre>{esc(text)}</pre>")
    out.append(f"<script>{_IMAGES_LOADED}</script></body></html>")
    return "\n".join(out) + "\n"
