"""The scaling function: what N chat processes, R Redis primaries and A auth replicas carry.

Pure arithmetic on measured figures (:class:`Parts`, each term a :class:`Figure` that
names the measurement it comes from); no I/O. The terms:

- ``u1``: a chat process' CPU µs per delivered frame on Redis, every member of a room
  on that one process (spread 1);
- ``beta``: what each further process holding members of a room adds, in µs per
  delivered frame of the measured room size ``m0``: that process hears each message
  from Redis once, decodes it and encodes it once for its own members
  (``b = beta * m0`` µs per message);
- ``knee``: one process' delivered/s at the SLO on Redis, spread 1;
- ``redis_commit_us``, ``redis_delivery_us``: Redis' CPU µs per commit (one send: the
  commit script's stream append and publish) and per subscriber delivery (one process
  subscribed to the room's channel hears it);
- ``logins_per_cpu_s``: argon2 verifications per CPU-second at the configured cost;
- ``refreshes_per_cpu_s``: ``POST /refresh`` answered per CPU-second of the auth service
  (the whole request: HTTP, the database, the token's signature; no argon2);
- ``bytes_per_connection``: a chat process' memory per idle connection.

For sends/s ``S`` in rooms of ``m`` members spread over ``s`` processes (delivered/s
``D = S * m``):

- chat: ``D <= N * knee * u1 / u(s)`` with ``u(s) = u1 + (s - 1) * beta * m0 / m``: a
  process' CPU budget at the SLO is what it spends at its knee (``knee * u1``), and a
  spread room costs more CPU per delivered frame;
- Redis: ``S <= R * share * 1e6 / (redis_commit_us + s * redis_delivery_us)``: Redis has
  no knee measured here, so a primary is planned to ``share`` of one core;
- connections: ``<= N * memory_per_process / bytes_per_connection``;
- logins/s: ``<= A * cores_per_replica * share * logins_per_cpu_s``, and logins plus
  refreshes/s ``<= A * share * refreshes_per_cpu_s`` (each replica's event loop, one core);
- ``s`` for members placed on processes at random (each connection lands on any
  process with equal chance, as the supervisor's steering and a round-robin load
  balancer do): ``N * (1 - (1 - 1/N) ** m)`` (:func:`random_spread`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

DASH = "\u2013"


@dataclass(frozen=True)
class Figure:
    """A measured figure: its median over repeats, their range, its unit and its source."""

    value: float
    low: float
    high: float
    unit: str
    source: str  # which run, configuration and step measured it, and how it was derived
    repeats: int = 1
    lower_bound: bool = False  # the figure is at least this (a knee the driver limited)

    @classmethod
    def of(cls, values: Sequence[float | None], unit: str, source: str) -> Figure | None:
        """The median and range of ``values`` (None left out); None when none is known."""
        known = [v for v in values if v is not None]
        if not known:
            return None
        return cls(statistics.median(known), min(known), max(known), unit, source, len(known))

    @classmethod
    def given(cls, value: float, unit: str, source: str) -> Figure:
        """One value, no spread (a fixed input or a hand-computed test case)."""
        return cls(value, value, value, unit, source)

    def text(self, digits: int | None = None) -> str:
        """``24.1 µs/frame (23.5-25.0, 3 repeats)`` (an en dash between the ends); ``≥``
        before a lower bound."""
        if digits is None:
            digits = 0 if abs(self.value) >= 1000 else 2
        bound = "≥ " if self.lower_bound else ""
        unit = f" {self.unit}" if self.unit else ""
        head = f"{bound}{self.value:,.{digits}f}{unit}"
        if self.repeats > 1:
            low, high = f"{self.low:,.{digits}f}", f"{self.high:,.{digits}f}"
            return f"{head} ({low}{DASH}{high}, {self.repeats} repeats)"
        return head

    @property
    def spread(self) -> float:
        """(high - low) / |median|: how far the repeats moved (0 for one)."""
        return (self.high - self.low) / abs(self.value) if self.value else 0.0


@dataclass(frozen=True)
class Parts:
    """Every measured term of the scaling function (None: not measured)."""

    room_size: int  # m0: the room size the parts were measured at
    connections: int  # the connections per process the knee was measured at
    slo: str  # the SLO the knee holds (e.g. "p99=100")
    u1: Figure | None = None  # µs per delivered frame, spread 1
    beta: Figure | None = None  # µs per delivered frame per further process
    knee: Figure | None = None  # delivered/s at the SLO, spread 1
    redis_commit_us: Figure | None = None
    redis_delivery_us: Figure | None = None
    logins_per_cpu_s: Figure | None = None
    refreshes_per_cpu_s: Figure | None = None
    bytes_per_connection: Figure | None = None
    # figures quoted beside the terms, not used by the function: BROKER=memory's
    # CPU per frame and knee, each spread's measured CPU per frame
    notes: dict[str, Figure] = field(default_factory=dict)
    # what the terms stand on that a reader should know (one Redis standing in for a
    # cluster's primary, a slope measured below zero taken as zero)
    caveats: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        """The terms not measured, by name."""
        names = ("u1", "beta", "knee", "redis_commit_us", "redis_delivery_us")
        names += ("logins_per_cpu_s", "refreshes_per_cpu_s", "bytes_per_connection")
        return [n for n in names if getattr(self, n) is None]


def random_spread(processes: int, room_size: int) -> float:
    """Expected number of processes holding members of a room of ``room_size`` when each
    member lands on one of ``processes`` at random: ``N * (1 - (1 - 1/N) ** m)``."""
    if processes < 1 or room_size < 1:
        raise ValueError("processes and room size must be at least 1")
    return processes * (1 - (1 - 1 / processes) ** room_size)


def chat_us_per_frame(parts: Parts, spread: float, room_size: int) -> float:
    """``u(s) = u1 + (s - 1) * beta * m0 / m``: the chat tier's CPU µs per delivered frame
    in rooms of ``room_size`` spread over ``spread`` processes (a slope below zero counts 0)."""
    assert parts.u1 is not None and parts.beta is not None
    per_message = max(parts.beta.value, 0.0) * parts.room_size
    return parts.u1.value + (spread - 1) * per_message / room_size


def redis_us_per_message(parts: Parts, spread: float) -> float:
    """``rc + s * rd``: Redis' CPU µs per send in a room spread over ``spread`` processes
    (a per-delivery cost below zero counts 0)."""
    assert parts.redis_commit_us is not None and parts.redis_delivery_us is not None
    delivery = max(parts.redis_delivery_us.value, 0.0)
    return max(parts.redis_commit_us.value, 0.0) + spread * delivery


def chat_delivered_per_s(parts: Parts, processes: int, spread: float, room_size: int) -> float:
    """Delivered/s ``processes`` chat processes hold at the SLO:
    ``N * knee * u1 / u(s)``."""
    assert parts.knee is not None and parts.u1 is not None
    budget_us = parts.knee.value * parts.u1.value  # CPU µs/s one process spends at its knee
    return processes * budget_us / chat_us_per_frame(parts, spread, room_size)


def redis_delivered_per_s(
    parts: Parts, primaries: int, spread: float, room_size: int, share: float
) -> float:
    """Delivered/s ``primaries`` Redis primaries carry at ``share`` of a core each:
    ``m * R * share * 1e6 / (rc + s * rd)``."""
    per_message = redis_us_per_message(parts, spread)
    if per_message <= 0:
        return float("inf")
    return room_size * primaries * share * 1e6 / per_message


def delivered_per_s(
    parts: Parts,
    processes: int,
    primaries: int,
    room_size: int,
    *,
    share: float,
    spread: float | None = None,
) -> float:
    """Delivered/s the deployment holds: the lesser of its chat tier and its Redis tier;
    ``spread`` None: members placed at random (:func:`random_spread`)."""
    s = random_spread(processes, room_size) if spread is None else spread
    return min(
        chat_delivered_per_s(parts, processes, s, room_size),
        redis_delivered_per_s(parts, primaries, s, room_size, share),
    )


def connections(parts: Parts, processes: int, memory_per_process_bytes: float) -> float:
    """Connections ``processes`` chat processes hold in their memory:
    ``N * memory / bytes_per_connection``."""
    assert parts.bytes_per_connection is not None
    return processes * memory_per_process_bytes / parts.bytes_per_connection.value


def logins_per_s(parts: Parts, replicas: int, cores_per_replica: float, share: float) -> float:
    """Logins/s ``replicas`` auth replicas verify: ``A * c * share * L``."""
    assert parts.logins_per_cpu_s is not None
    return replicas * cores_per_replica * share * parts.logins_per_cpu_s.value


def tier_us_per_frame(parts: Parts, spread: float) -> float:
    """Chat processes plus Redis, CPU µs per delivered frame at the measured room size:
    ``u(s) + (rc + s * rd) / m0`` (what the check compares with a measurement)."""
    chat = chat_us_per_frame(parts, spread, parts.room_size)
    return chat + redis_us_per_message(parts, spread) / parts.room_size


def fit_slope(x1: float, y1: float, x2: float, y2: float) -> float:
    """The slope through two points (a spread's figure at two spreads)."""
    if x2 == x1:
        raise ValueError("two points at the same spread give no slope")
    return (y2 - y1) / (x2 - x1)


#: the check passes when the prediction is within this of the measurement
CHECK_TOLERANCE = 0.15


@dataclass(frozen=True)
class Check:
    """Predicted against measured CPU µs per delivered frame (chat processes plus Redis)
    at one spread, over repeats."""

    processes: int
    spread: float
    predicted: Figure
    measured: Figure
    tolerance: float = CHECK_TOLERANCE
    # the same split by tier, (predicted, measured) medians: where a miss is
    chat: tuple[float, float] | None = None
    redis: tuple[float, float] | None = None

    @property
    def error(self) -> float:
        """predicted / measured - 1, on the medians."""
        return self.predicted.value / self.measured.value - 1

    @property
    def within(self) -> bool:
        """The medians agree within the tolerance."""
        return abs(self.error) <= self.tolerance

    def sentence(self) -> str:
        """One line for the terminal and the report."""
        verdict = (
            f"within ±{self.tolerance:.0%}"
            if self.within
            else f"MISSED: outside ±{self.tolerance:.0%}"
        )
        split = "".join(
            f"; {name} {pred:.2f} predicted, {meas:.2f} measured ({pred / meas - 1:+.1%})"
            for name, pair in (("chat processes", self.chat), ("Redis", self.redis))
            if pair is not None
            for pred, meas in (pair,)
            if meas > 0
        )
        return (
            f"WORKERS={self.processes} (rooms over {self.spread:.2f} processes on average), "
            "CPU per delivered frame of the chat processes plus Redis: predicted "
            f"{self.predicted.text()}, measured {self.measured.text()}: "
            f"{self.error:+.1%}, {verdict}{split}"
        )
