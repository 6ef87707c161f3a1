"""The driver's ceiling in the run (a knee near it is driver-limited and never ranked),
knees that are sustained or a burst's, and each transport's floor relay: hand-made steps
against the one definition of a knee."""

from __future__ import annotations

import pytest

from bench.lab.findings import findings, floor_fraction
from bench.lab.ladder import (
    CEILING_SHARE,
    DRIVER_CORE_PERCENT,
    compare,
    driver_ceiling,
    ladder,
)
from bench.lab.results import Results, Run, Step, edge

SLO = {"p99": 100.0}


def _step(
    rate: float,
    p99: float,
    *,
    busy: float | None = None,
    saturated: bool = False,
    sustain: bool = False,
    step_s: float = 2.0,
) -> Step:
    delivered = rate * 10
    return Step(
        driver="fast",
        name=f"{'sustain' if sustain else 'rate'} {rate:g}/s",
        connections=2000,
        offered_per_s=rate,
        duration_s=20.0 if sustain else step_s,
        sent=int(rate * step_s),
        delivered=int(delivered * step_s),
        expected=int(delivered * step_s),
        sent_per_s=rate,
        delivered_per_s=delivered,
        latency_ms={"p50": 1, "p90": 2, "p95": 3, "p99": p99, "p999": p99, "max": p99},
        generator_cpu_percent=(busy or 50.0) * 0.7,
        generator_core_busy_percent=busy,
        generator_limited=saturated,
        generator_saturated=saturated,
        sustain=sustain,
    )


def _run(config: str, repeat: int, steps: list[Step], env: dict[str, str]) -> Run:
    target = "relay" if config.startswith("relay") else "chat"
    run = Run(config=config, repeat=repeat, target=target, env=env, steps=steps)
    run.knee = edge(run, SLO, 10)
    return run


def _results(runs: list[Run]) -> Results:
    names = list(dict.fromkeys(r.config for r in runs))
    return Results(
        matrix="m",
        started="2026-11-26T20:00:00",
        command="c",
        baseline=names[0],
        aa_pair=[],
        repeat=2,
        configs={n: {"load": {"climb": "p99=100"}} for n in names},
        runs=runs,
    )


def test_the_ceiling_scales_the_drivers_busiest_unsaturated_step_to_its_core() -> None:
    # 10,000 sends/s (100k delivered/s) kept its core 60 % busy: 90 % of it is 150k
    run = _run("a", 0, [_step(5000, 5, busy=40), _step(10000, 20, busy=60)], {})
    assert driver_ceiling(run) == pytest.approx(100_000 * DRIVER_CORE_PERCENT / 60)
    # where it did saturate, the lowest such rate bounds the estimate
    steps = [_step(5000, 5, busy=25), _step(12000, 20, saturated=True)]
    assert driver_ceiling(_run("a", 0, steps, {})) == 120_000
    assert driver_ceiling(_run("a", 0, [], {})) is None


def test_a_knee_near_the_ceiling_is_driver_limited_and_never_ranked() -> None:
    env = {"TRANSPORT": "websockets"}
    # knee 100k; the busiest unsaturated step (110k, broken) filled 62 % of its core
    fast = [_step(10000, 20, busy=60), _step(11000, 300, busy=62)]
    slow = [_step(4000, 20, busy=20), _step(4400, 300, busy=22)]  # knee 40k, ceiling 180k
    results = _results(
        [_run(n, r, s, env) for r in range(2) for n, s in (("b", slow), ("f", fast))]
    )
    found = ladder(results)
    assert found is not None
    rungs = {r.config: r for r in found.rungs}
    assert rungs["f"].driver_ceiling == pytest.approx(110_000 * DRIVER_CORE_PERCENT / 62)
    assert not rungs["f"].near_ceiling  # 100k is 63 % of it
    assert found.against_baseline["f"].verdict == "higher"
    # the same knee against a ceiling of 120k (83 %): measured by the driver too
    near = [_step(10000, 20, busy=60), _step(12000, 300, saturated=True)]
    results = _results(
        [_run(n, r, s, env) for r in range(2) for n, s in (("b", slow), ("f", near))]
    )
    found = ladder(results)
    assert found is not None
    rung = next(r for r in found.rungs if r.config == "f")
    assert rung.near_ceiling and rung.driver_limited
    assert rung.median > CEILING_SHARE * (rung.driver_ceiling or 0)
    verdict = found.against_baseline["f"]
    assert verdict.verdict == "not confirmed" and "of the driver's ceiling" in verdict.reason
    base = next(r for r in found.rungs if r.config == "b")
    assert compare(base, rung, found.floor).verdict == "not confirmed"  # either way round
    assert any("The fast driver itself was the limit for f" in s for s in findings(found))


def test_a_knee_is_a_bursts_unless_a_sustained_step_held_it() -> None:
    climb = [_step(1000, 10), _step(2000, 20), _step(2100, 300)]
    held = _run("a", 0, [*climb, _step(1800, 40, sustain=True)], {})
    lost = _run("a", 1, [*climb, _step(1800, 400, sustain=True)], {})
    # a sustained step is never part of the climb: the knee is the climb's
    assert held.knee is not None and lost.knee is not None
    assert held.knee.capacity_delivered_per_s == lost.knee.capacity_delivered_per_s == 20_000
    found = ladder(_results([held, lost]))
    assert found is not None
    (rung,) = found.rungs
    assert rung.sustained == [True, False]
    assert rung.knee_kind() == "burst (2-s steps; not held when sustained)"
    steady = ladder(_results([held]))
    assert steady is not None and steady.rungs[0].knee_kind() == "sustained"
    burst = ladder(_results([_run("a", 0, climb, {})]))
    assert burst is not None and burst.rungs[0].knee_kind() == "burst (2-s steps)"


def test_each_transports_floor_is_its_relay_with_the_highest_knee() -> None:
    picows = {"TRANSPORT": "picows"}
    runs = [
        _run("chat", 0, [_step(10000, 20), _step(11000, 300)], picows),
        _run("relay, per-frame send", 0, [_step(12000, 20), _step(13000, 300)], picows),
        _run("relay, coalesced", 0, [_step(20000, 20), _step(21000, 300)], picows),
    ]
    found = ladder(_results(runs))
    assert found is not None
    assert found.floors["picows"].config == "relay, coalesced"
    chat = next(r for r in found.rungs if r.config == "chat")
    assert floor_fraction(chat, found.floors["picows"]) == "knee 0.50"
    text = " ".join(findings(found))
    assert "Against the picows floor, relay, coalesced (200,000 delivered/s" in text
