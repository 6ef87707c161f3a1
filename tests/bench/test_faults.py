"""bench.faults end to end, small: a kill -9 under load, retrying clients, a count."""

from __future__ import annotations

import subprocess
import sys


def test_a_kill9_under_load_leaves_every_send_stored_exactly_once():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.faults",
            "--fault",
            "kill9",
            "--clients",
            "20",
            "--rate",
            "300",
            "--duration-s",
            "4",
            "--server-core",
            "off",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    counts = dict(line.split(None, 1) for line in done.stdout.splitlines()[:-1])
    assert int(counts["sends"]) > 0
    assert counts["sends"] == counts["acked"] == counts["stored"]
    assert int(counts["reconnects"]) >= 20  # every client lost its connection and came back
    assert done.stdout.splitlines()[-1] == "every send stored exactly once"
