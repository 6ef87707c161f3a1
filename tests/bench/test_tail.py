"""bench.tail's reading of the server's /stats: which late ticks coincided with what."""

from __future__ import annotations

from bench.tail import parse_variants, stalls


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
    assert found["late_tick_causes"] == {"gc": 1, "checkpoint": 1, "nothing seen": 1}


def test_env_values_of_one_name_are_variants_and_single_values_are_shared():
    variants = parse_variants(["GC_POLICY=default", "GC_POLICY=tuned", "TRANSPORT=picows"])
    assert variants == [
        {"transport": "picows", "gc_policy": "default"},
        {"transport": "picows", "gc_policy": "tuned"},
    ]
