"""The pairing statistic and which bound judges which figure, with plain numbers on both
sides of each verdict."""

from __future__ import annotations

import math

import pytest

from bench.lab.ladder import Cost, judge_costs
from bench.lab.machine import MachineLoad, core_load, core_share
from bench.lab.pairs import (
    FIGURE_BOUNDS,
    floor_of,
    pair_order,
    paired_ratio,
    paired_verdict,
    step_busy,
    t_975,
    voided,
)
from bench.lab.results import Step


def test_a_paired_ratio_is_the_mean_log_ratio_with_its_t_interval() -> None:
    # five pairs whose ratios are 1.10, 1.12, 1.08, 1.11, 1.09: the geometric mean ~1.10
    ys = [10.0, 20.0, 10.0, 30.0, 10.0]
    ratios = [1.10, 1.12, 1.08, 1.11, 1.09]
    xs = [y * r for y, r in zip(ys, ratios, strict=True)]
    paired = paired_ratio(xs, ys)
    assert paired is not None and paired.n == 5
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 5
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 4)
    half = 2.776 * sd / math.sqrt(5)  # t at 4 degrees of freedom
    assert paired.ratio == pytest.approx(math.exp(mean))
    assert (paired.low, paired.high) == (
        pytest.approx(math.exp(mean - half)),
        pytest.approx(math.exp(mean + half)),
    )
    assert paired.text() == "\u00d71.10 (1.08\u20131.12, 5 pairs)"


def test_a_pair_with_a_missing_or_zero_side_is_left_out() -> None:
    paired = paired_ratio([2.0, None, 3.0, 0.0, 4.0], [1.0, 1.0, None, 1.0, 2.0])
    assert paired is not None and paired.n == 2 and paired.ratio == pytest.approx(2.0)
    assert paired_ratio([None], [1.0]) is None
    single = paired_ratio([3.0], [2.0])
    assert single is not None and single.n == 1 and single.low == single.high == 1.5


def test_t_quantiles_are_conservative_between_rows_and_normal_beyond() -> None:
    assert t_975(4) == 2.776 and t_975(11) == t_975(10) == 2.228  # 11: the wider row's
    assert t_975(1000) == 1.96
    with pytest.raises(ValueError, match="two pairs"):
        t_975(0)


def test_the_floor_is_how_far_the_aa_pairs_interval_reaches_from_one() -> None:
    aa = paired_ratio([1.02, 0.99, 1.01, 1.0, 0.98], [1.0] * 5)
    assert aa is not None
    assert floor_of(aa) == pytest.approx(max(aa.high - 1, 1 / aa.low - 1))
    assert 0.01 < floor_of(aa) < 0.04  # type: ignore[operator]
    assert floor_of(paired_ratio([1.5], [1.0])) is None  # one pair: no interval
    assert floor_of(None) is None


@pytest.mark.parametrize(
    ("ratios", "floor", "verdict"),
    [
        ((1.10, 1.12, 1.08, 1.11, 1.09), 0.03, "higher"),  # interval 1.08-1.12 beyond 1.03
        ((1.10, 1.12, 1.08, 1.11, 1.09), 0.09, "not confirmed"),  # it reaches within 1.09
        ((0.90, 0.91, 0.89, 0.90, 0.90), 0.05, "lower"),  # 0.89-0.91 below 1/1.05 = 0.952
        ((0.90, 0.91, 0.89, 0.90, 0.90), 0.11, "not confirmed"),  # 1/1.11 = 0.901
        ((1.30, 0.80, 1.25, 0.85, 1.20), 0.01, "not confirmed"),  # pairs disagree: wide
    ],
)
def test_a_comparison_is_confirmed_only_when_its_whole_interval_is_beyond_the_floor(
    ratios: tuple[float, ...], floor: float, verdict: str
) -> None:
    paired = paired_ratio(list(ratios), [1.0] * len(ratios))
    assert paired_verdict(paired, floor)[0] == verdict


def test_without_pairs_or_a_floor_nothing_is_confirmed_and_the_reason_says_why() -> None:
    many = paired_ratio([2.0, 2.1, 1.9], [1.0, 1.0, 1.0])
    assert paired_verdict(many, None) == ("not confirmed", "no A/A floor at this rate")
    assert paired_verdict(paired_ratio([2.0], [1.0]), 0.01)[1] == "one pair: no interval"
    assert paired_verdict(None, 0.01)[1] == "no pair of both to compare"
    reason = paired_verdict(many, 2.0)[1]
    assert reason == "its interval reaches within the \u00b1200.0 % floor"


#: what else ran on the server's core over a 2-s window, by its processes' own run time
#: (the server and its idle neighbours set apart): 0.2 s is 10 % of a core
BUSY_CORE = core_load(2.0, 0.2 + 0.01, 0.0)
QUIET_CORE = core_load(2.0, 0.2 - 0.01, 0.0)
STOLEN_CORE = core_load(2.0, 0.1, 0.011)  # 5.5 ms/s stolen from it


def test_the_server_cores_load_is_what_other_processes_ran_there_and_its_steal() -> None:
    assert BUSY_CORE is not None and BUSY_CORE.others_percent == pytest.approx(10.5)
    assert QUIET_CORE is not None and QUIET_CORE.others_percent == pytest.approx(9.5)
    assert STOLEN_CORE is not None
    assert (STOLEN_CORE.others_percent, STOLEN_CORE.steal_ms_per_s) == (
        pytest.approx(5.0),
        pytest.approx(5.5),
    )
    assert core_load(2.0, None, None) is None  # the core was not read
    assert core_load(0.0, 1.0, 0.0) is None


@pytest.mark.parametrize(
    ("affinity", "cores", "share"),
    [
        ({0}, (0,), 1.0),  # pinned to the server's core: all of it there
        ({1}, (0,), 0.0),  # pinned elsewhere (the driver): none
        ({0, 1}, (0,), 0.5),  # free on two cores: the even share
        ({0, 1, 2, 3}, (0, 1), 0.5),
        (set(), (0,), 0.0),  # affinity not read
    ],
)
def test_a_process_counts_on_the_server_core_by_its_share_of_its_allowed_cores(
    affinity: set[int], cores: tuple[int, ...], share: float
) -> None:
    assert core_share(affinity, cores) == share


def test_an_old_step_is_judged_by_its_cores_busy_time_less_the_servers_and_neighbours() -> None:
    step = Step("fast", "rate 1000/s", 10, 1000.0, 2.0, 2000, 20000, 20000, 1000.0, 1e4, {})
    step.window_s = 2.0
    step.server_core_busy_s, step.server_cpu_s, step.idle_cpu_s = 1.5 + 0.01, 1.2, 0.1
    step.server_core_steal_s = 0.0
    assert step_busy(step)  # 0.21 s of 2: 10.5 % of a core
    step.server_core_busy_s = 1.5 - 0.01
    assert not step_busy(step)
    step.server_core_others_s = 0.21  # counted process by process: this decides
    assert step_busy(step)


#: steal from the server's core over a 2-s cost step on both sides of the 50 ms/s bound
HEAVY_STEAL = core_load(2.0, 0.0, 0.1 + 0.001)
MODERATE_STEAL = core_load(2.0, 0.0, 0.1 - 0.001)


@pytest.mark.parametrize(
    ("figure", "core", "void"),
    [
        ("cpu_us_per_frame", BUSY_CORE, False),  # judged by its paired floor, whatever
        ("cpu_us_per_frame", STOLEN_CORE, False),
        ("cpu_us_per_frame", MODERATE_STEAL, False),  # 49.5 ms/s stolen < 50
        ("cpu_us_per_frame", HEAVY_STEAL, True),  # 50.5 ms/s stolen > 50: void
        ("knee", BUSY_CORE, True),  # 10.5 % of a core > 10 %
        ("knee", QUIET_CORE, False),  # 9.5 % < 10 %
        ("knee", STOLEN_CORE, True),  # 5.5 ms/s > 5 ms/s stolen from the server's core
        ("p99", BUSY_CORE, True),
        ("p99", QUIET_CORE, False),
        ("p50", None, False),  # not read: not voided by it
    ],
)
def test_each_figure_is_voided_only_by_what_bends_it(
    figure: str, core: MachineLoad | None, void: bool
) -> None:
    assert voided(figure, core) is void


def test_every_figure_the_tables_compare_has_its_bound() -> None:
    from bench.lab.report.analysis import RATIO_FIGURES

    assert set(RATIO_FIGURES) <= set(FIGURE_BOUNDS)
    assert [k for k, v in FIGURE_BOUNDS.items() if v == "floor"] == ["cpu_us_per_frame"]


def test_pairs_are_taken_forward_then_backward() -> None:
    order = pair_order(["A", "B", "C"], 3)
    assert [name for _, name in order] == ["A", "B", "C", "C", "B", "A", "A", "B", "C"]
    assert [k for k, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def _cost(values: list[float], stolen: list[bool]) -> Cost:
    n = len(values)
    return Cost(
        1000.0, list(values), [1e4] * n, [False] * n, [True] * n, paired=True, stolen=stolen
    )


def test_a_pair_with_heavy_steal_on_either_side_is_left_out_of_a_cost_comparison() -> None:
    # the third pair reads twice the others, as under 412 ms/s of steal
    mine, theirs = [10.0, 10.2, 20.0, 9.9, 10.1, 10.0], [10.0] * 6
    kept = judge_costs("X", "Y", _cost(mine, [False] * 6), _cost(theirs, [False] * 6), floor=0.05)
    assert kept.paired is not None and kept.paired.n == 6
    assert kept.verdict == "not confirmed" and "left out" not in kept.reason
    stolen = [False, False, True, False, False, False]
    left = judge_costs("X", "Y", _cost(mine, [False] * 6), _cost(theirs, stolen), floor=0.05)
    assert left.paired is not None and left.paired.n == 5
    assert left.paired.high < 1.05
    assert left.reason.endswith(
        "1 pair(s) left out: the host stole more than 50 ms/s from the server's core"
    )
