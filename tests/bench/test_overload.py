"""bench.overload: the schedule past the knee and back, the figures of its seconds, the
verdicts, and one short real run of both variants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.lab.driver.latency import LatencyHistogram
from bench.overload import (
    NO_SHEDDING,
    judge,
    make_schedule,
    recovery_s,
    server_second,
    share,
    with_defaults,
)
from tests.support.lab import run_bench


def test_the_schedule_is_whole_steps_of_each_phase_at_its_share_of_the_knee():
    schedule = make_schedule(
        10000, under=0.5, over=1.15, before_s=10, over_s=30, after_s=15, step_s=5
    )
    assert schedule.rates == (5000,) * 2 + (11500,) * 6 + (5000,) * 3
    assert (schedule.over_start_s, schedule.drop_s, schedule.total_s) == (10, 40, 55)
    assert [schedule.phase(i) for i in (0, 1, 2, 7, 8, 10)] == [
        "before",
        "before",
        "over",
        "over",
        "after",
        "after",
    ]
    with pytest.raises(ValueError, match="--before-s 7: allowed: a multiple of --step-s 5"):
        make_schedule(10000, under=0.5, over=1.15, before_s=7, over_s=30, after_s=15, step_s=5)
    with pytest.raises(ValueError, match="--after-s 0"):
        make_schedule(10000, under=0.5, over=1.15, before_s=5, over_s=5, after_s=0, step_s=5)
    with pytest.raises(ValueError, match="0 < under < over"):
        make_schedule(10000, under=1.2, over=1.15, before_s=5, over_s=5, after_s=5, step_s=5)


def _second(t_s: float, p99: float | None, sent: float = 500.0) -> dict[str, Any]:
    return {"t_s": t_s, "p99_ms": p99, "sent_per_s": sent}


def test_recovery_is_when_p99_went_under_the_slo_for_good():
    before = [_second(t, 900.0) for t in (39.0, 40.0)]  # the overload: not counted
    # under at 43, over again at 44, under from 45 on: recovered 4 s after the drop
    after = [_second(41.0, 900.0), _second(42.0, 300.0), _second(43.0, 50.0)]
    after += [_second(44.0, 150.0), _second(45.0, 20.0), _second(46.0, 10.0)]
    assert recovery_s(before + after, drop_s=40.0, slo_ms=100) == 4.0
    assert recovery_s([*before, _second(41.0, 99.0)], drop_s=40.0, slo_ms=100) == 0.0
    # still over at the last second: not recovered within the run
    assert recovery_s([*after, _second(47.0, 100.0)], drop_s=40.0, slo_ms=100) is None
    # a second that sent and had nothing arrive is not recovered; one that sent nothing is
    stalled = [_second(41.0, None), _second(42.0, 5.0)]
    assert recovery_s(stalled, drop_s=40.0, slo_ms=100) == 1.0
    assert recovery_s([_second(41.0, None, sent=0), _second(42.0, 5.0)], 40.0, 100) == 0.0
    assert recovery_s(before, drop_s=40.0, slo_ms=100) is None  # no second after the drop
    assert share(25, 100) == 0.25 and share(3, 0) is None


def test_a_servers_second_reads_counters_between_scrapes_and_gauges_inside():
    refused, unavailable = "chat_overload_refused_total{}", "chat_errors_total{code=unavailable}"
    queue, rss = "chat_store_queue_depth{}", "process_resident_memory_bytes{}"
    full = "chat_store_refused_total{reason=queue_full}"
    scrapes = [
        (0.0, {refused: 0.0, unavailable: 0.0, queue: 1.0, rss: 10.0}),
        (0.5, {refused: 100.0, unavailable: 110.0, queue: 40.0, rss: 12.0, full: 10.0}),
        (1.0, {refused: 300.0, unavailable: 320.0, queue: 7.0, rss: 11.0, full: 20.0}),
        (1.5, {refused: 300.0, unavailable: 330.0, queue: 0.0, rss: 11.0, full: 30.0}),
    ]
    # [0.25, 1.25]: refused 50 -> 300, unavailable 55 -> 325 (of which 20 others: the
    # store's queue was full for 5 -> 25 of them, a counter absent from a scrape is 0 there)
    figures = server_second(scrapes, 0.25, 1.25)
    assert figures["refused_per_s"] == 250.0
    assert figures["unavailable_per_s"] == 20.0
    assert figures["store_queue_full_per_s"] == 20.0
    assert figures["store_wal_full_per_s"] == 0.0
    assert figures["queue_depth"] == 40.0 and figures["rss_bytes"] == 12.0
    assert figures["shedding"] is None and figures["outbound_bytes"] is None  # not scraped
    # past the last scrape: no rate
    assert server_second(scrapes, 1.25, 2.25)["refused_per_s"] is None


def _step(index: int, sent: int, unavailable: int, latencies_ms: list[float]) -> dict[str, Any]:
    histogram = LatencyHistogram()
    histogram.add(np.array([int(ms * 1000) for ms in latencies_ms], dtype=np.int64))
    return {
        "started_s": 100.0 + 5.1 * index,  # each step a little after the one before
        "sent": sent,
        "error_detail": {"unavailable": unavailable} if unavailable else {},
        "histogram": histogram.encoded(),
    }


def test_the_verdict_judges_the_overload_by_its_own_steps_and_the_bounds():
    schedule = make_schedule(1000, under=0.5, over=1.5, before_s=5, over_s=10, after_s=5, step_s=5)
    steps = [
        _step(0, 2500, 0, [5.0] * 100),
        _step(1, 7500, 3000, [20.0] * 99 + [80.0]),  # the overload: 40 % refused
        _step(2, 7500, 1500, [30.0] * 100),
        _step(3, 2500, 0, [900.0] * 100),  # after the drop: slow, not the overload's
    ]
    rows = [
        {"t_s": 5.0, "phase": "before", "rss_bytes": 50.0, "queue_depth": 3.0},
        {"t_s": 10.0, "phase": "over", "rss_bytes": 80.0, "queue_depth": 900.0, "p99_ms": 80.0},
        {"t_s": 15.3, "phase": "over", "rss_bytes": 70.0, "queue_depth": 20.0, "p99_ms": 30.0},
        {"t_s": 17.3, "phase": "after", "p99_ms": 300.0},
        {"t_s": 18.3, "phase": "after", "p99_ms": 40.0},
        {"t_s": 20.3, "phase": "after", "p99_ms": 40.0},
    ]
    for row in rows:
        row.setdefault("p99_ms", 5.0)
        row.setdefault("rss_bytes", 60.0)
        row.setdefault("queue_depth", 0.0)
        row |= {"sent_per_s": 500.0, "delivered_per_s": 5000.0, "outbound_bytes": 1024.0}
        row |= {"refused_per_s": 100.0, "unavailable_per_s": 0.0}
        row |= {"store_queue_full_per_s": 2.0 if row["phase"] == "over" else 0.0}
    verdict = judge(
        steps,
        rows,
        schedule,
        {"queue_depth": 500, "outbound_bytes": 2048},
        slo_ms=100,
        recovery_target_s=1,
    )
    assert (verdict.over_sent, verdict.over_unavailable) == (15000, 4500)
    assert verdict.over_refused_share == 0.3
    assert 29.9 <= verdict.over_p99_ms <= 30.1  # the two overload steps' deliveries merged
    assert verdict.over_worst_second_p99_ms == 80.0
    assert (verdict.rss_before_bytes, verdict.rss_max_bytes) == (50.0, 80.0)
    # the drop is the third step's start as the driver ran it (15.3 s), not the nominal 15
    assert verdict.recovery_s == 2.0
    assert verdict.held == {
        "answered within the SLO": True,
        "queue within its bound": False,  # 900 > 500
        "outbound bytes within their bound": True,
        "recovered in time": False,  # 2 s > 1 s
    }
    lines = verdict.lines()
    assert lines[0].startswith("overload: p99 of what was delivered 30.0 ms (worst second 80.0")
    assert "4500 of 15000 sends answered unavailable (30.0 %)" in lines[1]
    assert (verdict.store_queue_full, verdict.store_wal_full) == (4, 0)  # 2/s in 2 seconds
    assert "(the store's: queue full 4, WAL full 0)" in lines[1]
    assert "store queue at most 900 of STORE_QUEUE_MAX 500: MISSES" in lines[2]
    assert lines[3].startswith("recovery: p99 under 100 ms for good 2 s after the drop")


def test_each_variant_is_run_without_shedding_too_unless_it_sets_the_shedder():
    assert with_defaults([{}]) == [NO_SHEDDING, {}]
    regression = {"regression": "cpu_per_send"}
    assert with_defaults([regression]) == [{**regression, **NO_SHEDDING}, regression]
    tuned = [{"overload_lag_ms": "0"}, {"overload_lag_ms": "20"}]
    assert with_defaults(tuned) == tuned


@pytest.mark.owns_machine  # a server saturated on purpose, its driver timing it: alone
def test_a_short_overload_refuses_sends_with_the_shedder_and_none_without(tmp_path: Path):
    out = tmp_path / "overload.json"
    # cpu_per_send: each send burns 1 ms of CPU on the loop, so the server saturates near 1,000
    # sends/s on any machine, and 1.4x a knee of 1,000 is past it
    result = run_bench(
        *("bench.overload", "--knee-rate", "1000", "--over", "1.4"),
        *("--connections", "200", "--env", "REGRESSION=cpu_per_send"),
        *("--before-s", "2", "--over-s", "3", "--after-s", "2", "--step-s", "1"),
        *("--warmup-s", "1", "--json", str(out)),
        timeout_s=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["schedule"]["rates"] == [500, 500, 1400, 1400, 1400, 500, 500]
    without, shedding = report["runs"]
    assert without["env"] == {"regression": "cpu_per_send", "overload_lag_ms": "0"}
    assert shedding["env"] == {"regression": "cpu_per_send"}
    assert without["verdict"]["server_refused"] == 0
    assert without["verdict"]["over_unavailable"] == 0
    assert shedding["verdict"]["server_refused"] > 0
    assert shedding["verdict"]["over_unavailable"] > 0
    # the backlog the server without shedding carried past the drop is seen after it:
    # each delivery counts to the second it arrived in (the driver's --continuous), none
    # is lost to the step that sent it at a step's end
    assert without["verdict"]["after_p99_ms"] > 100
    for run in (without, shedding):
        assert all("after_drain" not in step["error_detail"] for step in run["steps"])
        assert [r["phase"] for r in run["seconds"]].count("over") >= 3
        assert run["verdict"]["queue_depth_max"] is not None
        assert run["verdict"]["over_sent"] > 0
    assert "recovery: p99 under 100 ms for good" in result.stdout
    assert out.with_suffix(".png").stat().st_size > 0
