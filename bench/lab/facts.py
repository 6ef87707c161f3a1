"""What a report states about the machine and the software it measured on, and which
cores the server and the drivers get."""

from __future__ import annotations

import os
import platform
import subprocess
from contextlib import suppress
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from chatlab.harness import ROOT


def usable_cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def split_cores(cores: list[int]) -> tuple[list[int], list[int]]:
    """Server and generator cores: the first core for the server, the rest for the generator.

    On one core both share it (the report says so).
    """
    if len(cores) < 2:
        return cores, cores
    return cores[:1], cores[1:]


def machine_facts() -> dict[str, Any]:
    """What the report states about the machine and the software."""
    model = ""
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = {}
    for package in ("websockets", "uvloop", "orjson", "protobuf", "msgspec", "picows", "locust"):
        with suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return {
        "commit": git_commit(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "cpu_model": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def git_commit() -> str:
    """The checkout's commit (short), with ``+changes`` when its files differ from it;
    "" outside a git checkout."""

    def git(*args: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
            )
        except OSError:
            return None

    head = git("rev-parse", "--short", "HEAD")
    if head is None or head.returncode != 0:
        return ""
    dirty = git("status", "--porcelain", "--untracked-files=no")
    changed = dirty is not None and bool(dirty.stdout.strip())
    return head.stdout.strip() + ("+changes" if changed else "")
