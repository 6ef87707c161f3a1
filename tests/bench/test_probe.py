"""bench.probe: fixed-rate steps against a real server, sampled from outside."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.probe import CLOCK_TICKS, summarize
from tests.support.lab import run_bench

SHORT = ("--connections", "100", "--step-s", "2", "--drain-s", "0.5", "--warmup-s", "1")


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench("bench.probe", "--quiet", *args, timeout_s=180)


def test_a_chat_server_probed_at_two_rates_reports_its_store_loop_and_threads(tmp_path: Path):
    out = tmp_path / "probe"
    result = _probe(*SHORT, "--rates", "100,400", "--out", str(out))
    assert result.returncode == 0, result.stderr
    rows = json.loads((out / "summary.json").read_text())
    assert [row["rate"] for row in rows] == [100, 400]
    for row in rows:
        assert row["lost"] == 0 and row["errors"] == 0
        assert row["delivered_per_s"] > 0 and row["cpu_us_per_frame"] > 0
        # the server's own view: commits of at least one send, the ticker ticking
        assert row["commits_per_s"] > 0 and row["commit_size"] >= 1
        assert row["commit_ms"] > 0 and row["loop_ticks_per_s"] > 0
        assert row["store_queue_max"] >= 0 and row["store_refused"] == {}
        # from outside: its sockets, its main thread's syscalls
        assert row["recv_q_max"] >= 0 and row["main_reads_per_send"] > 0
    samples = json.loads((out / "samples.json").read_text())
    assert len([s for s in samples if "err" not in s]) >= 8  # 0.25 s apart over ~6 s
    assert "sends/s" in result.stdout and "summary.json" in result.stdout
    assert (out / "probe.png").read_bytes().startswith(b"\x89PNG")  # the looks against time


def test_a_floor_relay_is_probed_without_the_servers_own_figures(tmp_path: Path):
    out = tmp_path / "probe"
    result = _probe(*SHORT, "--target", "relay", "--rates", "200", "--out", str(out))
    assert result.returncode == 0, result.stderr
    (row,) = json.loads((out / "summary.json").read_text())
    assert row["lost"] == 0 and row["cpu_us_per_frame"] > 0
    assert "commit_size" not in row and row["send_q_max"] >= 0
    assert (out / "probe.png").read_bytes().startswith(b"\x89PNG")  # no store panel, still drawn


def test_the_relay_takes_no_server_settings():
    result = _probe("--target", "relay", "--env", "STORE_QUEUE_MAX=5")
    assert result.returncode == 2
    assert "the relay has none" in result.stderr


def _look(t: float, *, cpu: int, batches: int, messages: int, commit_s: float, queue: int):
    thread = {"name": "python", "utime": cpu, "stime": 0, "io": {"syscr": 10 * t, "syscw": 0}}
    return {
        "t": t,
        "cpu_user": cpu / 100,
        "cpu_sys": 0.0,
        "recv_q": 0,
        "recv_q_sockets": 0,
        "send_q": 100,
        "rss": 2**20,
        "voluntary_switches": 100 * t,
        "threads": {"7": thread},
        "stats": {
            "store": {
                "batches_committed": batches,
                "messages_committed": messages,
                "queue_depth": queue,
                "refused": {"queue_full": batches // 10},
            },
            "tail": {
                "commit": {"count": batches, "sum_s": commit_s},
                "loop_lag": {"count": 100 * t, "sum_s": 0.001 * t},
            },
        },
    }


def test_a_step_is_cut_to_its_send_phase_and_divided_by_what_it_delivered():
    step = {
        "offered_per_s": 1000.0,
        "started_s": 10.0,
        "duration_s": 2.0,
        "delivered": 20_000,
        "expected": 20_000,
        "errors": 0,
        "delivered_per_s": 10_000.0,
        "sent_per_s": 1000.0,
        "latency_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0},
        "server_cpu_s": 0.5,
        "window_s": 2.0,
    }
    samples = [
        _look(9.0, cpu=0, batches=0, messages=0, commit_s=0.0, queue=0),
        _look(10.0, cpu=100, batches=100, messages=300, commit_s=0.01, queue=5),
        _look(11.0, cpu=150, batches=600, messages=1300, commit_s=0.03, queue=40),
        _look(12.0, cpu=200, batches=1100, messages=2300, commit_s=0.06, queue=7),
        {"t": 11.5, "err": "ConnectionRefusedError()"},  # a failed look is skipped
    ]
    (row,) = summarize([step], samples)
    assert row["cpu_us_per_frame"] == pytest.approx(25.0)  # 0.5 s over 20,000 frames
    assert row["cpu_percent"] == pytest.approx(50.0)  # 1 s of CPU over the 2-s send phase
    # from the look at 10 s to the one at 12 s: 1,000 commits of 2,000 messages
    assert row["commits_per_s"] == pytest.approx(500.0)
    assert row["commit_size"] == pytest.approx(2.0)
    assert row["commit_ms"] == pytest.approx(0.05)  # 50 ms over 1,000 commits
    assert (row["store_queue_max"], row["store_queue_median"]) == (40, 7)
    assert row["store_refused"] == {"queue_full": 100}
    assert row["loop_ticks_per_s"] == pytest.approx(100.0)
    assert row["loop_lag_ms"] == pytest.approx(0.01)
    # 100 ticks of the main thread's user time over 20,000 frames (2 s at 10,000/s)
    assert row["main_user_us_per_frame"] == pytest.approx(100 / CLOCK_TICKS * 1e6 / 20_000)
    assert row["main_reads_per_send"] == pytest.approx(20 / 2000)
    assert row["voluntary_switches_per_s"] == pytest.approx(100.0)
