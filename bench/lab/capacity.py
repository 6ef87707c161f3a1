"""The climb: the one definition of a capacity climb, whoever runs it.

The fast driver (``python -m bench.lab.driver --climb``) offers a fixed rate for
``step_s`` seconds, multiplies it by ``factor`` while the fan-out percentiles hold the
SLO with nothing lost, then bisects (geometrically) between the last rate held and the
first broken until they are within ``resolution`` (:func:`bench.lab.driver.climb.
next_climb_rate`). A step whose per-second timeline shows a stall is marked and run once
more, and the re-run decides. :func:`bench.lab.results.edge` judges the steps: the knee
is the highest *delivered* rate that held; a step where the driver itself was the
bottleneck ends the climb and makes the knee a lower bound.

Here: a :class:`~bench.lab.matrix.Load` made a climb (:func:`climbing`), the driver's
arguments for any load (:func:`fast_driver`: the lab's runner and ``bench.tail`` both
start the driver with them), and what ``capacity`` prints of the knees over repeats
(:func:`knees`, the ladder's rungs) with its plan (:func:`capacity_plan`).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.lab.driver.config import DriverArgs
from bench.lab.ladder import rungs_of
from bench.lab.matrix import Load, offers_deflate
from bench.lab.plan import SPARE, processes_at_knee
from bench.lab.results import Results, edge, parse_slo

__all__ = ["capacity_plan", "climbing", "edge", "fast_driver", "knees", "parse_slo", "slo_text"]


def slo_text(slo_ms: dict[str, float]) -> str:
    """``{"p99": 100.0}`` → ``"p99=100"`` (what the driver's ``--climb`` takes)."""
    return ",".join(f"{k}={v:g}" for k, v in slo_ms.items())


def climbing(
    load: Load,
    *,
    slo_ms: dict[str, float],
    start_rate: float,
    factor: float,
    max_rate: float,
    resolution: float = Load.resolution,
) -> Load:
    """``load`` made a climb to ``slo_ms`` from ``start_rate`` (a warm-up of at most 1 s:
    the climb's first step warms up too)."""
    return replace(
        load,
        rates=(round(start_rate),),
        warmup_s=min(load.warmup_s, 1.0),
        climb=slo_text(slo_ms),
        factor=factor,
        resolution=resolution,
        max_rate=max_rate,
    )


def fast_driver(
    load: Load,
    *,
    target: str,
    url: str,
    env: dict[str, str],
    cpu_affinity: str,
    token_file: Path | None,
    json_out: Path,
    t0_monotonic: float | None = None,
    server_pid: int | None = None,
    server_cores: str = "off",
    ca_file: str = "",
    proxy_pid: int | None = None,
    continuous: bool = False,
) -> DriverArgs:
    """The fast driver's arguments for ``load`` against ``url`` (a climb where ``load``
    climbs), for a target with the toggles ``env``."""
    climb = bool(load.climb)
    return DriverArgs(
        target=target,
        url=url,
        connections=load.connections,
        room_size=load.room_size,
        rates=load.rates,
        step_s=load.step_s,
        warmup_s=load.warmup_s,
        drain_s=load.drain_s,
        cpu_affinity=cpu_affinity,
        serializer=env.get("SERIALIZER", "orjson"),
        token_file=token_file,
        json_out=json_out,
        t0_monotonic=t0_monotonic,
        # as browsers do: deflate is measured with deflate
        deflate=offers_deflate(env),
        climb=load.climb,
        factor=load.factor if climb else None,
        resolution=load.resolution if climb else None,
        max_rate=load.max_rate if climb and load.max_rate > 0 else None,
        cost_rates=load.cost_rates,
        cost_step_s=load.cost_step_s if load.cost_rates else None,
        sustain_s=load.sustain_s if climb and load.sustain_s else None,
        # every step's window reads the server's CPU and what else ran
        server_pid=server_pid,
        lab_pid=os.getpid() if server_pid is not None else None,
        server_cores=server_cores,
        body_chars=load.body_chars or None,
        # wss:// (TLS in the server or at a proxy): verified against the lab's CA; a
        # proxy's CPU is read beside the server's
        ca_file=ca_file,
        proxy_pid=proxy_pid,
        continuous=continuous,
    )


def knees(results: Results) -> dict[str, dict[str, Any]]:
    """Per climbed configuration: its knees over the repeats (the ladder's rung), their
    median, min and max, and whether the driver limited any (then the knee is a lower
    bound), as ``results.capacity["knees"]`` records them."""
    return {
        rung.config: {
            "delivered_per_s": rung.knees,
            "driver_limited": rung.driver_limited,
            "lower_bound": rung.lower_bound,
            "connections": rung.connections,
            "median_delivered_per_s": rung.median,
            "min_delivered_per_s": rung.low,
            "max_delivered_per_s": rung.high,
        }
        for rung in rungs_of(results)
    }


def capacity_plan(capacity_per_instance: float, target_delivered_per_s: float) -> dict[str, Any]:
    """Instances for a target load at one configuration's knee: the plan's rule at spread
    1 (:func:`bench.lab.plan.processes_at_knee`) plus :data:`~bench.lab.plan.SPARE`."""
    if capacity_per_instance <= 0:
        return {"target_delivered_per_s": target_delivered_per_s, "instances": None}
    needed = processes_at_knee(target_delivered_per_s, capacity_per_instance)
    return {
        "target_delivered_per_s": target_delivered_per_s,
        "per_instance_delivered_per_s": round(capacity_per_instance),
        "instances_for_load": needed,
        "instances": needed + SPARE,
        "rule": f"ceil(target / per-instance capacity) + {SPARE} for redundancy",
    }
