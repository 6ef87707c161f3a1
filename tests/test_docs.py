"""The documents say what is true now and send the reader nowhere outside the repository.

Checked on the files as they are: no document, docstring or comment points at notes or
issues a reader of the repository cannot open; ``docs/performance.md`` is a design
document with one current-figures table, not a journal of dated measurements; the
decisions log's index lists every entry; and "the seed report" is defined where a
document first names it, in the same words everywhere.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DECISIONS = DOCS / "decisions"
#: folders that hold no document of ours (environments, caches, run output)
NOT_OURS = {".git", ".venv", ".tox", ".ruff_cache", ".pytest_cache", "__pycache__", "reports"}
NOT_OURS |= {"profiles", "data", "node_modules", "build", "dist", "keys"}
#: where prose lives: documents, docstrings and comments, schemas, the report's templates
PROSE_SUFFIXES = {".md", ".rst", ".txt", ".py", ".proto", ".toml", ".j2", ".html", ".example"}
#: pointers at something outside the repository, by any suffix above
OUTSIDE = re.compile(r"\bclosing[\s#/]+notes?\b", re.IGNORECASE)
#: issue numbers: fine in commit messages, outside the repository in a document or docstring
ISSUE_NUMBER = re.compile(r"\bissues?[\s#/]+#\d+", re.IGNORECASE)
ISSUE_NUMBER_SUFFIXES = {".md", ".rst", ".py", ".proto", ".toml"}
#: the definition, word for word wherever it is given (line breaks and comment marks aside)
SEED_DEFINITION = (
    "the report this project started from, whose server measured 6,500 → 18,000"
    " messages/s on its own machine at p90/p95/p99 481/570/768 ms"
)
#: documents a reader opens alone: the first that names the seed report defines it
SEED_DOCUMENTS = ("README.md", "docs/performance.md", "docs/protocol.md", "loadtest/README.md")


def prose_files() -> list[Path]:
    """Every file of ours whose suffix carries prose, outside environments and run output."""
    found = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in NOT_OURS]
        found += [Path(folder, n) for n in names if Path(n).suffix in PROSE_SUFFIXES]
    return sorted(found)


def pointers_outside(text: str, suffix: str) -> list[str]:
    """The phrases in ``text`` that send a reader outside the repository."""
    hits = [m.group(0) for m in OUTSIDE.finditer(text)]
    if suffix in ISSUE_NUMBER_SUFFIXES:
        hits += [m.group(0) for m in ISSUE_NUMBER.finditer(text)]
    return hits


def headings(markdown: str) -> list[str]:
    """The Markdown headings of ``markdown`` (``#`` lines outside fenced code)."""
    found, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.append(line)
    return found


def dated_measurement_headings(markdown: str) -> list[str]:
    """Headings that date a measurement ("Measured again on 2026-11-25") or carry a date."""
    return [
        h
        for h in headings(markdown)
        if re.search(r"\bmeasured\b", h, re.IGNORECASE) or re.search(r"\d{4}-\d{2}-\d{2}", h)
    ]


def unlisted_decisions(index: str, entries: list[str]) -> tuple[set[str], set[str]]:
    """Entry files the index does not link, and links of the index to no entry file."""
    linked = set(re.findall(r"\]\((\d{4}-[a-z0-9-]+\.md)(?:#[^)]*)?\)", index))
    return set(entries) - linked, linked - set(entries)


def seed_report_used_before_defined(text: str) -> str | None:
    """Where ``text`` first names the seed report without defining it there, else None."""
    first = re.search(r"\bseed report\b|\bthe seed's\b", text, re.IGNORECASE)
    if first is None:
        return None
    after = " ".join(text[first.end() : first.end() + 400].split())
    if first.group(0).lower() == "seed report" and after.startswith(
        "(" + " ".join(SEED_DEFINITION.split()[:6])
    ):
        return None
    return " ".join(text[max(0, first.start() - 60) : first.end() + 60].split())


def seed_definitions(text: str) -> tuple[int, int]:
    """How many times ``text`` begins the seed report's definition, and how many of those
    go on word for word (across line breaks and ``//``, ``#`` comment marks)."""
    words = SEED_DEFINITION.split()
    gap = r"[\s/#]+"
    begun = re.findall(gap.join(map(re.escape, words[:6])), text)
    whole = re.findall(gap.join(map(re.escape, words)), text)
    return len(begun), len(whole)


def test_no_document_points_outside_the_repository() -> None:
    files = prose_files()
    assert ROOT / "README.md" in files and ROOT / "chat_server" / "store" / "sqlite.py" in files
    offenders = {
        str(p.relative_to(ROOT)): hits
        for p in files
        if (hits := pointers_outside(p.read_text(errors="replace"), p.suffix))
    }
    assert offenders == {}, "point at docs/decisions/ or the report instead"


def test_pointers_outside_are_recognised() -> None:
    # built here, so that this file does not hold what it looks for
    closing, issue = "Closing" + " Notes", "issue" + " #17"
    assert pointers_outside(f"see the {closing} of the issue", ".md") == [closing]
    assert pointers_outside(f"(changed, {issue})", ".py") == [issue]
    assert pointers_outside(f"(changed, {issue})", ".toml") == [issue]  # the matrices' comments
    assert pointers_outside(f"(changed, {issue})", ".txt") == []
    assert pointers_outside("the closing handshake; issuer chatlab-auth", ".md") == []


def test_performance_md_is_a_design_document_with_one_current_figures_table() -> None:
    text = (DOCS / "performance.md").read_text()
    assert dated_measurement_headings(text) == []
    assert headings(text).count("## Current figures") == 1
    section = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    for stamp in ("**Commit:**", "**Machine:**", "**Date:**", "**Regenerate**"):
        assert stamp in section


def test_dated_headings_are_recognised() -> None:
    journal = "# T\n## Measured again on 2026-11-25 (same machines)\n## Current figures\n"
    assert dated_measurement_headings(journal) == [
        "## Measured again on 2026-11-25 (same machines)"
    ]
    assert dated_measurement_headings("## Round 7, 2026-11-26\n```\n# 2026-11-26\n```\n") == [
        "## Round 7, 2026-11-26"
    ]


def test_the_decisions_index_lists_every_entry() -> None:
    entries = sorted(p.name for p in DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert entries, "no decisions entries"
    missing, dangling = unlisted_decisions((DECISIONS / "README.md").read_text(), entries)
    assert missing == set(), "add them to docs/decisions/README.md"
    assert dangling == set(), "the index links entries that do not exist"


def test_an_unlisted_decision_is_found() -> None:
    index = "| [0001](0001-a.md) | ... |\nsee [round 7](0002-b.md#round-7)\n"
    assert unlisted_decisions(index, ["0001-a.md", "0002-b.md"]) == (set(), set())
    assert unlisted_decisions(index, ["0001-a.md", "0002-b.md", "0003-c.md"]) == (
        {"0003-c.md"},
        set(),
    )
    assert unlisted_decisions(index, ["0001-a.md"]) == (set(), {"0002-b.md"})


@pytest.mark.parametrize("document", SEED_DOCUMENTS)
def test_the_seed_report_is_defined_where_first_named(document: str) -> None:
    assert seed_report_used_before_defined((ROOT / document).read_text()) is None


def test_the_seed_report_is_defined_in_the_same_words_everywhere() -> None:
    readme = (ROOT / "README.md").read_text()
    assert seed_definitions(readme) == (1, 1)
    differing = {}
    for path in prose_files():
        if path == Path(__file__).resolve():
            continue  # SEED_DEFINITION above, split over two literals
        begun, whole = seed_definitions(path.read_text(errors="replace"))
        if begun != whole:
            differing[str(path.relative_to(ROOT))] = (begun, whole)
    assert differing == {}, f"say it as {SEED_DEFINITION!r}"


def test_a_seed_report_named_before_its_definition_is_found() -> None:
    defined = f"the baseline of the seed report ({SEED_DEFINITION}), and the seed's method"
    assert seed_report_used_before_defined(defined) is None
    assert seed_report_used_before_defined("no seed here") is None
    assert seed_report_used_before_defined(
        f"the seed's ladder. The seed report ({SEED_DEFINITION})"
    )
    assert seed_report_used_before_defined(
        f"the seed report's table. The seed report ({SEED_DEFINITION})"
    )
    wrapped = defined.replace("this project", "this\nproject")
    assert seed_report_used_before_defined(wrapped) is None
    assert seed_definitions("// " + wrapped.replace(" on its", "\n// on its")) == (1, 1)
    assert seed_definitions(wrapped.replace("6,500", "6,400")) == (1, 0)


def unlisted_modules(readme: str, package: Path) -> list[str]:
    """The modules and subpackages of ``package`` that the README's "What is where" block
    does not name (as ``<package>/<name>.py`` or ``<package>/<name>/``)."""
    section = readme.split("## What is where", 1)[1].split("\n## ", 1)[0]
    names = [
        f"{package.name}/{path.name}/" if path.is_dir() else f"{package.name}/{path.name}"
        for path in sorted(package.iterdir())
        if (path.suffix == ".py" and path.name != "__init__.py")
        or (path.is_dir() and (path / "__init__.py").exists())
    ]
    return [name for name in names if name not in section]


def test_what_is_where_names_every_module_of_the_chat_server() -> None:
    readme = (ROOT / "README.md").read_text()
    assert unlisted_modules(readme, ROOT / "chat_server") == []


def test_an_unlisted_module_is_found(tmp_path: Path) -> None:
    package = tmp_path / "chat_server"
    (package / "store").mkdir(parents=True)
    (package / "store" / "__init__.py").write_text("")
    for name in ("__init__.py", "wiring.py", "limits.py"):
        (package / name).write_text("")
    readme = "## What is where\n\nchat_server/wiring.py  builds\nchat_server/store/  x\n## Next\n"
    assert unlisted_modules(readme, package) == ["chat_server/limits.py"]
