"""bench.tail's reading of the server's /stats and /metrics: which late ticks coincided
with what, and the window's histograms."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.tail import (
    RELAY,
    SERVER_ROOT,
    STOLEN,
    WAITED,
    TailRun,
    held_commits,
    knee,
    looked,
    parse_variants,
    second_figures,
    stalls,
    start_server,
    summary,
    window_figures,
    window_histogram,
)
from chatlab.harness import ROOT


def test_late_ticks_in_the_window_are_attributed_to_what_overlapped_them():
    tail = {
        "loop_lag": {
            "notable": [
                {"at": 100.050, "lag_s": 0.040},  # due 100.0: a GC pause ran then
                {"at": 101.030, "lag_s": 0.020},  # due 101.0: a checkpoint ran then
                {"at": 102.500, "lag_s": 0.015},  # nothing the server saw
                {"at": 150.000, "lag_s": 0.200},  # after the window: not counted
            ]
        },
        "gc": {"notable": [{"at": 100.045, "pause_s": 0.040}]},
        "slow_commits": [],
        "slow_checkpoints": [{"at": 100.990, "took_s": 0.030, "size": 900}],
    }
    found = stalls(tail, start=99.0, end=110.0)
    assert found["late_ticks_ms"] == [40.0, 20.0, 15.0]
    assert found["late_ticks_at"] == [100.05, 101.03, 102.5]
    assert found["late_tick_causes"] == {"gc": 1, "checkpoint": 1, "nothing seen": 1}


def test_env_values_of_one_name_are_variants_and_single_values_are_shared():
    variants = parse_variants(["GC_POLICY=default", "GC_POLICY=tuned", "TRANSPORT=picows"])
    assert variants == [
        {"transport": "picows", "gc_policy": "default"},
        {"transport": "picows", "gc_policy": "tuned"},
    ]


def test_a_windows_histogram_counts_only_what_fell_between_the_two_scrapes():
    def scrape(gen0: list[float], gen2: list[float]) -> dict[str, float]:
        bounds = ("0.001", "0.01", "0.1", "+Inf")
        samples = {}
        for labels, counts in (("generation=0", gen0), ("generation=2", gen2)):
            for bound, count in zip(bounds, counts, strict=True):
                samples[f"chat_gc_pause_seconds_bucket{{{labels},le={bound}}}"] = count
        return samples

    before = scrape([10, 12, 12, 12], [0, 0, 1, 1])
    after = scrape([30, 33, 33, 33], [0, 0, 1, 2])
    family, labels = "chat_gc_pause_seconds", ("generation=0", "generation=1", "generation=2")
    # 20 young pauses under 1 ms, one of 1-10 ms, and one full collection over 100 ms
    assert window_histogram(before, after, family, labels) == {
        "le 0.001": 20,
        "le 0.01": 1,
        "le inf": 1,
    }
    assert window_histogram(before, before, family, labels) == {}


def test_the_windows_figures_are_differences_between_the_two_scrapes():
    before = {
        "chat_commit_seconds_count{}": 100.0,
        "chat_commit_seconds_sum{}": 0.01,
        "process_cpu_seconds_total{}": 12.5,
        "chat_errors_total{code=unavailable}": 0.0,
    }
    after = {
        "chat_commit_seconds_count{}": 300.0,
        "chat_commit_seconds_sum{}": 0.03,
        "process_cpu_seconds_total{}": 20.0,
        "chat_errors_total{code=unavailable}": 2.0,
    }
    figures = window_figures(before, after)
    assert figures["commits"] == 200
    assert round(figures["commit_mean_ms"], 6) == 0.1
    assert figures["cpu_s"] == 7.5
    assert figures["unavailable"] == 2


def test_a_seconds_figures_come_from_the_scrapes_around_it():
    cpu, waited, stolen = "process_cpu_seconds_total{}", WAITED, STOLEN
    scrapes = [
        (10.0, {cpu: 1.0, waited: 0.100, stolen: 5.00}),
        (10.5, {cpu: 1.4, waited: 0.105, stolen: 5.00}),
        (11.0, {cpu: 1.8, waited: 0.110, stolen: 5.01}),
        (11.5, {cpu: 2.2, waited: 0.140, stolen: 5.03}),
    ]
    # the second [10.5, 11.5]: 0.8 s of CPU, 35 ms of waiting and 30 ms stolen over 1 s
    figures = second_figures(scrapes, 10.5, 11.5)
    assert round(figures["cpu_percent"], 6) == 80.0
    assert round(figures["core_wait_ms_per_s"], 6) == 35.0
    assert round(figures["core_steal_ms_per_s"], 6) == 30.0
    assert looked(figures) == " (cpu 80 %, waited 35.0 ms, host stole 30 ms)"
    # a second no scrape follows says nothing
    assert second_figures(scrapes, 11.2, 12.2) == {}


def test_a_seconds_held_commits_are_the_holds_that_overlapped_it():
    tail = {
        "slow_restart_holds": [
            {"at": 99.995, "took_s": 0.012, "size": 1},  # began before, ended inside
            {"at": 100.5, "took_s": 0.020, "size": 1},
            {"at": 101.2, "took_s": 0.015, "size": 0},  # after the second
        ]
    }
    assert held_commits(tail, second_end=101.0) == {"holds_ms": [12.0, 20.0]}
    assert held_commits(tail, second_end=103.0) == {}
    assert held_commits({}, second_end=101.0) == {}


def _step(rate: float, p99: float, superseded: bool = False) -> dict[str, Any]:
    return {
        "driver": "fast",
        "name": f"rate {rate:g}/s",
        "connections": 100,
        "offered_per_s": rate,
        "duration_s": 1.0,
        "sent": int(rate),
        "delivered": int(rate) * 10,
        "expected": int(rate) * 10,
        "sent_per_s": rate,
        "delivered_per_s": rate * 10,
        "latency_ms": {"p50": 1.0, "p90": 1.0, "p99": p99, "p999": p99, "max": p99},
        "superseded": superseded,
    }


def test_the_knee_is_the_highest_rate_held_and_says_whether_a_step_above_broke():
    slo = {"p99": 100.0}
    # 1562 held once, but the climb ran it again (a stall) and went by the re-run
    climb = [_step(1000, 5), _step(1250, 8), _step(1562, 9, superseded=True), _step(1562, 400)]
    assert knee(climb, slo) == (1250, True)
    assert knee(climb[:2], slo) == (1250, False)  # held at its top: the knee lies higher
    assert knee([_step(1000, 150)], slo) == (None, True)
    # one definition with the lab's (bench.lab.results.edge): a break the driver explains
    # (it was saturated) is no edge, so the knee is only a lower bound
    saturated = {**_step(1562, 400), "generator_saturated": True, "generator_limited": True}
    assert knee([*climb[:2], saturated], slo) == (1250, False)


def run_tail(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m bench.tail ARGS`` to completion; its status and output."""
    return subprocess.run(
        [sys.executable, "-m", "bench.tail", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_of_capacity_climbs_first_and_runs_at_that_fraction_of_the_knee(tmp_path: Path):
    out = tmp_path / "runs.json"
    result = run_tail(
        *("--of-capacity", "0.7", "--connections", "100", "--duration-s", "2", "--repeat", "1"),
        *("--capacity-step-s", "1", "--capacity-start-rate", "500", "--capacity-max-rate", "600"),
        *("--json", str(out), "--histograms"),
    )
    assert result.returncode == 0, result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("capacity of defaults:")]
    knee_rate = float(line.split(": ")[1].lstrip("≥ ").split(" ")[0])
    [run] = json.loads(out.read_text())
    assert run["rate"] == round(0.7 * knee_rate)
    assert 500 <= knee_rate <= 600  # the climb's first step and its top (two steps)
    assert run["p99_ms"] > 0 and run["errors"] == 0
    # the server's side: its loop's wait for its core and the host's steal, both measured
    # (either may be 0: a quiet machine's loop waits for nothing, and metal steals nothing)
    assert run["window_core_wait_ms_per_s"] >= 0
    assert run["window_core_steal_ms_per_s"] >= 0  # /proc/stat's steal column
    # and its checkpointer, counted (0 allowed: a 2 s run may not fill one checkpoint's
    # pages), each WAL restart holding the commits at least once
    checkpointer = run["checkpointer"]
    assert checkpointer["checkpoints"] >= 0 and "catch_ups" in checkpointer
    assert checkpointer["restart_holds"] >= checkpointer["wal_restarts"] >= 0
    assert checkpointer["wal_file_bytes_max"] > 0  # the server wrote and looked at its WAL
    assert "its loop waited for its core" in result.stdout
    assert "the host stole its core" in result.stdout
    assert "the WAL restarted" in result.stdout and "its file at most" in result.stdout
    # the summary at the end: the variant's medians and its verdict on the bound
    assert f"defaults: 1 run(s) at {run['rate']:g} sends/s: p99" in result.stdout
    assert "max under 50 ms, no GC pause over 10 ms and no unavailable: held in" in result.stdout
    assert isinstance(run["generator_notes"], list)
    # --histograms: the window's, restart holds (from /metrics) among them
    assert set(run["histograms"]) == {"gc_pause", "commit", "loop_lag", "restart_hold"}
    assert "    restart_hold (s, bucket upper bound: count): " in result.stdout


def test_of_capacity_outside_0_to_1_is_refused():
    result = run_tail("--of-capacity", "1.5")
    assert result.returncode == 2
    assert "--of-capacity must be in (0, 1]" in result.stderr


def _run(repeat: int, max_ms: float, **more: Any) -> TailRun:
    server = {"gc0_over_10ms": 0.0, "gc1_over_10ms": 0.0, "gc2_over_10ms": 0.0}
    server |= {"unavailable": 0.0, **more.pop("server", {})}
    fields = {
        "env": {"gc_policy": "tuned"},
        "rate": 6620.0,
        "server_metrics": True,
        "sent_per_s": 6620.0,
        "delivered_per_s": 66200.0,
        "p99_ms": 10.0 * repeat,
        "max_ms": max_ms,
        "errors": 0,
        "generator_limited": False,
        "generator_notes": [],
        "generator_cpu_percent": 50.0,
        "max_send_lag_ms": 1.0,
        "generator_gc_runs": 0,
        "window_start_monotonic": 0.0,
        "window_s": 60.0,
        "cpu_percent": 80.0,
        "cpu_us_per_frame": 13.0 + repeat / 10,
        "server": server,
        "late_ticks_ms": [],
        "late_ticks_at": [],
        "late_tick_causes": {},
        "checkpointer": {},
        "slow_seconds": [],
        "histograms": {},
        "window_core_steal_ms_per_s": 20.0,
        "repeat": repeat,
    }
    return TailRun(**{**fields, **more})


def test_the_summary_counts_runs_under_the_bound_and_leaves_out_generator_limited_ones():
    runs = [
        _run(1, 41.7),
        _run(
            2,
            55.0,
            window_core_steal_ms_per_s=35.4,
            slow_seconds=[
                {"t_s": 3.0, "max_ms": 55.0, "core_steal_ms_per_s": 94.0},
                {"t_s": 9.0, "max_ms": 51.0, "core_steal_ms_per_s": 6.0, "holds_ms": [15.8]},
                {"t_s": 20.0, "max_ms": 50.5, "core_steal_ms_per_s": 31.0, "holds_ms": [11.0]},
                {"t_s": 30.0, "max_ms": 52.0, "core_steal_ms_per_s": 12.0},
                {"t_s": 40.0, "max_ms": 45.0, "core_steal_ms_per_s": 80.0},  # under the bound
            ],
        ),
        _run(3, 30.0, server={"gc2_over_10ms": 1.0}),
        _run(4, 76.2, generator_limited=True, generator_notes=["max send lag 62.0 ms > 50 ms"]),
        _run(5, 12.0, server={"unavailable": 2.0}),
    ]
    lines = summary(runs, bound_ms=50)
    assert lines[0] == (
        "GC_POLICY=tuned: 5 run(s) at 6620 sends/s: p99 30.0 (10.0-50.0) ms, max 41.7"
        " (12.0-76.2) ms, server 13.30 (13.10-13.50) µs of CPU per delivered frame"
        " (medians, range in brackets)"
    )
    assert lines[1] == (
        "    max under 50 ms, no GC pause over 10 ms and no unavailable: held in 1 of the 4"
        " run(s) the driver kept pace with; not in run 2 (max 55.0 ms, the host stole 35 ms/s"
        " of the server's core), run 3 (1 GC pause(s) over 10 ms, the host stole 20 ms/s of"
        " the server's core), run 5 (2 unavailable, the host stole 20 ms/s of the server's"
        " core)"
    )
    assert lines[2] == (
        "    seconds with a delivery of 50 ms or more: 4 in 5 run(s); the host stole 30 ms or"
        " more of the server's core in 2, the commits were held 10 ms or more in 2, neither"
        " in 1"
    )
    assert lines[3] == (
        "    run 4 not counted: the driver was the limit too (max send lag 62.0 ms > 50 ms),"
        " the host stole 20 ms/s of the server's core; its max was 76.2 ms"
    )
    assert len(lines) == 4
    # every run under the bound, two variants: one paragraph each
    other = [_run(1, 20.0, env={}), _run(1, 49.9)]
    lines = summary(other, bound_ms=50)
    assert lines[0].startswith("defaults: 1 run(s) at 6620 sends/s: p99 10.0 ms, max 20.0 ms")
    assert lines[1].endswith("held in 1 of the 1 run(s) the driver kept pace with")
    assert lines[3].endswith("held in 1 of the 1 run(s) the driver kept pace with")


def test_the_relay_variant_runs_the_bare_relay_and_says_what_it_cannot_measure(tmp_path: Path):
    out = tmp_path / "runs.json"
    result = run_tail(
        *("--relay", "--rate", "300", "--connections", "100", "--duration-s", "2"),
        *("--repeat", "1", "--json", str(out)),
    )
    assert result.returncode == 0, result.stderr
    chat, relay = json.loads(out.read_text())
    assert chat["env"] == {} and chat["server_metrics"] is True and chat["commits"] > 0
    assert relay["env"] == RELAY and relay["server_metrics"] is False
    # the driver measured the relay: frames went through it, nothing lost
    assert relay["p99_ms"] > 0 and relay["errors"] == 0
    assert relay["delivered_per_s"] > 0.5 * 10 * 300
    # its CPU came from the process (psutil), its wait and steal from /proc
    assert relay["cpu_us_per_frame"] > 0
    assert relay["window_core_wait_ms_per_s"] >= 0  # may be 0, as above
    assert relay["commits"] == 0 and relay["checkpointer"] == {} and relay["late_ticks_ms"] == []
    [row] = [x for x in result.stdout.splitlines() if x.startswith("websockets relay (coalesced) ")]
    assert row.split()[5:11] == ["-"] * 6  # the server-side columns: not known
    assert "max under 50 ms (its GC pauses and errors are not measured): held in" in result.stdout
    assert "defaults: 1 run(s) at 300 sends/s" in result.stdout


def test_the_summary_of_the_relay_does_not_claim_gc_or_errors_were_checked():
    relay = [_run(1, 20.0, env=RELAY, server_metrics=False)]
    lines = summary(relay, bound_ms=50)
    assert lines[0].startswith("websockets relay (coalesced): 1 run(s) at 6620 sends/s")
    assert lines[1] == (
        "    max under 50 ms (its GC pauses and errors are not measured): held in 1 of the 1"
        " run(s) the driver kept pace with"
    )


def test_a_server_root_runs_the_chat_servers_code_from_that_checkout(tmp_path: Path):
    other = tmp_path / "other"
    shutil.copytree(ROOT / "chat_server", other / "chat_server")
    # the copy leaves a mark in the server's working directory when it is imported
    init = other / "chat_server" / "__init__.py"
    init.write_text(init.read_text() + '\n__import__("pathlib").Path("from-copy").touch()\n')
    args = argparse.Namespace(connections=10, server_core="0")
    for env, marked in (({SERVER_ROOT: str(other)}, True), ({}, False)):
        workdir = tmp_path / f"run-{marked}"
        workdir.mkdir()
        server, target, metrics_port = start_server(args, env, workdir)
        try:
            assert server.settings.get(SERVER_ROOT.upper()) is None  # not a server setting
            assert target.kind == "chat" and target.token_file is not None and metrics_port
            assert (workdir / "from-copy").exists() is marked
        finally:
            server.stop()


def test_stalls_read_an_older_servers_stats_that_remember_less():
    # 0d405a7's /stats tail had no late ticks, GC pauses or slow commits with their times
    assert stalls({"loop_lag": {"max_s": 0.02}}, start=0.0, end=10.0) == {
        "late_ticks_ms": [],
        "late_ticks_at": [],
        "late_tick_causes": {},
    }
    tail = {"loop_lag": {"notable": [{"at": 5.0, "lag_s": 0.03}]}}
    assert stalls(tail, start=0.0, end=10.0)["late_tick_causes"] == {"nothing seen": 1}
