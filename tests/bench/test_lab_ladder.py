"""The capacity ladder: knees over repeats, what may be claimed, the findings the report
opens with, its chart, and a page that fits 1,280 px in a real browser."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from bench.lab.findings import findings
from bench.lab.ladder import compare, ladder, noise_floor, rungs_of
from bench.lab.report import summary_table, write_report
from bench.lab.results import Knee, Results, Run, Step, TimePoint, edge
from tests.support import CHROMIUM, chromium_dom

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SLO = {"p99": 100.0}
TIMES, DASH = "\u00d7", "\u2013"
BASE = "json+asyncio+deflate"
FAST = "+deflate off"
SAME = "+orjson+uvloop"
LIMITED = "+picows"
RELAY = "relay, websockets"


def _step(rate: float, p99: float, *, limited: bool = False, stall: bool = False) -> Step:
    delivered = rate * 10
    timeline = [
        TimePoint(t_s=float(t), sent_per_s=rate, delivered_per_s=delivered, p50_ms=1, p99_ms=p99)
        for t in range(3)
    ]
    return Step(
        driver="fast",
        name=f"rate {rate:g}/s",
        connections=2000,
        offered_per_s=rate,
        duration_s=2,
        sent=int(rate * 2),
        delivered=int(delivered * 2),
        expected=int(delivered * 2),
        sent_per_s=rate,
        delivered_per_s=delivered,
        latency_ms={
            "p50": 1,
            "p90": p99 / 2,
            "p95": p99 / 1.5,
            "p99": p99,
            "p999": p99,
            "max": p99,
        },
        generator_limited=limited,
        generator_saturated=limited,
        timeline=timeline,
        stall_s=[1.0] if stall else [],
        body_chars=60,
        frame_bytes=95,
        deflate=False,
    )


def _climb(config: str, target: str, repeat: int, knee: float, *, limited: bool = False) -> Run:
    """A run whose climb held at ``knee`` sends/s and broke 5 % above (unless limited)."""
    steps = [_step(knee / 2, 10), _step(knee, 40, limited=limited)]
    if not limited:
        steps.append(_step(knee * 1.05, 400))
    run = Run(config=config, repeat=repeat, target=target, env={}, steps=steps)
    run.knee = edge(run, SLO, 10)
    return run


def _results(knees: dict[str, tuple[float, float]], aa_pair: list[str] | None = None) -> Results:
    """Two interleaved repeats of each configuration with the given knees (sends/s)."""
    results = Results(
        matrix="demo",
        started="2026-11-24T23:00:00",
        command="python -m bench.lab run --matrix demo",
        baseline=BASE,
        aa_pair=aa_pair or [],
        repeat=2,
        configs={name: {"target": "relay" if RELAY in name else "chat"} for name in knees},
    )
    for repeat in range(2):
        for name, pair in knees.items():
            target = "relay" if RELAY in name else "chat"
            results.runs.append(_climb(name, target, repeat, pair[repeat], limited=name == LIMITED))
    return results


KNEES = {
    BASE: (2000.0, 2100.0),
    SAME: (2000.0, 2050.0),  # within the floor: not confirmed
    FAST: (8000.0, 8400.0),  # x4 in both repeats: confirmed higher
    LIMITED: (20000.0, 20000.0),  # the driver was the limit: a lower bound
    RELAY: (7000.0, 7200.0),
}


def test_rungs_carry_knees_in_delivered_per_s_and_the_shape():
    rungs = {r.config: r for r in rungs_of(_results(KNEES))}
    assert list(rungs) == list(KNEES)
    base = rungs[BASE]
    assert base.knees == [20000.0, 21000.0] and base.median == 20500.0
    assert (base.connections, base.room_size, base.body_chars, base.frame_bytes) == (
        2000,
        10,
        60,
        95,
    )
    assert rungs[LIMITED].lower_bound and rungs[LIMITED].driver_limited
    assert rungs[LIMITED].label() == "≥ 200,000"
    assert not rungs[FAST].lower_bound


def test_a_difference_is_claimed_only_in_every_repeat_and_beyond_the_floor():
    found = ladder(_results(KNEES))
    assert found is not None and found.baseline is not None
    assert found.floor == pytest.approx(0.05)  # the largest spread is 5 %: the resolution
    versus = found.against_baseline
    assert versus[FAST].verdict == "higher" and versus[FAST].median == pytest.approx(4.0)
    assert versus[SAME].verdict == "not confirmed"
    assert "within the ±5.0 % floor in repeat 1, 2" in versus[SAME].reason
    # a knee the driver limited is a lower bound, and never ranked
    assert versus[LIMITED].verdict == "not confirmed" and versus[LIMITED].lower_bound
    assert "of the driver's ceiling" in versus[LIMITED].reason
    assert versus[LIMITED].ratio_text().startswith(f"≥ {TIMES}")
    # one repeat higher, one lower: the repeats disagree (the floor from an A/A pair: this
    # rung's own spread would otherwise widen it)
    twin = "json+asyncio+deflate (A/A)"
    flip = ladder(_results({**KNEES, SAME: (2600.0, 1500.0), twin: KNEES[BASE]}, [BASE, twin]))
    assert flip is not None
    assert flip.against_baseline[SAME].verdict == "not confirmed"
    assert flip.against_baseline[SAME].reason == "the repeats disagree on the direction"


def test_a_lower_bound_can_never_be_claimed_lower():
    rungs = {r.config: r for r in rungs_of(_results({**KNEES, LIMITED: (1000.0, 1000.0)}))}
    verdict = compare(rungs[LIMITED], rungs[BASE], 0.05)
    assert verdict.verdict == "not confirmed"
    assert "lower bound" in verdict.reason or "of the driver's ceiling" in verdict.reason
    # a lower bound because nothing broke up to the climb's top (not the driver's limit)
    top = {r.config: r for r in rungs_of(_results(KNEES))}[BASE]
    top.lower_bound = True
    verdict = compare(top, rungs[FAST], 0.05)
    assert verdict.verdict == "not confirmed" and "lower bound" in verdict.reason


def test_the_noise_floor_is_the_aa_pair_when_there_is_one():
    twin = "json+asyncio+deflate (A/A)"
    results = _results({**KNEES, twin: (2300.0, 2100.0)}, aa_pair=[BASE, twin])
    floor, source = noise_floor(rungs_of(results), results)
    assert floor == pytest.approx(0.15) and "A/A pair" in source


def test_the_noise_floor_is_never_below_the_resolution_the_run_climbed_to():
    results = _results(KNEES)  # every rung moved 5 % or less between its repeats
    for name in results.configs:
        results.configs[name]["load"] = {"climb": "p99=100", "resolution": 0.3}
    floor, source = noise_floor(rungs_of(results), results)
    assert floor == pytest.approx(0.3) and "resolution" in source
    found = ladder(results)
    assert found is not None and found.resolution == pytest.approx(0.3)


def test_findings_say_what_held_what_differed_and_what_is_not_confirmed():
    found = ladder(_results(KNEES))
    assert found is not None
    text = " ".join(findings(found))
    assert text.startswith("At 2,000 connections in rooms of 10 (60-character bodies, 95-byte")
    assert "the baseline json+asyncio+deflate held 20,500 delivered/s" in text
    assert "Knees confirmed against the baseline" in text
    assert f"{FAST} {TIMES}4.00 (4.00{DASH}4.00)" in text
    assert f"Knees not confirmed: {SAME}" in text
    assert f"limit for {LIMITED}" in text
    assert f"Knees against the relay {RELAY} (71,000 delivered/s)" in text
    assert "No climb step showed a stall." in text


def test_the_terminal_summary_of_climbs_alone_is_the_ladder():
    # a capacity run's steps all belong to climbs: no fixed-rate table, and no claim that
    # nothing was measured (it printed "no run produced a step" above its knees)
    text = summary_table(_results(KNEES))
    assert text.startswith("ladder (medians)")
    assert "no run produced a step" not in text
    assert re.search(rf"^{re.escape(BASE)}\s+20,500\s", text, re.M)


def test_nothing_climbed_means_no_ladder():
    results = _results(KNEES)
    for run in results.runs:
        run.knee = None
    assert ladder(results) is None


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    out = tmp_path_factory.mktemp("ladder-report")
    results = _results(KNEES)
    results.runs[0].steps[1].stall_s = [1.0]
    results.runs[0].knee = edge(results.runs[0], SLO, 10)
    md_path, html_path = write_report(results, out)
    return out, md_path.read_text(), html_path.read_text()


def test_the_report_opens_with_findings_then_the_ladder_chart(rendered: tuple[Path, str, str]):
    out, md, _ = rendered
    sections = re.findall(r"^## (.+)$", md, re.M)
    assert sections[0] == "Findings"
    findings_part = md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    assert "Knees not confirmed: +orjson+uvloop" in findings_part
    assert "1 climb step(s) showed a stall" in findings_part
    chart = re.search(r"!\[Capacity ladder\]\((plots/ladder\.png)\)", findings_part)
    assert chart is not None
    assert (out / chart.group(1)).read_bytes().startswith(PNG_SIGNATURE)
    assert "## Capacity ladder" in md and "### Climb: +picows" in md
    ladder_part = md.split("## Capacity ladder", 1)[1]
    row = next(line for line in ladder_part.splitlines() if line.startswith(f"| {FAST} |"))
    assert f"{TIMES}4.00" in row and "(higher, confirmed)" in row


@pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason=f"no {CHROMIUM}: CI and the setup script install it"
)
def test_the_page_fits_1280_px_and_every_image_loads(
    rendered: tuple[Path, str, str], tmp_path: Path
):
    out, _, page = rendered
    dom = chromium_dom(out / "report.html", tmp_path / "chromium")
    images = page.count("<img ")
    assert images > 0
    assert f'data-images-loaded="{images}/{images}"' in dom
    width = re.search(r'data-scroll-width="(\d+)"', dom)
    viewport = re.search(r'data-viewport-width="(\d+)"', dom)
    assert width is not None and viewport is not None
    assert int(viewport.group(1)) <= 1280
    assert int(width.group(1)) <= int(viewport.group(1))


def test_a_break_is_the_drivers_only_when_it_was_saturated_or_its_lag_explains_it():
    def knee(broken: Step) -> Knee:
        run = Run(config=BASE, repeat=0, target="chat", env={}, steps=[_step(1000, 20), broken])
        return edge(run, SLO)

    # sends behind schedule near the knee (the target's bursts), p99 far past the bound
    late = _step(1100, 400)
    late.generator_limited, late.max_send_lag_ms = True, 9.0
    assert knee(late).lower_bound is False and knee(late).driver_limited is False
    # just past the bound, a little lag, but nothing flagged the driver: the target's break
    edge_case = _step(1100, 104)
    edge_case.max_send_lag_ms = 5.8
    assert knee(edge_case).lower_bound is False
    # the same break, but the driver's own lag alone could have made it
    lagging = _step(1100, 120)
    lagging.generator_limited, lagging.max_send_lag_ms = True, 60.0
    assert knee(lagging).lower_bound is True and knee(lagging).driver_limited is True
    # the driver's core was full
    saturated = _step(1100, 400, limited=True)
    assert knee(saturated).lower_bound is True
    assert knee(saturated).capacity_delivered_per_s == 10000


def test_a_saved_climb_is_judged_again_by_the_current_rules():
    results = _results(KNEES)
    for name in results.configs:
        results.configs[name]["load"] = {"climb": "p99=100"}
    stale = results.runs[0]
    assert stale.knee is not None
    stale.knee = replace(stale.knee, lower_bound=True, driver_limited=True)  # an older verdict
    found = ladder(results)
    assert found is not None and found.baseline is not None
    assert not found.baseline.lower_bound and not found.baseline.driver_limited


def test_a_sweep_over_connection_counts_shows_how_the_verdict_moves(tmp_path: Path):
    results = _results({f"{BASE} @2000": KNEES[BASE], f"{RELAY} @2000": KNEES[RELAY]})
    for name, knees in ((f"{BASE} @200", (900.0, 950.0)), (f"{RELAY} @200", (2500.0, 2600.0))):
        results.configs[name] = {"target": "relay" if RELAY in name else "chat"}
        for repeat in range(2):
            run = _climb(name, results.configs[name]["target"], repeat, knees[repeat])
            for step in run.steps:
                step.connections = 200
            run.knee = edge(run, SLO, 10)
            results.runs.append(run)
    md_path, _ = write_report(results, tmp_path)
    md = md_path.read_text()
    sweep = md.split("### The shape is part of the result: by connection count", 1)[1]
    rows = [line for line in sweep.splitlines() if line.startswith("| 2")]
    assert rows[0].startswith(f"| 200 | {BASE} @200 | 9,250 |")
    assert f"{TIMES}0.36 (0.36{DASH}0.37) of {RELAY} @200" in rows[0]
    assert rows[1].startswith(f"| 2,000 | {BASE} @2000 | 20,500 |")
    assert f"{TIMES}0.29 (0.29{DASH}0.29) of {RELAY} @2000" in rows[1]
