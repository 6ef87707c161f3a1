"""The house rules a reader relies on, checked on the source: one-way imports, short modules.

The import walk reads each module's own top level (and ``if``/``try``/``with`` blocks
there), leaving out imports inside functions and under ``TYPE_CHECKING``: those run
later or never, so they cannot make a circle at import time.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("chat_server", "auth_service", "chatlab", "loadtest", "bench")
SERVICES = ("chat_server", "auth_service")
MAX_MODULE_LINES = 800


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of ``packages`` under ``root`` by dotted name (a package by its own)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from _top_level_imports(node.body)
            yield from _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level_imports(node.body)
            for handler in node.handlers:
                yield from _top_level_imports(handler.body)
            yield from _top_level_imports(node.orelse)
            yield from _top_level_imports(node.finalbody)
        elif isinstance(node, ast.With):
            yield from _top_level_imports(node.body)


def import_graph(found: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``found`` it imports at module level.

    ``from X import Y`` needs ``X`` (and ``X.Y`` when that is a module); ``import X.Y``
    needs ``X.Y``. Relative imports are resolved against the importing module.
    """
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        needs: set[str] = set()
        for node in _top_level_imports(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            needs.update(t for t in targets if t in found and t != name)
        graph[name] = needs
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_module_imports_another_in_a_circle():
    assert circles(import_graph(modules())) == []


def test_the_walk_finds_a_circle_and_ignores_function_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg import a\n")
    (pkg / "a.py").write_text("from pkg.b import thing\n")
    (pkg / "b.py").write_text("try:\n    import pkg.c\nexcept ImportError:\n    pass\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
        "def later():\n    import pkg.a\nfrom . import a\n"
    )
    (pkg / "d.py").write_text("def later():\n    from pkg import a\n")
    found = modules(tmp_path, ("pkg",))
    assert circles(import_graph(found)) == [["pkg", "pkg.a", "pkg.b", "pkg.c"]]
    (pkg / "c.py").write_text("if TYPE_CHECKING:\n    import pkg.a\n")
    assert circles(import_graph(found)) == []


@pytest.mark.parametrize("service", SERVICES)
def test_neither_service_imports_the_other_at_module_level(service: str):
    other = next(s for s in SERVICES if s != service)
    graph = import_graph(modules())
    crossing = sorted(
        (name, needed)
        for name, needs in graph.items()
        if name.split(".")[0] == service
        for needed in needs
        if needed.split(".")[0] == other
    )
    assert crossing == []


def test_no_module_passes_800_lines():
    long = {
        name: lines
        for name, path in modules().items()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_test_module_imports_another_or_a_conftest():
    """What tests share lives in ``tests/support``: a test module or a conftest imported
    elsewhere would run its tests or fixtures twice, under two names."""
    tests = modules(ROOT, ("tests",))
    graph = import_graph(tests)
    shared = sorted(
        (name, needed)
        for name, needs in graph.items()
        for needed in needs
        if needed.rpartition(".")[2].startswith(("test_", "conftest"))
    )
    assert shared == []
