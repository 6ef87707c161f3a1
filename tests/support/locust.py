"""Locust runs of the load test as subprocesses, read back from their reports.

Locust runs only as a subprocess (:func:`run_locust`): its import monkey-patches the
standard library for gevent, which would break asyncio in the test process.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatlab.harness import FAST_ARGON2, ROOT

__all__ = ["LOAD_TEST_AUTH", "LOCUST", "LocustRun", "run_command", "run_locust"]

#: ``locust -f loadtest/chat.py``, as a command line
LOCUST = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "chat.py")]

#: auth settings for load tests: fast argon2 and no per-address limits (all users share 127.0.0.1)
LOAD_TEST_AUTH = {
    **FAST_ARGON2,
    "LOGIN_RATE_PER_CLIENT_PER_MIN": "0",
    "REGISTER_RATE_PER_CLIENT_PER_MIN": "0",
    "REFRESH_RATE_PER_CLIENT_PER_MIN": "0",
    "LOG_LEVEL": "warning",
}


def run_command(
    *command: str, cwd: Path = ROOT, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion (bounded in time), capturing its output as text."""
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
    )


@dataclass
class LocustRun:
    """A finished headless Locust run: exit status, output, and its CSV and JSON reports."""

    returncode: int
    output: str
    stats: dict[str, dict[str, str]]
    failures: list[dict[str, str]]
    exceptions: list[dict[str, str]]
    report: dict[str, Any]

    def entry(self, name: str) -> dict[str, str]:
        """The stats row named ``name`` (KeyError names the rows there are)."""
        try:
            return self.stats[name]
        except KeyError:
            raise KeyError(f"no {name!r} row; rows: {sorted(self.stats)}\n{self.output}") from None

    def count(self, name: str) -> int:
        """Requests recorded under ``name``."""
        return int(self.entry(name)["Request Count"])

    def fails(self, name: str) -> int:
        """Failures recorded under ``name``."""
        return int(self.entry(name)["Failure Count"])


def run_locust(workdir: Path, *args: str, timeout_s: float = 90) -> LocustRun:
    """Run ``locust -f loadtest/chat.py --headless ARGS`` to completion; read its reports.

    Fails the test if a user or an event handler raised (Locust's exceptions table, or a
    traceback through ``loadtest/`` in the output): bugs of the load test, not results.
    """
    prefix = workdir / "locust"
    report_path = workdir / "delivery.json"
    proc = run_command(
        *LOCUST,
        "--headless",
        "--only-summary",
        "--csv",
        str(prefix),
        "--delivery-report",
        str(report_path),
        *args,
        cwd=workdir,
        timeout_s=timeout_s,
    )
    output = proc.stdout + proc.stderr
    stats: dict[str, dict[str, str]] = {}
    failures: list[dict[str, str]] = []
    exceptions: list[dict[str, str]] = []
    if Path(f"{prefix}_stats.csv").exists():
        with open(f"{prefix}_stats.csv", newline="") as f:
            stats = {row["Name"]: row for row in csv.DictReader(f)}
        with open(f"{prefix}_failures.csv", newline="") as f:
            failures = list(csv.DictReader(f))
        with open(f"{prefix}_exceptions.csv", newline="") as f:
            exceptions = list(csv.DictReader(f))
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    run = LocustRun(proc.returncode, output, stats, failures, exceptions, report)
    # whatever the run measured, the load test itself must not have crashed
    assert not exceptions, exceptions
    ours = [tb for tb in _tracebacks(output) if "/loadtest/" in tb]
    assert not ours, "\n\n".join(ours)
    return run


def _tracebacks(output: str) -> list[str]:
    """Every traceback printed in ``output``, each up to its exception line.

    (Locust itself sometimes prints one at exit with ``--processes`` and ``--csv``: its
    CSV writer greenlet writes once more after the files were closed. Only tracebacks
    through ``loadtest/`` are ours.)
    """
    blocks = []
    for part in output.split("Traceback (most recent call last):")[1:]:
        lines = part.splitlines()
        end = next(
            (i for i, line in enumerate(lines) if line and not line.startswith(" ")), len(lines)
        )
        blocks.append("\n".join(lines[: end + 1]))
    return blocks
