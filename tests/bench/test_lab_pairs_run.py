"""A small real matrix on a machine kept busy on purpose: CPU per frame is still confirmed
from its pairs against the A/A pair's paired floor, and the knees are voided.

The clean chat server, the same server with ``REGRESSION=encode_per_recipient`` (each
broadcast encoded again for every member) and the clean server again as its A/A twin
run the paired cost phase and their climbs while busy loops of the test's own hold both
cores for the whole run. No timing assertions: only the verdicts and what the report
says about them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lab.findings import findings
from bench.lab.ladder import ladder
from bench.lab.results import Results, climbed_steps
from chatlab.harness import ROOT

#: busy loops on both cores for a minute: alone, after the parallel tests
pytestmark = pytest.mark.owns_machine

CLEAN, REGRESSED, TWIN = "clean", "encode_per_recipient", "clean (A/A)"
RATE = 1000.0
CLIMB_RATE = 200.0

PAIRED_MATRIX = f"""
description = "the clean server, a regression, and the clean server's A/A twin, paired"
baseline = "{CLEAN}"

[load]
connections = 100
room_size = 20
# a long body: encoding it again for every member is what the regression adds (stdlib
# json, 4,000 characters: about 20 µs a time against 2.5 for the demo's 60)
body_chars = 4000
rates = [{CLIMB_RATE:g}]
cost_rates = [{RATE:g}]
cost_step_s = 1
pairs = 5
climb = "p99=100"
factor = 2
resolution = 0.5
max_rate = {CLIMB_RATE:g}  # one climb step (and its re-runs): what is tested is the verdict
step_s = 0.5
warmup_s = 0.5
drain_s = 0.3
settle_s = 0.2
locust_profile = ""

[[config]]
name = "{CLEAN}"
[config.env]
SERIALIZER = "json"
EVENT_LOOP = "uvloop"
WS_DEFLATE = "off"
TRANSPORT = "picows"

[[config]]
name = "{REGRESSED}"
[config.env]
SERIALIZER = "json"
EVENT_LOOP = "uvloop"
WS_DEFLATE = "off"
TRANSPORT = "picows"
REGRESSION = "{REGRESSED}"

[[config]]
name = "{TWIN}"
same_as = "{CLEAN}"
"""

#: a busy loop pinned to one core: another program using the machine
SPIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def test_cpu_per_frame_is_confirmed_from_pairs_on_a_busy_machine_and_knees_are_voided(
    tmp_path: Path,
) -> None:
    matrix = tmp_path / "paired.toml"
    matrix.write_text(PAIRED_MATRIX)
    out = tmp_path / "report"
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN, str(core)])
        for core in sorted(os.sched_getaffinity(0))[:2]
    ]
    try:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "bench.lab", "run", "--matrix", str(matrix)),
                *("--out", str(out), "--quiet", "--wait-quiet-s", "0"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert done.returncode == 0, done.stdout + done.stderr
    results = Results.load(out / "results.json")
    # the three servers shared the server's core: five rounds each, A B B A
    assert {r.config for r in results.paired} == {CLEAN, REGRESSED, TWIN}
    for run in results.paired:
        assert run.status == "ok", run.error
        assert sorted(s.pair_round for s in run.steps) == [0, 1, 2, 3, 4]
        assert all(s.idle_cpu_s is not None for s in run.steps)
    found = ladder(results)
    assert found is not None and found.paired_rounds == 5
    # the busy loops held the server's core through every cost step ...
    assert found.cost_core.busy_windows == found.cost_core.windows > 0
    floor, source = found.cost_floor[RATE]
    assert source.startswith(f"the A/A pair ({CLEAN} = {TWIN}), 5 paired steps")
    # ... yet the regression's higher CPU per frame is confirmed against the paired floor,
    regressed = found.cost_vs_previous[REGRESSED][RATE]
    assert regressed.reference == CLEAN and regressed.paired is not None
    assert regressed.verdict == "higher", (regressed.ratio_text(), floor, regressed.reason)
    assert regressed.paired.low > 1 + floor
    # and the A/A pair is not
    twin = found.cost_vs_previous[TWIN][RATE]
    assert twin.reference == CLEAN and twin.verdict == "not confirmed"
    # the climb steps were busy on the server's core: each measured again twice, then kept
    # and flagged; every knee rests on one and is voided
    climbed = {r.config: len(climbed_steps(r.runs[0])) for r in found.rungs}
    assert all(r.busy_reruns == 2 * climbed[r.config] > 0 for r in found.rungs)
    assert all(all(r.busy) for r in found.rungs)
    verdicts = found.against_baseline.values()
    assert verdicts and all(c.reason == "the server's core was busy" for c in verdicts)
    # the findings open with what was busy and what that voided, one line per figure
    first, second = findings(found)[:2]
    assert first.startswith("CPU per frame: from 5 paired rounds") and "Nothing voided" in first
    reruns = sum(r.busy_reruns for r in found.rungs)
    assert second.startswith(f"Knees: {reruns} climb step(s) were measured again")
    assert second.endswith(f"voided: {CLEAN}, {REGRESSED}, {TWIN}.")
    md = (out / "report.md").read_text()
    assert md.split("## Findings", 1)[1].lstrip().startswith("- CPU per frame: from 5 paired")
