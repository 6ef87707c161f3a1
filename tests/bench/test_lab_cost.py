"""CPU per delivered frame: the paired cost steps each rung carries, their floor from the
A/A pair's pairs, the comparisons and their verdicts (a busy machine voids knees, not CPU
per frame), what profiling costs, and a report that quotes one floor per figure
everywhere."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.lab.findings import findings
from bench.lab.ladder import floor_text, ladder, pairwise_floor
from bench.lab.pairs import floor_of, paired_ratio
from bench.lab.report import summary_table, write_report
from bench.lab.results import Results, Run, Step, TimePoint, edge

SLO = {"p99": 100.0}
BASE, SAME, OFF, TWIN, PICOWS = (
    "json+asyncio+deflate",
    "+orjson+uvloop",
    "+deflate off",
    "+deflate off (A/A)",
    "+picows",
)
RELAY_WS, RELAY_PICOWS, PROFILED = "relay, websockets", "relay, picows", "baseline, profiled"
LOW, HIGH = 1000.0, 5000.0
ENV = {
    BASE: {"SERIALIZER": "json", "EVENT_LOOP": "asyncio", "WS_DEFLATE": "on"},
    SAME: {"SERIALIZER": "orjson", "EVENT_LOOP": "uvloop", "WS_DEFLATE": "on"},
    OFF: {"SERIALIZER": "orjson", "EVENT_LOOP": "uvloop", "WS_DEFLATE": "off"},
    PICOWS: {"SERIALIZER": "orjson", "WS_DEFLATE": "off", "TRANSPORT": "picows"},
    RELAY_WS: {"TRANSPORT": "websockets"},
    RELAY_PICOWS: {"TRANSPORT": "picows"},
}
ENV[TWIN] = ENV[OFF]
ENV[PROFILED] = ENV[BASE]
#: µs per frame at LOW (and HIGH where the rung runs it), one per paired round
JITTER = (1.0, 1.01, 0.995, 1.005, 0.99, 1.0)
#: the A/A twin's own jitter: within about 1 % of its original, round by round
TWIN_JITTER = (1.005, 1.0, 1.0, 1.01, 0.995, 0.998)


def _rounds(value: float, jitter: tuple[float, ...] = JITTER) -> tuple[float, ...]:
    return tuple(value * j for j in jitter)


COSTS = {
    BASE: {LOW: _rounds(40.0)},
    SAME: {LOW: _rounds(30.0)},
    OFF: {LOW: _rounds(20.0), HIGH: _rounds(12.0)},
    TWIN: {LOW: _rounds(20.0, TWIN_JITTER), HIGH: _rounds(12.0, TWIN_JITTER)},
    PICOWS: {LOW: _rounds(15.0), HIGH: _rounds(9.0)},
    RELAY_WS: {LOW: _rounds(14.0), HIGH: _rounds(10.0)},
    RELAY_PICOWS: {LOW: _rounds(8.0), HIGH: _rounds(6.0)},
    PROFILED: {LOW: _rounds(70.0)},
}
KNEES = {BASE: 3000, SAME: 4000, OFF: 10000, TWIN: 10200, PICOWS: 12000}
KNEES |= {RELAY_WS: 9000, RELAY_PICOWS: 14000}


def _step(
    rate: float,
    p99: float,
    *,
    cost_us: float | None = None,
    is_cost: bool = False,
    others_s: float = 0.0,
    pair_round: int | None = None,
) -> Step:
    delivered = rate * 10
    duration = 3.0
    return Step(
        driver="fast",
        name=f"cost {rate:g}/s" if is_cost else f"rate {rate:g}/s",
        connections=2000,
        offered_per_s=rate,
        duration_s=duration,
        sent=int(rate * duration),
        delivered=int(delivered * duration),
        expected=int(delivered * duration),
        sent_per_s=rate,
        delivered_per_s=delivered,
        latency_ms={"p50": 1, "p90": 2, "p95": 3, "p99": p99, "p999": p99, "max": p99},
        timeline=[TimePoint(t_s=float(t), delivered_per_s=delivered, p99_ms=p99) for t in range(3)],
        body_chars=60,
        frame_bytes=95,
        cost=is_cost,
        window_s=duration,
        server_cpu_s=None if cost_us is None else cost_us * delivered * duration / 1e6,
        others_cpu_s=others_s,
        steal_s=0.0,
        # what else ran on the server's core (on one core, as the lab)
        server_core_others_s=None if cost_us is None else others_s,
        server_core_steal_s=0.0,
        pair_round=pair_round,
    )


def _run(config: str, repeat: int, *, busy: bool = False) -> Run:
    target = "relay" if config.startswith("relay") else "chat"
    others = 3.0 if busy else 0.05
    if config == PROFILED:
        steps = [_step(LOW, 8, cost_us=(70.0, 74.0)[repeat], others_s=others)]
        return Run(config=config, repeat=repeat, target=target, env=ENV[config], steps=steps)
    knee = KNEES[config]
    steps = [
        _step(rate, p99, cost_us=5, others_s=others)
        for rate, p99 in ((knee / 2, 10), (knee, 40), (knee * 1.05, 400))
    ]
    run = Run(config=config, repeat=repeat, target=target, env=ENV[config], steps=steps)
    run.knee = edge(run, SLO, 10)
    return run


def _paired(config: str, *, busy: bool = False) -> Run:
    """``config``'s run of the paired phase: its cost steps, one per rate and round."""
    steps = [
        _step(rate, 5, cost_us=value, is_cost=True, others_s=3.0 if busy else 0.05, pair_round=k)
        for rate, values in COSTS[config].items()
        for k, value in enumerate(values)
    ]
    target = "relay" if config.startswith("relay") else "chat"
    return Run(config=config, repeat=0, target=target, env=ENV[config], steps=steps)


def _results(*, busy: str = "") -> Results:
    names = [BASE, SAME, OFF, TWIN, PICOWS, RELAY_WS, RELAY_PICOWS, PROFILED]
    results = Results(
        matrix="demo",
        started="2026-11-26T20:00:00",
        command="python -m bench.lab run --matrix demo",
        baseline=BASE,
        aa_pair=[OFF, TWIN],
        repeat=2,
        configs={
            n: {
                "env": ENV[n],
                "target": "relay" if n.startswith("relay") else "chat",
                "same_as": OFF if n == TWIN else "",
                "profile": n == PROFILED,
                "load": {"climb": "" if n == PROFILED else "p99=100"},
            }
            for n in names
        },
    )
    results.runs = [_run(n, r, busy=n == busy) for r in range(2) for n in names]
    results.paired = [_paired(n, busy=n == busy) for n in names]
    return results


def test_each_rung_carries_its_cost_per_rate_and_paired_round() -> None:
    found = ladder(_results())
    assert found is not None and found.cost_rates == [LOW, HIGH]
    rung = next(r for r in found.rungs if r.config == OFF)
    assert rung.costs[LOW].values == [pytest.approx(v) for v in COSTS[OFF][LOW]]
    assert rung.costs[LOW].paired and found.paired_rounds == len(JITTER)
    assert rung.costs[HIGH].label() == "12.0 (11.9\u201312.1)"
    base = next(r for r in found.rungs if r.config == BASE)
    assert list(base.costs) == [LOW]  # a deflate rung runs the lower rate only
    # a cost step is never part of the climb: the knee is the climb's
    assert rung.knees == [100000.0, 100000.0]


def test_the_cost_floor_is_the_aa_pairs_paired_statistic_at_that_rate() -> None:
    found = ladder(_results())
    assert found is not None
    floor, source = found.cost_floor[LOW]
    aa = paired_ratio(COSTS[TWIN][LOW], COSTS[OFF][LOW])
    assert floor == pytest.approx(floor_of(aa)) and 0.001 < floor < 0.01
    assert source == f"the A/A pair ({OFF} = {TWIN}), 6 paired steps"
    assert pairwise_floor([1.0, None, 2.0], [1.1, 5.0, 2.0]) == pytest.approx(0.1)
    assert pairwise_floor([None], [1.0]) is None


def test_costs_are_compared_with_the_rung_before_the_baseline_and_the_transports_relay() -> None:
    found = ladder(_results())
    assert found is not None
    before = found.cost_vs_previous
    assert before[SAME][LOW].reference == BASE and before[SAME][LOW].verdict == "lower"
    assert before[OFF][LOW].reference == SAME and before[OFF][LOW].verdict == "lower"
    assert before[TWIN][LOW].reference == OFF  # an A/A twin against its original ...
    assert before[TWIN][LOW].verdict == "not confirmed"  # ... is within the floor
    assert before[PICOWS][LOW].reference == OFF  # the twin is not a step of the ladder
    assert found.cost_vs_relay[PICOWS][HIGH].reference == RELAY_PICOWS
    assert found.cost_vs_relay[OFF][HIGH].reference == RELAY_WS
    assert found.cost_vs_relay[OFF][HIGH].verdict == "higher"  # 12 µs against 10: costs more
    assert found.cost_vs_baseline[PICOWS][LOW].verdict == "lower"


def test_a_busy_machine_voids_knees_but_not_cpu_per_frame() -> None:
    found = ladder(_results(busy=SAME))
    assert found is not None
    assert found.machine.busy
    # CPU per frame: judged against its paired floor whatever the machine did
    assert found.cost_vs_previous[SAME][LOW].verdict == "lower"
    assert found.cost_vs_previous[OFF][LOW].verdict == "lower"  # against SAME
    # the knee rests on busy steps: voided
    assert found.against_baseline[SAME].reason == "the server's core was busy"
    assert found.against_baseline[OFF].verdict == "higher"
    text = findings(found)
    assert text[0].startswith("CPU per frame: from 6 paired rounds") and "Nothing voided" in text[0]
    assert text[1].startswith("Knees: ") and text[1].endswith(f"voided: {SAME}.")
    quiet = findings(ladder(_results()))  # type: ignore[arg-type]
    assert quiet[1].endswith("No knee rests on a busy step.")
    assert quiet[-1].startswith("The machine was quiet")


def test_what_profiling_costs_is_a_ratio_at_the_same_rate() -> None:
    found = ladder(_results())
    assert found is not None
    (profiling,) = found.profiling
    assert profiling.config == PROFILED and profiling.reference == BASE
    assert profiling.rate == LOW
    assert profiling.ratios == [pytest.approx(70 / 40)] * 6  # paired, round by round
    assert profiling.verdict == "higher"
    sentence = next(s for s in findings(found) if s.startswith("Profiling"))
    assert "costs \u00d71.75 (1.75\u20131.75, 6 pairs) the server's CPU per frame at 10k" in (
        sentence
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    out = tmp_path_factory.mktemp("cost-report")
    results = _results()
    md, _ = write_report(results, out)
    return out, md.read_text(), summary_table(results)


def test_one_floor_per_figure_is_quoted_the_same_in_every_section(
    report: tuple[Path, str, str],
) -> None:
    _, md, summary = report
    found = ladder(_results())
    assert found is not None
    low = floor_text(found.cost_floor[LOW][0])  # the A/A pair's floor at 10k delivered/s
    noise = md.split("## Noise floor", 1)[1].split("\n## ", 1)[0]
    assert f"| server CPU µs per delivered frame at 10k delivered/s | {low} |" in noise
    findings_part = md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    assert f"floor {low}, the A/A pair ({OFF} = {TWIN})" in findings_part
    assert f"floor ({low} at 10k delivered/s" in md  # the cost table's paragraph
    assert f"@10k delivered/s {low}" in summary  # the terminal's ladder
    # every floor quoted anywhere is one of the floors the noise section lists
    listed = set(re.findall(r"\u00b1\d+\.\d %", noise))
    assert set(re.findall(r"\u00b1\d+\.\d %", md)) <= listed


def test_the_terminal_summary_ends_with_the_ladder(report: tuple[Path, str, str]) -> None:
    _, _, summary = report
    ladder_part = summary[summary.index("ladder (medians)") :]
    assert summary.rstrip().endswith(ladder_part.rstrip())
    rows = {line.split("  ")[0]: line for line in ladder_part.splitlines()[1:]}
    assert "100,000" in rows[OFF] and "20.0 (19.8-20.2)".replace("-", "\u2013") in rows[OFF]
    assert "\u00d70.67 less" in rows[OFF]  # 20 / 30: costs less than the rung before


def test_the_ladder_table_and_chart_carry_the_cost(report: tuple[Path, str, str]) -> None:
    out, md, _ = report
    ladder_part = md.split("## Capacity ladder", 1)[1]
    header = next(line for line in ladder_part.splitlines() if line.startswith("| configuration"))
    assert "µs/frame at 10k delivered/s" in header and "µs/frame at 50k delivered/s" in header
    assert "### What a frame costs" in ladder_part
    assert (out / "plots" / "ladder.png").stat().st_size > 10_000


def test_the_report_refers_to_nothing_outside_itself_and_defines_the_seed_report(
    report: tuple[Path, str, str],
) -> None:
    _, md, _ = report
    for phrase in ("closing" + " note", "issue" + " #", "the" + " issue"):  # not in this file
        assert phrase not in md.lower()
    first = md.index("seed report")
    assert "the report this project started from" in md[first : first + 300]


def test_an_older_results_json_without_costs_still_renders(tmp_path: Path) -> None:
    data = asdict(_results())
    data.pop("paired")
    new_step_keys = {"cost", "window_s", "server_cpu_s", "others_cpu_s", "steal_s", "acks"}
    for run in data["runs"]:
        run.pop("host")
        run["steps"] = [
            {k: v for k, v in s.items() if k not in new_step_keys}
            for s in run["steps"]
            if not s["cost"]
        ]
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(data))
    md, _ = write_report(Results.load(saved), tmp_path)
    text = md.read_text()
    assert "## Capacity ladder" in text and "µs/frame at" not in text
    assert "not recorded" in text  # the machine's load: said, not guessed


def test_the_run_writes_its_current_figures_table_stamped(report: tuple[Path, str, str]) -> None:
    out, _, _ = report
    figures = (out / "figures.md").read_text()
    row = next(line for line in figures.splitlines() if line.startswith(f"| {OFF} |"))
    knee, cost = "100,000 (100,000\u2013100,000)", "20.0 (19.8\u201320.2) | 12.0 (11.9\u201312.1)"
    assert row == f"| {OFF} | {knee} | {cost} |"
    for stamp in ("**Commit:**", "**Machine:**", "**Around it:**", "**Date:** 2026-11-26"):
        assert stamp in figures
    assert "**Regenerate** (one command): `python -m bench.lab run --matrix demo`" in figures
