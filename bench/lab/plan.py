"""A capacity plan: chat processes, Redis primaries and auth replicas for a target, each n+1.

Pure: a :class:`Target` (validated by :func:`target_errors`) and measured
:class:`~bench.lab.scaling.Parts` in, a :class:`Plan` out, and its text
(:func:`plan_markdown`); no I/O. Every number of the plan names the measured figure it
comes from, and the assumptions it stands on are listed with it.

n+1 on every tier: one chat process more than the load needs (a lost process' users
reconnect to the others, which hold them), each Redis primary with one replica (a
lost primary's replica takes its slots over), one auth replica more than the logins
need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.lab.scaling import (
    Parts,
    chat_delivered_per_s,
    chat_us_per_frame,
    random_spread,
    redis_us_per_message,
)

#: the share of one core a Redis primary or an auth replica's core is planned to: their
#: figures are CPU per operation, not a knee at the SLO, and a single-threaded server's
#: queueing delay grows fast past it (an M/M/1 queue waits 2.3 service times at 70 %)
DEFAULT_SHARE = 0.7
#: memory one chat process may give its connections
DEFAULT_PROCESS_MEMORY_GIB = 2.0
#: the most processes a plan may name before it says the target is out of reach
MAX_PROCESSES = 1_000_000


@dataclass(frozen=True)
class Target:
    """What the plan must carry."""

    users: int  # connected users
    sends_per_user_per_min: float
    room_size: int
    logins_per_s: float
    slo: str = "p99=100"
    connections_per_user: float = 1.0
    spread: float | None = None  # processes a room's members are on; None: at random
    share: float = DEFAULT_SHARE
    process_memory_gib: float = DEFAULT_PROCESS_MEMORY_GIB
    auth_cores_per_replica: float = 1.0

    @property
    def sends_per_s(self) -> float:
        return self.users * self.sends_per_user_per_min / 60

    @property
    def delivered_per_s(self) -> float:
        """Every member of the room receives each message, the sender too."""
        return self.sends_per_s * self.room_size

    @property
    def connections(self) -> float:
        return self.users * self.connections_per_user


#: the README's example target, also planned in every scaling report
EXAMPLE_TARGET = Target(users=1_000_000, sends_per_user_per_min=2, room_size=10, logins_per_s=100)


def target_errors(target: Target) -> list[str]:
    """What is wrong with ``target``, one sentence per input (empty: it can be planned)."""
    errors = []
    if target.users < 1:
        errors.append(f"--users {target.users}: connected users must be at least 1")
    if target.sends_per_user_per_min < 0:
        errors.append(f"--sends-per-min {target.sends_per_user_per_min:g}: must be 0 or more")
    if target.room_size < 1:
        errors.append(f"--room-size {target.room_size}: a room has at least 1 member")
    if target.logins_per_s < 0:
        errors.append(f"--logins-per-s {target.logins_per_s:g}: must be 0 or more")
    if target.connections_per_user <= 0:
        errors.append(f"--connections-per-user {target.connections_per_user:g}: must be above 0")
    if target.spread is not None and not 1 <= target.spread <= target.room_size:
        errors.append(
            f"--room-spread {target.spread:g}: between 1 and the room size "
            f"({target.room_size}), or 'random'"
        )
    if not 0 < target.share <= 1:
        errors.append(f"--cpu-share {target.share:g}: a share of one core, in (0, 1]")
    if target.process_memory_gib <= 0:
        errors.append(f"--process-memory-gib {target.process_memory_gib:g}: must be above 0")
    if target.auth_cores_per_replica <= 0:
        errors.append(f"--auth-cores {target.auth_cores_per_replica:g}: must be above 0")
    return errors


@dataclass(frozen=True)
class Tier:
    """One tier of the plan: how many for the load, how many with n+1, and why."""

    name: str
    for_load: int
    total: int  # with n+1
    decided_by: str  # the constraint that set ``for_load``
    sources: tuple[str, ...]  # each figure used: its value and where it was measured
    replicas: int = 0  # standbys beside ``total`` (a Redis primary's replica)

    def total_text(self) -> str:
        """``17``, or ``4 + 4 replicas``."""
        return f"{self.total} + {self.replicas} replicas" if self.replicas else str(self.total)


@dataclass(frozen=True)
class Plan:
    """The tiers, the target's derived loads and the assumptions."""

    target: Target
    tiers: tuple[Tier, ...]
    spread: float  # processes a room's members are on with every chat process up
    assumptions: tuple[str, ...]
    not_planned: tuple[str, ...] = ()  # tiers whose figures were not measured: why
    figures: dict[str, float] = field(default_factory=dict)  # derived numbers, for tests

    def tier(self, name: str) -> Tier | None:
        return next((t for t in self.tiers if t.name == name), None)


def _spread(target: Target, processes: int) -> float:
    if target.spread is not None:
        return min(target.spread, processes)
    return random_spread(processes, target.room_size)


#: processes planned beyond what the load needs: a lost one's users reconnect to the rest
SPARE = 1


def processes_at_knee(delivered_per_s: float, knee_per_process: float) -> int:
    """The fewest processes, each held to ``knee_per_process`` delivered/s, that carry
    ``delivered_per_s`` with every room on one process (spread 1: the least a frame
    costs); 0 when nothing is delivered. The plan's chat tier starts from it, and
    ``capacity --target-load`` plans with it alone (plus :data:`SPARE`)."""
    if delivered_per_s <= 0:
        return 0
    if knee_per_process <= 0:
        raise ValueError("no knee: the process held no load at the SLO")
    return math.ceil(delivered_per_s / knee_per_process)


def chat_processes_for_load(parts: Parts, target: Target) -> int:
    """The fewest chat processes whose delivered/s at the SLO reaches the target's, with
    rooms spread as ``target`` says over that many processes (0 when nothing is sent)."""
    demand = target.delivered_per_s
    if demand <= 0:
        return 0
    assert parts.knee is not None and parts.u1 is not None
    # at spread 1 a frame costs least: no fewer processes than this can carry the load
    n = max(1, processes_at_knee(demand, parts.knee.value) - 1)
    while chat_delivered_per_s(parts, n, _spread(target, n), target.room_size) < demand:
        n += 1
        if n > MAX_PROCESSES:
            raise ValueError(f"more than {MAX_PROCESSES:,} chat processes: out of reach")
    return n


def plan(parts: Parts, target: Target) -> Plan:
    """The plan for ``target`` on ``parts``; tiers whose figures are missing are named in
    ``not_planned`` with the figure they need."""
    tiers: list[Tier] = []
    not_planned: list[str] = []
    figures: dict[str, float] = {
        "sends_per_s": target.sends_per_s,
        "delivered_per_s": target.delivered_per_s,
        "connections": target.connections,
    }
    assumptions = _assumptions(parts, target)
    spread = 1.0
    chat_missing = [
        n for n in ("u1", "beta", "knee", "bytes_per_connection") if not getattr(parts, n)
    ]
    if chat_missing:
        not_planned.append(f"chat processes: not measured: {', '.join(chat_missing)}")
    else:
        assert parts.bytes_per_connection is not None and parts.knee is not None
        assert parts.u1 is not None and parts.beta is not None
        per_process = target.process_memory_gib * 2**30 / parts.bytes_per_connection.value
        by_connections = math.ceil(target.connections / per_process)
        by_load = chat_processes_for_load(parts, target)
        needed = max(by_connections, by_load, 1)
        spread = _spread(target, needed + SPARE)
        figures |= {
            "connections_per_process_max": per_process,
            "processes_by_connections": by_connections,
            "processes_by_load": by_load,
            "us_per_frame": chat_us_per_frame(parts, _spread(target, needed), target.room_size),
        }
        decided = (
            f"delivered/s: {target.delivered_per_s:,.0f} at the SLO, rooms over "
            f"{_spread(target, needed):.2f} processes"
            if by_load >= by_connections
            else f"connections: {target.connections:,.0f} at {per_process:,.0f} per process "
            f"({target.process_memory_gib:g} GiB each)"
        )
        per_process_lost = target.connections / needed  # one process lost: n of n+1 left
        if parts.connections and per_process_lost > parts.connections:
            assumptions += (
                f"{per_process_lost:,.0f} connections per process with one lost "
                f"({per_process_lost / parts.connections:,.0f}x the {parts.connections:,} "
                "the knee was measured at): beyond the measured shape",
            )
        tiers.append(
            Tier(
                "chat processes",
                needed,
                needed + SPARE,
                decided,
                (
                    f"knee, one process on Redis: {parts.knee.text()} ({parts.knee.source})",
                    f"u1, CPU per delivered frame: {parts.u1.text()} ({parts.u1.source})",
                    f"beta, per further process holding a room: {parts.beta.text()} "
                    f"({parts.beta.source})",
                    f"memory per connection: {parts.bytes_per_connection.text()} "
                    f"({parts.bytes_per_connection.source})",
                ),
            )
        )
    if parts.redis_commit_us is None or parts.redis_delivery_us is None:
        not_planned.append("Redis primaries: not measured: Redis' CPU per commit and per delivery")
    else:
        per_message = redis_us_per_message(parts, spread)
        primaries = max(1, math.ceil(target.sends_per_s * per_message / (target.share * 1e6)))
        figures["redis_us_per_message"] = per_message
        tiers.append(
            Tier(
                "Redis primaries",
                primaries,
                primaries,
                f"sends/s: {target.sends_per_s:,.0f} x {per_message:.1f} µs each (rooms over "
                f"{spread:.2f} processes) at {target.share:.0%} of a core per primary; "
                f"each primary has one replica: {2 * primaries} Redis nodes",
                (
                    f"per commit: {parts.redis_commit_us.text()} ({parts.redis_commit_us.source})",
                    f"per subscriber delivery: {parts.redis_delivery_us.text()} "
                    f"({parts.redis_delivery_us.source})",
                ),
                replicas=primaries,
            )
        )
    if parts.logins_per_cpu_s is None:
        not_planned.append("auth replicas: not measured: logins per CPU-second")
    else:
        per_replica = target.auth_cores_per_replica * target.share * parts.logins_per_cpu_s.value
        replicas = max(1, math.ceil(target.logins_per_s / per_replica))
        figures["logins_per_replica"] = per_replica
        tiers.append(
            Tier(
                "auth replicas",
                replicas,
                replicas + SPARE,
                f"logins/s: {target.logins_per_s:,.0f} at {per_replica:,.1f} per replica "
                f"({target.auth_cores_per_replica:g} core(s) at {target.share:.0%})",
                (
                    f"argon2 logins per CPU-second: {parts.logins_per_cpu_s.text()} "
                    f"({parts.logins_per_cpu_s.source})",
                ),
            )
        )
    return Plan(target, tuple(tiers), spread, assumptions, tuple(not_planned), figures)


def _assumptions(parts: Parts, target: Target) -> tuple[str, ...]:
    """What the plan stands on, said plainly."""
    out = [
        f"load: {target.users:,} users x {target.sends_per_user_per_min:g} sends/min = "
        f"{target.sends_per_s:,.0f} sends/s; every member of a room of {target.room_size} "
        f"receives each message (the sender too): {target.delivered_per_s:,.0f} delivered/s; "
        f"{target.connections:,.0f} connections ({target.connections_per_user:g} per user)",
        "room spread: "
        + (
            f"{target.spread:g} processes per room, as given"
            if target.spread is not None
            else "each connection lands on a process at random (the supervisor's steering, "
            "a round-robin load balancer), so a room's members are on "
            "N x (1 - (1 - 1/N)^m) processes on average"
        ),
        f"the knee holds the SLO {parts.slo}, measured at {parts.connections:,} connections "
        f"per process in rooms of {parts.room_size}; a process' CPU budget is what it spent "
        "at that knee, and more idle connections are taken to cost memory, not CPU",
        f"Redis primaries and auth cores are planned to {target.share:.0%} of one core "
        "(no knee of theirs was measured); rooms spread evenly over the primaries' slots",
        "a login costs one argon2 verification at the configured cost; HTTP, the database "
        "and the token's signature are not in the figure",
        "a lost chat process' users reconnect with the tokens they hold: no new logins",
    ]
    if target.room_size != parts.room_size:
        out.append(
            f"rooms of {target.room_size}, measured at {parts.room_size}: what a send costs "
            "apart from its frames is taken to scale with the frames"
        )
    if target.slo != parts.slo:
        out.append(f"SLO asked {target.slo}; the knee used holds {parts.slo}")
    out += list(parts.caveats)
    return tuple(out)


def plan_markdown(found: Plan) -> str:
    """The plan as text (Markdown, readable in a terminal): the tiers, what each number
    comes from, the assumptions."""
    t = found.target
    lines = [
        "## Capacity plan",
        "",
        f"Target: {t.users:,} connected users, {t.sends_per_user_per_min:g} sends per user "
        f"per minute, rooms of {t.room_size}, {t.logins_per_s:g} logins/s, SLO {t.slo}.",
        "",
        "| tier | for the load | with n+1 | decided by |",
        "|---|---:|---:|---|",
    ]
    for tier in found.tiers:
        lines.append(f"| {tier.name} | {tier.for_load} | {tier.total_text()} | {tier.decided_by} |")
    lines.append("")
    for reason in found.not_planned:
        lines.append(f"- NOT PLANNED: {reason}")
    if found.not_planned:
        lines.append("")
    lines += ["Where each number comes from:", ""]
    for tier in found.tiers:
        lines.append(f"- {tier.name}:")
        lines += [f"  - {source}" for source in tier.sources]
    lines += ["", "Assumptions:", ""]
    lines += [f"- {a}" for a in found.assumptions]
    return "\n".join(lines) + "\n"
