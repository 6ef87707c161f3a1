"""The transports stand on their libraries' public API: no private name of websockets or
picows is imported, no class is swapped, no library method overridden or factory replaced.
The one reach inside (picows' server protocol, which the accept loop needs) is named here
and pinned below picows' next major release, as is websockets."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

from tests.support import ROOT

TRANSPORT = ROOT / "chat_server" / "transport"
LIBRARIES = ("websockets", "picows")
#: (module, name) imported from inside a library, each with its pin in pyproject.toml
PINNED_REACHES = {("picows.picows", "WSProtocol")}
#: what a transport must not assign (a class swap, a parser restart, a server's factory)
FORBIDDEN_STORES = {"__class__", "parser", "_protocol_factory"}
#: websockets' and picows' methods a transport must not override
FORBIDDEN_OVERRIDES = {"process_event", "parse", "process_request", "recv_frame"}


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(TRANSPORT.glob("*.py")):
        yield path, ast.parse(path.read_text())


def test_the_transports_import_only_public_names_of_their_libraries():
    reaches = set()
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            if node.module.split(".")[0] not in LIBRARIES:
                continue
            for alias in node.names:
                if (node.module, alias.name) in PINNED_REACHES:
                    reaches.add((node.module, alias.name))
                    continue
                assert node.module != "picows.picows", f"{path.name}: {alias.name} is picows'"
                assert not alias.name.startswith("_"), f"{path.name}: {node.module}.{alias.name}"
                assert not any(part.startswith("_") for part in node.module.split("."))
    assert reaches == PINNED_REACHES  # a reach no longer needed: drop it here and its pin


def test_no_class_swap_no_library_override_no_replaced_factory():
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                assert node.attr not in FORBIDDEN_STORES, f"{path.name}:{node.lineno}"
            if isinstance(node, ast.ClassDef):
                methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                assert not methods & FORBIDDEN_OVERRIDES, f"{path.name}: {node.name}"


def test_both_libraries_are_pinned_below_their_next_major_release():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {dep.split(">")[0].split("<")[0]: dep for dep in project["dependencies"]}
    assert "<18" in pins["websockets"]
    assert "<3" in pins["picows"]
