"""The climb to the knee: the next rate to try, and whether a stalled step runs again."""

from __future__ import annotations

import math

from bench.lab.driver.config import DriverConfig
from bench.lab.results import Step


def next_climb_rate(rate: float, held: float, broke: float, config: DriverConfig) -> float | None:
    """The climb's next rate after ``rate``, given the highest rate that held so far (0:
    none) and the lowest that broke (inf: none); None when the edge is found (within
    ``resolution``) or the climb hit ``max_rate`` or ``min_rate``."""
    if broke == math.inf:
        return None if rate >= config.max_rate else min(rate * config.factor, config.max_rate)
    if held == 0:
        return None if rate / config.factor < config.min_rate else rate / config.factor
    if broke / held <= 1 + config.resolution:
        return None
    return math.sqrt(held * broke)


def worth_a_rerun(step: Step, slo: dict[str, float]) -> bool:
    """A stalled step is run again when it held anyway, or when every second but the
    stalled ones kept the SLO's p99 (a passing stall, not an overload)."""
    if step.holds(slo):
        return True
    bound = slo.get("p99")
    calm = [p for p in step.timeline if p.t_s not in step.stall_s]
    return bound is not None and all(p.p99_ms is not None and p.p99_ms < bound for p in calm)
