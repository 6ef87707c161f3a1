"""Load profiles, custom stage tables and latency thresholds: what a run does and must meet.

Pure data and parsing, no Locust import (Locust monkey-patches the standard library
when imported), so the tests and ``python -m loadtest.seed`` can use it too.

A profile is a table of :class:`Stage` rows run one after the other, and the pause
range between one user's sends. Every built-in profile ends by itself with a *quiet*
stage: users stop sending but keep receiving, so that every message in flight
arrives before users leave and the delivery count is exact. A custom table
(``--stages``) that does not end quiet gets :data:`QUIET_TAIL_S` of quiet appended.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

#: seconds of quiet appended to a custom stage table that does not end quiet
QUIET_TAIL_S = 5.0


@dataclass(frozen=True)
class Stage:
    """One row of a stage table: run ``duration_s`` moving towards ``users``.

    ``spawn_rate`` is users started (or stopped) per second; None spreads the change
    over the whole stage. A ``quiet`` stage's users send nothing and keep receiving.
    """

    duration_s: float
    users: int
    spawn_rate: float | None = None
    quiet: bool = False


@dataclass(frozen=True)
class Profile:
    """A named stage table and the range, in seconds, of one user's pause between sends."""

    name: str
    stages: tuple[Stage, ...]
    pause_s: tuple[float, float]
    description: str


def _profile(name: str, pause_s: tuple[float, float], description: str, *stages: Stage) -> Profile:
    return Profile(name, stages, pause_s, description)


#: the named profiles of ``--load-profile``
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        _profile(
            "smoke",
            (0.2, 0.3),
            "20 users in 4 s, 8 s of chat, 4 s quiet: under 20 s, for tests",
            Stage(4, 20, 5),
            Stage(8, 20),
            Stage(4, 20, quiet=True),
        ),
        _profile(
            "gentle",
            (1.0, 2.0),
            "30 s ramp to 20 users, 60 s hold",
            Stage(30, 20),
            Stage(60, 20),
            Stage(QUIET_TAIL_S, 20, quiet=True),
        ),
        _profile(
            "moderate",
            (0.5, 1.0),
            "30 s ramp to 50 users, 120 s hold",
            Stage(30, 50),
            Stage(120, 50),
            Stage(QUIET_TAIL_S, 50, quiet=True),
        ),
        _profile(
            "harsh",
            (0.3, 0.6),
            "30 s ramp to 100 users, 60 s hold, 30 s ramp to 200, 120 s hold",
            Stage(30, 100),
            Stage(60, 100),
            Stage(30, 200),
            Stage(120, 200),
            Stage(QUIET_TAIL_S, 200, quiet=True),
        ),
        _profile(
            "violence",
            (0.2, 0.5),
            "ramp to 500 users over 500 s",
            Stage(500, 500),
            Stage(QUIET_TAIL_S, 500, quiet=True),
        ),
        _profile(
            "report",
            (0.3, 0.5),
            "60 s ramp to 250 users, 120 s hold, quiet tail, 30 s ramp down (the lab's run)",
            Stage(60, 250),
            Stage(120, 250),
            Stage(QUIET_TAIL_S, 250, quiet=True),
            Stage(30, 0, quiet=True),
        ),
    )
}

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")
_STAGE = re.compile(
    r"^(?P<duration>[0-9.hms]+):(?P<users>\d+)(?:@(?P<rate>\d+(?:\.\d+)?))?(?P<quiet>:quiet)?$"
)


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``2m``, ``1m30s`` or ``1h``; ValueError for anything else."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"bad duration {text!r} (examples: 30s, 2m, 1m30s)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def parse_stages(text: str) -> tuple[Stage, ...]:
    """Parse ``DURATION:USERS[@RATE][:quiet],...`` into stages, a quiet tail appended if needed.

    Example: ``30s:20@5,60s:20,30s:0`` ramps to 20 users at 5 per second and holds
    for the rest of 30 s, holds 60 s, ramps down to 0 over 30 s, then (not quiet
    yet) gets a :data:`QUIET_TAIL_S` quiet stage at 0 users. ValueError names the
    bad item.
    """
    stages: list[Stage] = []
    for item in (part.strip() for part in text.split(",")):
        match = _STAGE.match(item)
        if match is None:
            raise ValueError(
                f"bad stage {item!r} (syntax DURATION:USERS[@RATE][:quiet], e.g. 30s:20@5)"
            )
        duration_s = parse_duration(match["duration"])
        rate = float(match["rate"]) if match["rate"] else None
        if duration_s <= 0 or (rate is not None and rate <= 0):
            raise ValueError(f"bad stage {item!r}: duration and rate must be above 0")
        stages.append(Stage(duration_s, int(match["users"]), rate, bool(match["quiet"])))
    return with_quiet_tail(tuple(stages))


def with_quiet_tail(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """``stages``, with a :data:`QUIET_TAIL_S` quiet hold appended unless the last is quiet."""
    if not stages or stages[-1].quiet or math.isinf(stages[-1].duration_s):
        return stages
    return (*stages, Stage(QUIET_TAIL_S, stages[-1].users, quiet=True))


def parse_pause(text: str) -> tuple[float, float]:
    """Parse ``MIN-MAX`` (or one number) seconds between one user's sends; ValueError if bad."""
    low, sep, high = text.strip().partition("-")
    try:
        bounds = (float(low), float(high) if sep else float(low))
    except ValueError:
        raise ValueError(f"bad pause {text!r} (seconds, MIN-MAX, e.g. 0.3-0.5)") from None
    if not 0 < bounds[0] <= bounds[1]:
        raise ValueError(f"bad pause {text!r}: need 0 < MIN <= MAX")
    return bounds


@dataclass(frozen=True)
class Step:
    """What a stage table asks for at one moment."""

    index: int
    users: int
    spawn_rate: float
    quiet: bool


class Schedule:
    """A stage table on a clock: which stage runs ``t`` seconds after the start.

    Each stage's spawn rate is fixed when the table is built: the stage's own, or the
    change in users spread over its duration (the previous rate for a hold).
    """

    def __init__(self, stages: tuple[Stage, ...]) -> None:
        if not stages:
            raise ValueError("a stage table needs at least one stage")
        self.stages = stages
        self.peak_users = max(stage.users for stage in stages)
        self._ends: list[float] = []
        self._steps: list[Step] = []
        end, users, rate = 0.0, 0, 1.0
        for index, stage in enumerate(stages):
            change = abs(stage.users - users)
            if stage.spawn_rate is not None:
                rate = stage.spawn_rate
            elif change:
                rate = change / stage.duration_s if math.isfinite(stage.duration_s) else rate
            end += stage.duration_s
            users = stage.users
            self._ends.append(end)
            self._steps.append(Step(index, stage.users, round(rate, 3), stage.quiet))
        self.duration_s = end

    def at(self, t_s: float) -> Step | None:
        """The step running at ``t_s`` seconds, or None once the table is over."""
        for end, step in zip(self._ends, self._steps, strict=True):
            if t_s < end:
                return step
        return None


# ---- thresholds ---------------------------------------------------------------

_SLO_ITEM = re.compile(r"^p(\d+(?:\.\d+)?)=(\d+(?:\.\d+)?)$")


def parse_slo(text: str) -> dict[str, tuple[float, float]]:
    """Parse ``p90=200,p95=500,p99=1000`` into ``{"p90": (0.90, 200.0), ...}`` (limits in ms).

    An empty text means no thresholds. ValueError names the bad item.
    """
    slo: dict[str, tuple[float, float]] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        match = _SLO_ITEM.match(item)
        if match is None or not 0 < float(match[1]) < 100:
            raise ValueError(f"bad threshold {item!r} (syntax pNN=MS, e.g. p99=1000)")
        slo[f"p{match[1]}"] = (float(match[1]) / 100, float(match[2]))
    return slo


@dataclass(frozen=True)
class Verdict:
    """One threshold checked: the percentile's limit and what the run measured (ms)."""

    name: str
    limit_ms: float
    measured_ms: float | None
    passed: bool


def judge(
    slo: dict[str, tuple[float, float]], percentile_ms: Callable[[float], float], samples: int
) -> list[Verdict]:
    """Check each threshold against ``percentile_ms(q)``; with no samples every one fails."""
    verdicts = []
    for name, (quantile, limit_ms) in slo.items():
        measured = percentile_ms(quantile) if samples else None
        verdicts.append(
            Verdict(name, limit_ms, measured, measured is not None and measured <= limit_ms)
        )
    return verdicts
