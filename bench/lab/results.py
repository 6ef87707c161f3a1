"""What a lab run measured: plain dataclasses saved as ``results.json`` beside the report.

The runner fills them, the report reads them; the drivers write :class:`Step` lists as
JSON that :meth:`Step.from_dict` reads back. Every time is in seconds since the run
started (``t_s``) unless its name says otherwise; latencies are fan-out latencies in
milliseconds (scheduled send time to each receive); rates are per second.

Units: ``delivered`` counts ``message`` frames received by room members (acks and
presence are not counted); ``sent`` counts ``send`` frames the driver put on the wire.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

#: where a lab run writes its results and report, unless told: ``reports/<time>-<label>/``
REPORTS_DIR = Path(__file__).resolve().parents[2] / "reports"
#: the percentiles every latency summary carries, as keys of :attr:`Step.latency_ms`
PERCENTILES = ("p50", "p90", "p95", "p99", "p999", "max")

#: what "the seed report" means wherever the lab names it
SEED_REPORT = "the report this project started from, whose server measured 6,500 → 18,000 messages/s on its own machine at p90/p95/p99 481/570/768 ms"  # noqa: E501 (one line: tests/test_docs.py finds it word for word)
#: the headline SLO (fan-out p99 under 100 ms) and the seed report's, shown beside it
HEADLINE_SLO_MS = {"p99": 100.0}
SEED_SLO_MS = {"p90": 200.0, "p95": 500.0, "p99": 1000.0}


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without keys ``cls`` does not have (results written by a newer lab load)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class TimePoint:
    """One second (or one Locust stats-history row) of a driver's view."""

    t_s: float
    users: int = 0
    sent_per_s: float = 0.0
    delivered_per_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None


@dataclass
class Step:
    """One load step of one driver: a fixed offered load held for ``duration_s``.

    The fast driver writes one per ``--rates`` value; a Locust run is one step whose
    ``offered_per_s`` is None (it is closed-loop: users wait between sends).
    """

    driver: str  # "fast" | "locust"
    name: str  # e.g. "rate 4000/s" or "profile smoke"
    connections: int
    offered_per_s: float | None  # messages/s the schedule asked for (fast driver)
    duration_s: float
    sent: int
    delivered: int
    expected: int  # sent x room members: what ``delivered`` should reach
    sent_per_s: float
    delivered_per_s: float
    latency_ms: dict[str, float]  # keys: PERCENTILES
    errors: int = 0  # error frames, failed connections, unexpected closes
    error_detail: dict[str, int] = field(default_factory=dict)
    # fast driver --retry: sends made again (after_unavailable, after_reconnect), reconnects
    retries: dict[str, int] = field(default_factory=dict)
    late_sends: int = 0  # sends that left more than 1 ms after their scheduled time
    max_send_lag_ms: float = 0.0
    generator_cpu_percent: float | None = None  # mean over the step, of one core
    generator_limited: bool = False  # CPU > 90 % or sends behind schedule
    # the driver could not do more: CPU > 90 %, or it waited for its core (sends merely
    # behind schedule are not this: near a knee, the target's bursts delay them)
    generator_saturated: bool = False
    # the driver's cores' busy share over the send phase, in percent of one core: its own
    # CPU and the kernel's work there (the loopback's packets); None when it was not pinned
    generator_core_busy_percent: float | None = None
    # fast driver: collections its own garbage collector ran inside the step (0: it is
    # off from the step's start to the end of its drain)
    generator_gc_runs: int = 0
    generator_notes: list[str] = field(default_factory=list)
    timeline: list[TimePoint] = field(default_factory=list)
    histogram: str = ""  # HDR histogram, base64 (hdrh encode), microseconds; "" if none
    ack_latency_ms: dict[str, float] = field(default_factory=dict)
    # when the step's load began, on the clock of Run.samples (seconds since the run's
    # sampler started: the fast driver's --t0-monotonic); the report takes CPU and RSS
    # per step from it, and the whole run's when it is None
    started_s: float | None = None
    # a capacity climb's marks: the seconds (timeline t_s) that stalled (see
    # :func:`stalled_points`), and whether this step was run again (``superseded``: the
    # climb went by its re-run) or is the re-run of a stalled step (``rerun``)
    stall_s: list[float] = field(default_factory=list)
    superseded: bool = False
    rerun: bool = False
    body_chars: int = 0  # the message body's length (the fast driver's --body-chars)
    frame_bytes: int = 0  # one ``send`` frame's payload on the wire, before compression
    deflate: bool = False  # the driver negotiated permessage-deflate
    # the server's Sec-WebSocket-Extensions reply where it did ("" otherwise): whether
    # it kept context takeover (WS_DEFLATE=on) or not (shared), and its window bits
    deflate_params: str = ""
    # a fixed-rate step a climbing run makes before its climb, to measure what a frame
    # costs at a stated load (:attr:`server_us_per_frame`); never part of the climb
    cost: bool = False
    # a step at a share of the climb's knee, held longer than the climb's steps, after the
    # climb: whether the knee holds sustained or only in bursts; never part of the climb
    sustain: bool = False
    # counters read by the fast driver at the send phase's start and at the end of its
    # drain (``window_s`` apart; None where it was not told the server's pid): CPU
    # seconds (user + system) of
    # the server's process tree, of processes outside the lab, and the host's steal,
    # summed over every core
    window_s: float = 0.0
    server_cpu_s: float | None = None
    # a proxy's in front of the server (HAProxy terminating TLS), read apart from the
    # server's over the same window (None: no proxy)
    proxy_cpu_s: float | None = None
    others_cpu_s: float | None = None
    steal_s: float | None = None
    # acks received during the step (the chat server's N+1th frame per send; one for a
    # send made just before the step may arrive in it)
    acks: int = 0
    # the delivered message frames' bytes as they came off the wire (websocket header and
    # payload, compressed where deflate was negotiated), over ``wire_deliveries`` of them
    # (every delivery the step read, those after their own step's drain too)
    wire_bytes: int = 0
    wire_deliveries: int = 0
    # the server's own cores over the same window (None: not read, or the server was not
    # pinned): what else ran there (every process but the server and the other servers
    # that shared them, idle meanwhile, by its own run time: bench.lab.machine.cpu_split),
    # their steal, and those idle servers' CPU (a paired cost phase: bench.lab.pairs)
    server_core_others_s: float | None = None
    server_core_steal_s: float | None = None
    idle_cpu_s: float | None = None
    # results saved before the lab counted the core process by process: the core's
    # tick-sampled busy seconds (/proc/stat), less the server's and the idle servers'
    server_core_busy_s: float | None = None
    # a paired cost step's round (its place in the A B B A order; None: not paired), and
    # whether this step is a climb step measured again because its server's core was busy
    pair_round: int | None = None
    busy_rerun: bool = False

    @property
    def wire_bytes_per_delivery(self) -> float | None:
        """Bytes on the wire per delivered message (None: nothing delivered, or results
        written before the driver counted them)."""
        return self.wire_bytes / self.wire_deliveries if self.wire_deliveries else None

    @property
    def server_us_per_frame(self) -> float | None:
        """The server's CPU µs per delivered ``message`` frame over the step's window
        (acks are not frames delivered: the chat server writes N+1 frames per send, a
        relay N); None when the window's CPU was not read or nothing was delivered."""
        if self.server_cpu_s is None or self.delivered <= 0 or self.window_s <= 0:
            return None
        return self.server_cpu_s * 1e6 / self.delivered

    @property
    def proxy_us_per_frame(self) -> float | None:
        """The proxy's CPU µs per delivered ``message`` frame over the step's window (None:
        no proxy, or nothing delivered)."""
        if self.proxy_cpu_s is None or self.delivered <= 0 or self.window_s <= 0:
            return None
        return self.proxy_cpu_s * 1e6 / self.delivered

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Step:
        """A step from its JSON form."""
        data = _known(cls, data)
        data["timeline"] = [TimePoint(**_known(TimePoint, p)) for p in data.get("timeline", [])]
        return cls(**data)

    def holds(self, slo_ms: dict[str, float]) -> bool:
        """True when every percentile named in ``slo_ms`` is under its bound and none was lost."""
        if self.sent == 0 or self.delivered < self.expected:
            return False
        return all(self.latency_ms.get(k, float("inf")) < v for k, v in slo_ms.items())


def parse_slo(text: str) -> dict[str, float]:
    """``p99=100,p95=50`` → ``{"p99": 100.0, "p95": 50.0}``; ValueError names a bad item."""
    slo: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in PERCENTILES:
            raise ValueError(f"bad SLO item {item!r} (e.g. p99=100)")
        try:
            slo[key] = float(value)
        except ValueError:
            raise ValueError(f"bad SLO item {item!r}: the bound must be a number") from None
        if not slo[key] > 0:
            raise ValueError(f"bad SLO item {item!r}: the bound must be positive")
    if not slo:
        raise ValueError("empty SLO (e.g. p99=100)")
    return slo


#: a second is a stall when its p99 passes this many times the median of the step's
#: per-second p99s (or when it delivered nothing while the step was sending)
STALL_FACTOR = 10.0


def stalled_points(points: list[TimePoint]) -> list[TimePoint]:
    """The seconds of a step's send phase that stalled: p99 above :data:`STALL_FACTOR` x the
    median of the step's per-second p99s, or no delivery at all."""
    p99s = sorted(p.p99_ms for p in points if p.p99_ms is not None and p.delivered_per_s > 0)
    if not p99s:
        return list(points)
    middle = len(p99s) // 2
    median = p99s[middle] if len(p99s) % 2 else (p99s[middle - 1] + p99s[middle]) / 2
    return [
        p
        for p in points
        if p.delivered_per_s <= 0 or p.p99_ms is None or p.p99_ms > STALL_FACTOR * median
    ]


@dataclass
class Sample:
    """One psutil sample of a process tree: CPU in percent of one core, RSS in bytes."""

    t_s: float
    cpu_percent: float
    rss_bytes: int


@dataclass
class HostSample:
    """The machine around the processes under test, over one sampling interval: other
    processes' CPU (percent of one core: everything busy minus the lab's own process
    tree) and the host's steal (milliseconds per second, summed over cores)."""

    t_s: float
    others_percent: float
    steal_ms_per_s: float


@dataclass
class KneeStep:
    """One step of a climb as its knee names it."""

    offered_per_s: float | None
    delivered_per_s: float
    p99_ms: float
    holds: bool
    generator_limited: bool = False


@dataclass
class Knee:
    """What one climb found (:func:`edge`): the highest delivered/s that held the SLO, the
    step that broke, whether the knee is only a lower bound, and the shape it was
    measured at."""

    config: str
    capacity_delivered_per_s: float = 0
    capacity_sent_per_s: float = 0
    capacity_offered_per_s: float | None = None
    p99_ms_at_capacity: float | None = None
    first_break_offered_per_s: float | None = None
    first_break_p99_ms: float | None = None
    generator_limited_at_edge: bool = False
    # nothing broke, or the driver explains the break: the knee lies higher
    lower_bound: bool = False
    # ... because the fast driver itself was the limit
    driver_limited: bool = False
    steps: list[KneeStep] = field(default_factory=list)
    reruns: int = 0  # steps run again because they stalled
    stalled_steps: int = 0
    busy_reruns: int = 0  # steps run again because the server's core was busy
    connections: int = 0
    room_size: int = 0
    body_chars: int = 0
    frame_bytes: int = 0
    deflate: bool = False
    deflate_params: str = ""  # the server's Sec-WebSocket-Extensions reply
    status: str = "ok"
    error: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Knee:
        """A knee from its JSON form (one saved before ``driver_limited`` was recorded
        takes ``generator_limited_at_edge`` for it)."""
        known = _known(cls, data)
        known.setdefault("driver_limited", bool(data.get("generator_limited_at_edge")))
        known["steps"] = [KneeStep(**_known(KneeStep, s)) for s in data.get("steps", [])]
        return cls(**known)


@dataclass
class Run:
    """One configuration, started once: its settings, what each driver measured, its samples."""

    config: str  # the configuration's name in the matrix
    repeat: int  # 0-based: which repetition this is
    target: str  # "chat" | "relay"
    env: dict[str, str]  # the server's toggles as given (the .env names)
    server_cores: list[int] = field(default_factory=list)
    generator_cores: list[int] = field(default_factory=list)
    started_s: float = 0.0  # since the lab run started
    steps: list[Step] = field(default_factory=list)
    # sample series keyed "server", "generator" (and "auth" when it ran)
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    # the machine around them, sampled with them through the whole run
    host: list[HostSample] = field(default_factory=list)
    # the server's own counters (Prometheus scrape): name -> value, at the end of the run
    metrics: dict[str, float] = field(default_factory=dict)
    # the same scraped about once a second while the run was driven, each with ``t_s`` (on
    # the samples' clock): what the server's GC, loop lag and commits did second by second
    metric_series: list[dict[str, float]] = field(default_factory=list)
    # the server's notable tail events over the run (its ``/stats`` ``tail`` read at the
    # end), each ``{"kind": "gc" | "loop_lag" | "commit" | "checkpoint", "t_s": <samples'
    # clock>, "ms": <duration>, ...}`` (gc events also carry ``generation``): what the
    # report names as the likely cause of a stalled second
    tail_events: list[dict[str, Any]] = field(default_factory=list)
    # a climb's result as measured (:func:`edge`): the knee, the step that broke, whether
    # the driver limited the edge; None for fixed-rate runs
    knee: Knee | None = None
    profiles: list[str] = field(default_factory=list)  # snapshot paths, relative to the report
    # measured after the run on a server of its own (bench.lab.side): bytes on the wire
    # per delivered message, a row per body set (bench.wire's rows), and memory per
    # connection, a row per traffic mode (bench.memory's); why not, where they were not
    wire: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    side_skipped: str = ""
    status: str = "ok"  # "ok" | "failed" | "interrupted"
    error: str = ""
    # where the run's TLS was (bench.lab.matrix.TLS_MODES): off, in the server, at a proxy
    tls: str = "off"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Run:
        """A run from its JSON form."""
        data = _known(cls, data)
        data["steps"] = [Step.from_dict(s) for s in data.get("steps", [])]
        data["samples"] = {
            k: [Sample(**_known(Sample, s)) for s in v] for k, v in data.get("samples", {}).items()
        }
        data["host"] = [HostSample(**_known(HostSample, h)) for h in data.get("host", [])]
        data["knee"] = Knee.from_dict(data["knee"]) if data.get("knee") else None
        return cls(**data)


@dataclass
class Results:
    """A whole lab run: the matrix, the machine, and every run in the order it happened."""

    matrix: str
    started: str  # ISO 8601 local time
    command: str  # the command line that produced it
    baseline: str  # the configuration every ratio is taken against
    aa_pair: list[str]  # two configuration names with identical settings: the noise floor
    repeat: int
    machine: dict[str, Any] = field(default_factory=dict)  # cores, python, versions
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> description
    runs: list[Run] = field(default_factory=list)
    # driver name -> its ceiling step against a trivial relay (frames/s it can receive)
    ceilings: dict[str, Step] = field(default_factory=dict)
    capacity: dict[str, Any] = field(default_factory=dict)  # `lab capacity` output
    # the paired cost phase (bench.lab.pairs): one run per configuration that shared the
    # server's core with the others, its cost steps in A B B A order (Step.pair_round)
    paired: list[Run] = field(default_factory=list)
    # what `lab scaling` measured beside the drivers' steps, per repeat (argon2 logins per
    # CPU-second, bytes per idle connection), and the configurations it skipped, with why
    parts: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False
    duration_s: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Results:
        """Results from their JSON form."""
        data = _known(cls, data)
        data["runs"] = [Run.from_dict(r) for r in data.get("runs", [])]
        data["paired"] = [Run.from_dict(r) for r in data.get("paired", [])]
        data["ceilings"] = {k: Step.from_dict(v) for k, v in data.get("ceilings", {}).items()}
        return cls(**data)

    @classmethod
    def load(cls, path: Path) -> Results:
        """Read ``results.json``."""
        return cls.from_dict(json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        """Write ``results.json`` (atomically: a reader never sees half a file)."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)


def climbed_steps(run: Run) -> list[Step]:
    """The steps of ``run``'s climb: the fast driver's, less a step the climb ran again
    (``superseded``), its cost steps and its sustained step."""
    return [
        s
        for s in run.steps
        if s.driver == "fast" and not s.superseded and not s.cost and not s.sustain
    ]


def edge(run: Run, slo_ms: dict[str, float], room_size: int = 0) -> Knee:
    """What a climb found under ``slo_ms``: the highest delivered rate that held, the step
    that broke, and the shape it was measured at (:func:`climbed_steps` only)."""
    climbed = climbed_steps(run)
    held = [s for s in climbed if s.holds(slo_ms)]
    broken = [s for s in climbed if not s.holds(slo_ms)]
    best = max(held, key=lambda s: s.delivered_per_s, default=None)
    first_break = min(broken, key=lambda s: s.offered_per_s or 0, default=None)
    break_by_driver = first_break is not None and (
        first_break.generator_saturated
        or (
            first_break.generator_limited
            and all(
                first_break.latency_ms.get(k, 0.0) - first_break.max_send_lag_ms < v
                for k, v in slo_ms.items()
            )
            and first_break.delivered >= first_break.expected
        )
    )
    first = climbed[0] if climbed else None
    return Knee(
        config=run.config,
        capacity_delivered_per_s=round(best.delivered_per_s) if best else 0,
        capacity_sent_per_s=round(best.sent_per_s) if best else 0,
        capacity_offered_per_s=best.offered_per_s if best else None,
        p99_ms_at_capacity=best.latency_ms["p99"] if best else None,
        first_break_offered_per_s=first_break.offered_per_s if first_break else None,
        first_break_p99_ms=first_break.latency_ms["p99"] if first_break else None,
        generator_limited_at_edge=bool(
            (first_break and first_break.generator_limited) or (best and best.generator_limited)
        ),
        # the knee is only a lower bound when nothing broke, or the driver explains the
        # break: it was saturated, or its own send lag alone could have broken the SLO
        lower_bound=first_break is None or break_by_driver,
        driver_limited=break_by_driver
        or bool(first_break is None and best is not None and best.generator_saturated),
        steps=[
            KneeStep(
                offered_per_s=s.offered_per_s,
                delivered_per_s=round(s.delivered_per_s),
                p99_ms=s.latency_ms["p99"],
                holds=s.holds(slo_ms),
                generator_limited=s.generator_limited,
            )
            for s in sorted(climbed, key=lambda s: s.offered_per_s or 0)
        ],
        reruns=sum(1 for s in climbed if s.rerun),
        busy_reruns=sum(1 for s in run.steps if s.busy_rerun),
        stalled_steps=sum(
            1
            for s in run.steps
            if s.driver == "fast" and not s.cost and not s.sustain and s.stall_s
        ),
        connections=first.connections if first else 0,
        room_size=room_size,
        body_chars=first.body_chars if first else 0,
        frame_bytes=first.frame_bytes if first else 0,
        deflate=bool(first and first.deflate),
        deflate_params=first.deflate_params if first else "",
        status=run.status,
        error=run.error,
    )
