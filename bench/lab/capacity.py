"""Capacity: step the offered load up until the SLO breaks, for a configuration and the relay.

The fast driver offers a fixed rate for ``step_s`` seconds, one rate at a time, rising by
``factor``; the first rate whose fan-out percentiles break the SLO (or loses a message)
ends the climb, and one more step halfway (geometrically) between the last rate that held
and the first that broke narrows the edge. Capacity is the highest *delivered* rate that
held. The bare relay is climbed the same way in the same run, so the chat server's
capacity is stated as a fraction of what the transport alone does. A step where the
driver itself was the bottleneck is marked: then the edge is the driver's, not the server's.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from bench.lab.matrix import Config, Load
from bench.lab.results import Run, Step, parse_slo
from bench.lab.runner import Lab
from bench.lab.sampler import Sampler

__all__ = ["climb", "edge", "parse_slo", "plan"]


def climb(
    lab: Lab,
    config: Config,
    load: Load,
    *,
    slo_ms: dict[str, float],
    start_rate: float,
    factor: float,
    max_rate: float,
    repeat: int = 0,
) -> Run:
    """Climb one configuration: one server, one driver run per rate; the Run with every step."""
    workdir, run, sampler = lab.begin_run(config, repeat, "capacity")
    server = None
    try:
        server, _ = lab.start_target(config, workdir)
        assert server.proc is not None
        sampler.watch("server", server.proc.pid)
        if lab.redis is not None and lab.redis.proc is not None:
            sampler.watch("redis", lab.redis.proc.pid)
        time.sleep(load.settle_s)
        url = server.url  # type: ignore[attr-defined]
        rate = start_rate
        held: float | None = None
        broke: float | None = None
        while rate <= max_rate:
            step = _one_step(lab, config, load, rate, url=url, workdir=workdir, sampler=sampler)
            run.steps.append(step)
            lab._phase(config, repeat, f"{rate:,.0f} sent/s: p99 {step.latency_ms['p99']:.1f} ms")
            if step.holds(slo_ms):
                held = rate
                rate *= factor
            else:
                broke = rate
                break
        if held is not None and broke is not None:
            middle = math.sqrt(held * broke)
            run.steps.append(
                _one_step(lab, config, load, middle, url=url, workdir=workdir, sampler=sampler)
            )
    except KeyboardInterrupt:
        run.status = "interrupted"
        lab.interrupted = True
    except Exception as exc:
        run.status = "failed"
        run.error = str(exc)[-4000:]
    finally:
        if server is not None:
            lab.stop_target(server, run)
        run.samples = sampler.stop()
    return run


def _one_step(
    lab: Lab, config: Config, load: Load, rate: float, *, url: str, workdir: Any, sampler: Sampler
) -> Step:
    one = replace(load, rates=(round(rate),), warmup_s=min(load.warmup_s, 1.0))
    steps = lab.fast_step(config, one, url, workdir, sampler)
    return steps[-1]


def edge(run: Run, slo_ms: dict[str, float]) -> dict[str, Any]:
    """What a climb found: the highest delivered rate that held, and the step that broke."""
    held = [s for s in run.steps if s.holds(slo_ms)]
    broken = [s for s in run.steps if not s.holds(slo_ms)]
    best = max(held, key=lambda s: s.delivered_per_s, default=None)
    first_break = min(broken, key=lambda s: s.offered_per_s or 0, default=None)
    return {
        "config": run.config,
        "capacity_delivered_per_s": round(best.delivered_per_s) if best else 0,
        "capacity_sent_per_s": round(best.sent_per_s) if best else 0,
        "p99_ms_at_capacity": best.latency_ms["p99"] if best else None,
        "first_break_offered_per_s": first_break.offered_per_s if first_break else None,
        "first_break_p99_ms": first_break.latency_ms["p99"] if first_break else None,
        "generator_limited_at_edge": bool(
            (first_break and first_break.generator_limited) or (best and best.generator_limited)
        ),
        "steps": [
            {
                "offered_per_s": s.offered_per_s,
                "delivered_per_s": round(s.delivered_per_s),
                "p99_ms": s.latency_ms["p99"],
                "holds": s.holds(slo_ms),
                "generator_limited": s.generator_limited,
            }
            for s in sorted(run.steps, key=lambda s: s.offered_per_s or 0)
        ],
        "status": run.status,
        "error": run.error,
    }


def plan(capacity_per_instance: float, target_delivered_per_s: float) -> dict[str, Any]:
    """Instances for a target load: target / per-instance capacity, rounded up, plus one."""
    if capacity_per_instance <= 0:
        return {"target_delivered_per_s": target_delivered_per_s, "instances": None}
    needed = math.ceil(target_delivered_per_s / capacity_per_instance)
    return {
        "target_delivered_per_s": target_delivered_per_s,
        "per_instance_delivered_per_s": round(capacity_per_instance),
        "instances_for_load": needed,
        "instances": needed + 1,
        "rule": "ceil(target / per-instance capacity) + 1 for redundancy",
    }
