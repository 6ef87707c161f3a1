"""Capacity: climb the offered load to the SLO's knee, for configurations and the relays.

One fast-driver process per climb (one set of connections): it offers a fixed rate for
``step_s`` seconds, multiplies it by ``factor`` while the fan-out percentiles hold the SLO
with nothing lost, then bisects (geometrically) between the last rate held and the first
broken until they are within ``resolution`` (5 %). A step whose per-second timeline shows a
stall (a second over 10x the step's median p99, or one with no delivery) is marked and run
once more, and the re-run decides. Capacity is the highest *delivered* rate that held. The
bare relay is climbed the same way in the same run, so the chat server's capacity is stated
as a fraction of what the transport alone does. A step where the driver itself was the
bottleneck ends the climb and is marked: then the knee is at least that, and the driver's.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from bench.lab.matrix import Config, Load
from bench.lab.results import Run, edge, parse_slo
from bench.lab.runner import Lab

__all__ = ["climb", "edge", "parse_slo", "plan", "slo_text"]


def slo_text(slo_ms: dict[str, float]) -> str:
    """``{"p99": 100.0}`` → ``"p99=100"`` (what the driver's ``--climb`` takes)."""
    return ",".join(f"{k}={v:g}" for k, v in slo_ms.items())


def climb(
    lab: Lab,
    config: Config,
    load: Load,
    *,
    slo_ms: dict[str, float],
    start_rate: float,
    factor: float,
    max_rate: float,
    resolution: float = 0.05,
    repeat: int = 0,
) -> Run:
    """Climb one configuration with one server and one driver; the Run, its knee filled."""
    workdir, run, sampler = lab.begin_run(config, repeat, "capacity")
    server = None
    climbing = replace(
        load,
        rates=(round(start_rate),),
        warmup_s=min(load.warmup_s, 1.0),
        climb=slo_text(slo_ms),
        factor=factor,
        resolution=resolution,
        max_rate=max_rate,
    )
    try:
        server, _ = lab.start_target(config, workdir)
        assert server.proc is not None
        sampler.watch("server", server.proc.pid)
        if lab.redis is not None:
            sampler.watch("redis", lab.redis.pids())
        time.sleep(load.settle_s)
        lab._phase(config, repeat, f"climbing from {start_rate:,.0f} sent/s")
        run.steps.extend(
            lab.fast_step(
                config,
                climbing,
                server.url,  # type: ignore[attr-defined]
                workdir,
                sampler,
                server_pid=server.proc.pid,
            )
        )
        run.knee = {**edge(run, slo_ms), "room_size": load.room_size}
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
        run.host = sampler.host
    return run


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
