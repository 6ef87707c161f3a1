"""A capacity plan: chat processes, Redis primaries and auth replicas for a target, each n+1.

Pure: a :class:`Target` (validated by :func:`target_errors`) and measured
:class:`~bench.lab.scaling.Parts` in, a :class:`Plan` out, and its text
(:func:`plan_markdown`); no I/O. Every number of the plan names the measured figure it
comes from, and the assumptions it stands on are listed with it.

Every tier is also given as a range (:class:`TierRange`): the tier planned again at
every combination of the ends of its parts' intervals (each part's ``low`` and ``high``:
the range over the run's repeats), its fewest and most, and the part whose interval
alone moves it most. A part measured once has no interval and widens nothing; the plan
names it.

n+1 on every tier: one chat process more than the load needs (a lost process' users
reconnect to the others, which hold them), each Redis primary with one replica (a
lost primary's replica takes its slots over), one auth replica more than the logins
and refreshes need.

An auth replica has two budgets: its hashing cores (``--auth-cores``) verify the logins'
passwords (argon2), and its event loop's one core answers every request: each refresh,
and each login's work besides the hash (HTTP, the database, the token's signature, taken
to cost what a refresh costs). The tier is the larger of the two needs; with no refresh
figure measured and no refreshes asked for, it is the hashing need alone.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

from bench.lab.scaling import (
    DASH,
    Figure,
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
    refreshes_per_s: float = 0.0

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
    if target.refreshes_per_s < 0:
        errors.append(f"--refreshes-per-s {target.refreshes_per_s:g}: must be 0 or more")
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


#: the parts a tier's range is made from, each with the tiers it moves
RANGED_PARTS: dict[str, tuple[str, ...]] = {
    "u1": ("chat processes", "Redis primaries"),
    "beta": ("chat processes", "Redis primaries"),
    "knee": ("chat processes", "Redis primaries"),
    "bytes_per_connection": ("chat processes", "Redis primaries"),
    "redis_commit_us": ("Redis primaries",),
    "redis_delivery_us": ("Redis primaries",),
    "logins_per_cpu_s": ("auth replicas",),
    "refreshes_per_cpu_s": ("auth replicas",),
}


@dataclass(frozen=True)
class Swing:
    """One part's interval alone, the other parts at their medians: the tier's total
    (with n+1) at the part's two ends, fewest first."""

    part: str
    figure: Figure
    low: int
    high: int
    need_width: float  # the same in the tier's need before rounding up (breaks ties)

    @property
    def width(self) -> int:
        return self.high - self.low

    def text(self) -> str:
        """``beta 1.20-3.40 µs/frame per process: 16-20``."""
        f = self.figure
        digits = 0 if max(abs(f.low), abs(f.high)) >= 1000 else 2
        unit = f" {f.unit}" if f.unit else ""
        return (
            f"{self.part} {f.low:,.{digits}f}{DASH}{f.high:,.{digits}f}{unit}: "
            f"{_span(self.low, self.high)}"
        )


@dataclass(frozen=True)
class TierRange:
    """A tier's total (with n+1) over every combination of its parts' interval ends:
    the fewest and the most, and the part whose interval alone moves it most (None: no
    part with an interval moves it)."""

    low: int
    high: int
    widest: Swing | None = None

    def text(self) -> str:
        """``15-20``, or ``17`` when every end gives the same."""
        return _span(self.low, self.high)


def _span(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}{DASH}{high}"


@dataclass(frozen=True)
class Tier:
    """One tier of the plan: how many for the load, how many with n+1, and why."""

    name: str
    for_load: int
    total: int  # with n+1
    decided_by: str  # the constraint that set ``for_load``
    sources: tuple[str, ...]  # each figure used: its value and where it was measured
    replicas: int = 0  # standbys beside ``total`` (a Redis primary's replica)
    need: float = 0.0  # ``for_load`` before rounding up: the load over one's capacity
    range: TierRange | None = None  # over the parts' intervals (None: not computed)

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
    # parts the plan used that have no interval (measured once, or every repeat alike)
    no_interval: tuple[str, ...] = ()

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
    """The plan for ``target`` on ``parts``, each tier with its range over the parts'
    intervals; tiers whose figures are missing are named in ``not_planned`` with the
    figure they need."""
    point = _point_plan(parts, target)
    ends = {name: e for name in RANGED_PARTS if (e := _ends(getattr(parts, name))) is not None}
    used = {name for name in RANGED_PARTS if getattr(parts, name) is not None}
    tiers = tuple(
        replace(tier, range=_tier_range(tier, parts, target, ends)) for tier in point.tiers
    )
    no_interval = tuple(
        name
        for name in RANGED_PARTS
        if name in used and name not in ends and any(point.tier(t) for t in RANGED_PARTS[name])
    )
    return replace(point, tiers=tiers, no_interval=no_interval)


def _ends(figure: Figure | None) -> tuple[float, float] | None:
    """A part's interval: its low and high (None: measured once, or every repeat alike)."""
    if figure is None or figure.repeats < 2 or figure.low == figure.high:
        return None
    return figure.low, figure.high


def _at(parts: Parts, values: dict[str, float]) -> Parts:
    """``parts`` with each named part's value set (its interval and source kept)."""
    return replace(
        parts, **{name: replace(getattr(parts, name), value=v) for name, v in values.items()}
    )


def _total_and_need(parts: Parts, target: Target, name: str) -> tuple[int, float]:
    tier = _point_plan(parts, target).tier(name)
    assert tier is not None  # the same parts are measured at every end
    return tier.total, tier.need


def _tier_range(
    tier: Tier, parts: Parts, target: Target, ends: dict[str, tuple[float, float]]
) -> TierRange:
    """``tier``'s total over every combination of the interval ends of the parts that
    move it, and the part that alone moves it most."""
    mine = {name: e for name, e in ends.items() if tier.name in RANGED_PARTS[name]}
    totals = [tier.total]
    for corner in itertools.product(*mine.values()):
        totals.append(
            _total_and_need(_at(parts, dict(zip(mine, corner, strict=True))), target, tier.name)[0]
        )
    swings = []
    for name, (low, high) in mine.items():
        at = [_total_and_need(_at(parts, {name: v}), target, tier.name) for v in (low, high)]
        found = [tier.total, *(t for t, _ in at)]
        needs = [tier.need, *(n for _, n in at)]
        swings.append(
            Swing(name, getattr(parts, name), min(found), max(found), max(needs) - min(needs))
        )
    widest = max(swings, key=lambda s: (s.width, s.need_width), default=None)
    if widest is not None and widest.need_width == 0:
        widest = None
    return TierRange(min(totals), max(totals), widest)


def _point_plan(parts: Parts, target: Target) -> Plan:
    """The plan at the parts' values (their medians), without ranges."""
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
        # the load over one process' budget at the spread ``needed`` processes give
        budget_us = parts.knee.value * parts.u1.value
        load_need = target.delivered_per_s * figures["us_per_frame"] / budget_us
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
                need=max(target.connections / per_process, load_need),
            )
        )
    if parts.redis_commit_us is None or parts.redis_delivery_us is None:
        not_planned.append("Redis primaries: not measured: Redis' CPU per commit and per delivery")
    else:
        per_message = redis_us_per_message(parts, spread)
        redis_need = target.sends_per_s * per_message / (target.share * 1e6)
        primaries = max(1, math.ceil(redis_need))
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
                need=redis_need,
            )
        )
    auth_missing = []
    if parts.logins_per_cpu_s is None:
        auth_missing.append("logins per CPU-second")
    if parts.refreshes_per_cpu_s is None and target.refreshes_per_s > 0:
        auth_missing.append("refreshes per CPU-second")
    if auth_missing:
        not_planned.append(f"auth replicas: not measured: {', '.join(auth_missing)}")
    else:
        tier, auth_figures = _auth_tier(parts, target)
        figures |= auth_figures
        tiers.append(tier)
    return Plan(target, tuple(tiers), spread, assumptions, tuple(not_planned), figures)


def _auth_tier(parts: Parts, target: Target) -> tuple[Tier, dict[str, float]]:
    """The auth replicas: the larger of the hashing cores' need (logins' argon2) and the
    event loop's (every refresh, and every login's work besides its hash), each printed."""
    assert parts.logins_per_cpu_s is not None
    share = target.share
    logins_per_replica = target.auth_cores_per_replica * share * parts.logins_per_cpu_s.value
    hashing_need = target.logins_per_s / logins_per_replica
    figures = {"logins_per_replica": logins_per_replica, "auth_need_hashing": hashing_need}
    hashing = (
        f"logins/s: {target.logins_per_s:,.0f} at {logins_per_replica:,.1f} per replica "
        f"({target.auth_cores_per_replica:g} core(s) at {share:.0%})"
    )
    sources = [
        f"argon2 logins per CPU-second: {parts.logins_per_cpu_s.text()} "
        f"({parts.logins_per_cpu_s.source})"
    ]
    if parts.refreshes_per_cpu_s is None:  # and no refreshes asked for
        need, decided = hashing_need, hashing
    else:
        requests_per_replica = share * parts.refreshes_per_cpu_s.value
        requests = target.logins_per_s + target.refreshes_per_s
        loop_need = requests / requests_per_replica
        figures |= {"requests_per_replica": requests_per_replica, "auth_need_loop": loop_need}
        loop = (
            f"logins + refreshes/s: {target.logins_per_s:,.0f} + {target.refreshes_per_s:,.0f} "
            f"at {requests_per_replica:,.0f} per replica (its event loop's core at {share:.0%})"
        )
        sources.append(
            f"refreshes per CPU-second: {parts.refreshes_per_cpu_s.text()} "
            f"({parts.refreshes_per_cpu_s.source})"
        )
        need = max(hashing_need, loop_need)
        parts_text = f"argon2 {hashing_need:,.2f}; event loop {loop_need:,.2f} replicas"
        decided = f"{hashing if hashing_need >= loop_need else loop} ({parts_text})"
    replicas = max(1, math.ceil(need))
    return (
        Tier("auth replicas", replicas, replicas + SPARE, decided, tuple(sources), need=need),
        figures,
    )


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
        "a login costs one argon2 verification at the configured cost on an auth replica's "
        "hashing cores; its HTTP, database and signing work is on the replica's event loop",
        (
            "a refresh costs what the refresh figure measured: the whole request at the auth "
            "service (HTTP, the database's spend and insert, the token's signature), on its "
            "event loop's one core; a login's work besides its hash is taken to cost the same"
            if parts.refreshes_per_cpu_s is not None
            else "no refresh figure in this run: the auth replicas are sized from argon2 "
            "alone (the event loop's work, refreshes and the rest of each login, not counted)"
        ),
        "a lost chat process' users reconnect with the tokens they hold, or refresh them "
        "(no password, no argon2): no new logins",
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


#: how the plan's ranges are made, printed under its table
RANGE_NOTE = (
    "Range: the tier planned again at every combination of the ends of its parts' "
    "intervals (each part's range over the run's repeats), fewest to most; widened most "
    "by: the part whose interval alone, the others at their medians, moves the tier most."
)


def plan_markdown(found: Plan) -> str:
    """The plan as text (Markdown, readable in a terminal): the tiers, what each number
    comes from, the assumptions."""
    t = found.target
    lines = [
        "## Capacity plan",
        "",
        f"Target: {t.users:,} connected users, {t.sends_per_user_per_min:g} sends per user "
        f"per minute, rooms of {t.room_size}, {t.logins_per_s:g} logins/s, "
        f"{t.refreshes_per_s:g} refreshes/s, SLO {t.slo}.",
        "",
        "| tier | for the load | with n+1 | range with n+1 | widened most by | decided by |",
        "|---|---:|---:|---:|---|---|",
    ]
    for tier in found.tiers:
        span = tier.range.text() if tier.range else ""
        widest = tier.range.widest.text() if tier.range and tier.range.widest else "no part"
        lines.append(
            f"| {tier.name} | {tier.for_load} | {tier.total_text()} | {span} | {widest} "
            f"| {tier.decided_by} |"
        )
    lines.append("")
    if found.tiers:
        lines += [RANGE_NOTE, ""]
    if found.no_interval:
        lines += [
            f"No interval (measured once, or every repeat alike), so they widen no range: "
            f"{', '.join(found.no_interval)}.",
            "",
        ]
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
