"""The busy-machine rule with plain numbers on both sides of each bound, and the wait for a
quiet machine driven by a given sequence of readings."""

from __future__ import annotations

import pytest

from bench.lab.machine import (
    OTHERS_LIMIT_PERCENT,
    QUIET_SECONDS,
    STEAL_LIMIT_MS_PER_S,
    MachineLoad,
    busy_reasons,
    is_busy,
    machine_verdict,
    quiet_enough,
    wait_for_quiet,
)

QUIET = MachineLoad(others_percent=2.0, steal_ms_per_s=0.5)
BUSY = MachineLoad(others_percent=80.0, steal_ms_per_s=0.0)


@pytest.mark.parametrize(
    ("others", "steal", "busy"),
    [
        (OTHERS_LIMIT_PERCENT - 0.1, 0.0, False),
        (OTHERS_LIMIT_PERCENT, 0.0, False),  # at the bound is not past it
        (OTHERS_LIMIT_PERCENT + 0.1, 0.0, True),
        (0.0, STEAL_LIMIT_MS_PER_S - 0.1, False),
        (0.0, STEAL_LIMIT_MS_PER_S, False),
        (0.0, STEAL_LIMIT_MS_PER_S + 0.1, True),
        (OTHERS_LIMIT_PERCENT + 1, STEAL_LIMIT_MS_PER_S + 1, True),
    ],
)
def test_a_window_is_busy_only_past_a_bound(others: float, steal: float, busy: bool) -> None:
    load = MachineLoad(others, steal)
    assert is_busy(load) is busy
    assert bool(busy_reasons(load)) is busy


def test_the_reasons_name_each_figure_and_its_bound() -> None:
    reasons = busy_reasons(MachineLoad(55.0, 12.5))
    assert reasons == [
        f"other processes used 55 % of a core (> {OTHERS_LIMIT_PERCENT:g} %)",
        f"the host stole 12.5 ms/s (> {STEAL_LIMIT_MS_PER_S:g} ms/s)",
    ]


def test_a_load_comes_from_a_windows_cpu_seconds() -> None:
    # 0.3 s of other processes' CPU and 0.02 s stolen over 2 s: 15 % of a core, 10 ms/s
    load = MachineLoad.over(2.0, 0.3, 0.02)
    assert load == MachineLoad(pytest.approx(15.0), pytest.approx(10.0))
    assert MachineLoad.over(0.0, 1.0, 1.0) is None
    assert MachineLoad.over(1.0, -0.1, -0.1) == MachineLoad(0.0, 0.0)  # counters' jitter


def test_the_verdict_counts_busy_windows_and_names_the_worst() -> None:
    verdict = machine_verdict([QUIET, BUSY, None, MachineLoad(1.0, 9.0)])
    assert verdict.windows == 3 and verdict.busy_windows == 2 and verdict.busy
    assert verdict.worst_others_percent == 80.0 and verdict.worst_steal_ms_per_s == 9.0
    text = verdict.sentence()
    assert text.startswith("This machine was busy: in 2 of 3 measured steps")
    assert "knees and percentiles by the server's own core, CPU per frame by its paired" in text


def test_a_quiet_run_says_so_and_an_unread_one_says_it_was_not_recorded() -> None:
    quiet = machine_verdict([QUIET, QUIET])
    assert not quiet.busy and quiet.sentence().startswith("The machine was quiet in all 2")
    assert "not recorded" in machine_verdict([None]).sentence()


def test_quiet_enough_wants_the_last_seconds_all_quiet() -> None:
    assert not quiet_enough([QUIET] * (QUIET_SECONDS - 1))
    assert quiet_enough([BUSY] + [QUIET] * QUIET_SECONDS)
    assert not quiet_enough([QUIET] * QUIET_SECONDS + [BUSY])


def test_the_wait_ends_at_the_first_quiet_stretch() -> None:
    readings = iter([BUSY, BUSY] + [QUIET] * QUIET_SECONDS + [BUSY] * 100)
    said: list[str] = []
    verdict = wait_for_quiet(60, said.append, lambda: next(readings))
    assert not verdict.busy and verdict.windows == QUIET_SECONDS
    assert next(readings) is BUSY  # it stopped reading right after the quiet stretch
    assert said and said[0].startswith("waiting for a quiet machine (other processes used 80 %")


def test_the_wait_is_bounded_and_says_it_starts_anyway() -> None:
    said: list[str] = []
    verdict = wait_for_quiet(0, said.append, lambda: BUSY)
    assert verdict.busy
    assert said[-1].startswith("the machine is still busy after 0 s (other processes used 80 %")
    assert "starting anyway" in said[-1]
