"""The lab's figures stated by hand, for tests that compute the lab's functions themselves;
and the bench's commands run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.lab.scaling import Figure, Parts
from chatlab.harness import ROOT

__all__ = ["given", "hand_parts", "run_bench"]


def run_bench(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m <args>`` from the project's root, its output captured. Not as an xdist
    worker: pytest-benchmark disables itself under xdist, and a pytest run from there
    would take this process's ``PYTEST_XDIST_*`` for its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )


def given(value: float) -> Figure:
    """A figure stated by hand, not measured."""
    return Figure.given(value, "", "by hand")


def hand_parts(logins_per_cpu_s: float, refreshes_per_cpu_s: float | None = None) -> Parts:
    """The function's parts by hand: u1 20 µs/frame, beta 2 µs/frame per further process
    (20 µs per message in rooms of 10), knee 48,000 delivered/s (a process' budget
    960,000 µs/s), Redis 25 µs per commit and 5 per delivery, 32 KiB per connection; the
    refresh figure only when given."""
    return Parts(
        room_size=10,
        connections=2000,
        slo="p99=100",
        u1=given(20),
        beta=given(2),
        knee=given(48000),
        redis_commit_us=given(25),
        redis_delivery_us=given(5),
        logins_per_cpu_s=given(logins_per_cpu_s),
        refreshes_per_cpu_s=None if refreshes_per_cpu_s is None else given(refreshes_per_cpu_s),
        bytes_per_connection=given(32768),
    )
