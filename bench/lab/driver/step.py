"""What one step measured, the generator-limited verdict on it, and its summary line."""

from __future__ import annotations

from collections import Counter

from bench.lab.driver.latency import LatencyHistogram
from bench.lab.results import Step, TimePoint, stalled_points

#: a send that left this much after its scheduled time is a late send
LATE_NS = 1_000_000
#: generator-limited rules: CPU of one core, share of sends behind by BEHIND_NS, max lag
CPU_LIMIT_PERCENT = 90.0
BEHIND_NS = 5_000_000
BEHIND_SHARE = 0.01
MAX_LAG_LIMIT_MS = 50.0
#: ... or share of the send phase the driver spent runnable but waiting for its core
RUNQ_WAIT_LIMIT = 0.10


class StepRecorder:
    """What one step measured so far; :meth:`result` makes it a :class:`Step`."""

    def __init__(self, name: str, rate: float, duration_s: float, connections: int) -> None:
        self.name = name
        self.started_s: float | None = None
        self.rate = rate
        self.duration_s = duration_s
        self.connections = connections
        self.start_ns = 0
        self.end_ns = 0
        self.sent = 0
        self.sent_at_point = 0
        self.expected = 0
        self.late_sends = 0
        self.behind_sends = 0
        self.max_lag_ns = 0
        self.delivered = 0
        # bytes off the wire of every delivery flushed into this step (header and payload)
        # and how many deliveries they were (those after their step's drain too)
        self.wire_bytes = 0
        self.wire_deliveries = 0
        self.errors: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()  # --retry: what was sent again, and why
        self.latency = LatencyHistogram()
        self.point_latency = LatencyHistogram()  # since the last timeline point
        self.ack_latency = LatencyHistogram()
        self.timeline: list[TimePoint] = []
        self.cpu_percent: float | None = None
        # its cores' busy share over the send phase (its own work and the kernel's there)
        self.core_busy_percent: float | None = None
        self.runq_wait_share: float | None = None  # of the send phase (Linux schedstat)
        self.gc_runs = 0  # collections of the driver's own GC from start to end of drain
        self.send_points = 0  # timeline points of the send phase (the rest are its drain)
        self.cost = False  # a cost step (Step.cost)
        self.sustain = False  # a sustained step after a climb (Step.sustain)
        # the send phase's window: its seconds, the server's CPU seconds, other processes'
        # and the host's steal (None: not read)
        self.window_s = 0.0
        self.server_cpu_s: float | None = None
        self.proxy_cpu_s: float | None = None  # a proxy's in front of the server
        self.others_cpu_s: float | None = None
        self.steal_s: float | None = None
        # the server's own cores over the same window, and its idle neighbours' CPU there
        self.server_core_others_s: float | None = None
        self.server_core_steal_s: float | None = None
        self.idle_cpu_s: float | None = None
        self.pair_round: int | None = None  # a paired cost step's round (Step.pair_round)

    def result(self) -> Step:
        """The step as the results model has it, with the generator-limited verdict."""
        notes = []
        saturated = False
        if self.cpu_percent is not None and self.cpu_percent > CPU_LIMIT_PERCENT:
            notes.append(f"driver CPU {self.cpu_percent:.0f}% of one core > {CPU_LIMIT_PERCENT:g}%")
            saturated = True
        if self.sent and self.behind_sends > BEHIND_SHARE * self.sent:
            notes.append(
                f"{self.behind_sends} of {self.sent} sends left > {BEHIND_NS / 1e6:g} ms late"
                f" (> {BEHIND_SHARE:.0%})"
            )
        max_lag_ms = self.max_lag_ns / 1e6
        if max_lag_ms > MAX_LAG_LIMIT_MS:
            notes.append(f"max send lag {max_lag_ms:.1f} ms > {MAX_LAG_LIMIT_MS:g} ms")
        if self.runq_wait_share is not None and self.runq_wait_share > RUNQ_WAIT_LIMIT:
            saturated = True
            notes.append(
                f"driver waited for its core {self.runq_wait_share:.0%} of the time"
                f" (> {RUNQ_WAIT_LIMIT:.0%}): something else ran there"
            )
        return Step(
            driver="fast",
            name=self.name,
            connections=self.connections,
            offered_per_s=self.rate,
            duration_s=self.duration_s,
            sent=self.sent,
            delivered=self.delivered,
            expected=self.expected,
            sent_per_s=round(self.sent / self.duration_s, 1),
            delivered_per_s=round(self.delivered / self.duration_s, 1),
            latency_ms=self.latency.percentiles_ms(),
            errors=sum(n for k, n in self.errors.items() if k != "after_drain"),
            error_detail=dict(self.errors),
            retries=dict(self.retries),
            late_sends=self.late_sends,
            max_send_lag_ms=round(max_lag_ms, 3),
            generator_cpu_percent=(
                None if self.cpu_percent is None else round(self.cpu_percent, 1)
            ),
            generator_limited=bool(notes),
            generator_saturated=saturated,
            generator_gc_runs=self.gc_runs,
            generator_notes=notes,
            timeline=self.timeline,
            histogram=self.latency.encoded(),
            ack_latency_ms=self.ack_latency.percentiles_ms(),
            started_s=self.started_s,
            stall_s=[p.t_s for p in stalled_points(self.timeline[: self.send_points])],
            cost=self.cost,
            sustain=self.sustain,
            generator_core_busy_percent=(
                None if self.core_busy_percent is None else round(self.core_busy_percent, 1)
            ),
            window_s=round(self.window_s, 4),
            server_cpu_s=None if self.server_cpu_s is None else round(self.server_cpu_s, 4),
            proxy_cpu_s=_rounded(self.proxy_cpu_s),
            others_cpu_s=None if self.others_cpu_s is None else round(self.others_cpu_s, 4),
            steal_s=None if self.steal_s is None else round(self.steal_s, 4),
            server_core_others_s=_rounded(self.server_core_others_s),
            server_core_steal_s=_rounded(self.server_core_steal_s),
            idle_cpu_s=_rounded(self.idle_cpu_s),
            pair_round=self.pair_round,
            acks=self.ack_latency.count,
            wire_bytes=self.wire_bytes,
            wire_deliveries=self.wire_deliveries,
        )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def summary_line(step: Step) -> str:
    """One human line for a finished step."""
    lat = step.latency_ms
    latency = (
        f"p50 {lat['p50']:.1f} p99 {lat['p99']:.1f} max {lat['max']:.1f} ms" if lat else "no data"
    )
    line = (
        f"{step.name}: sent {step.sent} ({step.sent_per_s:.0f}/s), delivered {step.delivered}"
        f" of {step.expected} ({step.delivered_per_s:.0f}/s), {latency}, errors {step.errors},"
        f" late sends {step.late_sends} (max lag {step.max_send_lag_ms:.1f} ms),"
        f" cpu {step.generator_cpu_percent or 0:.0f}%"
    )
    if step.server_us_per_frame is not None:
        line += f", server {step.server_us_per_frame:.1f} µs/frame"
    if step.proxy_us_per_frame is not None:
        line += f", proxy {step.proxy_us_per_frame:.1f} µs/frame"
    if step.wire_bytes_per_delivery is not None:
        line += f", {step.wire_bytes_per_delivery:.1f} wire bytes/delivery"
    if step.generator_gc_runs:
        line += f", the driver's GC ran {step.generator_gc_runs} times in the step"
    if step.generator_limited:
        line += " GENERATOR-LIMITED: " + "; ".join(step.generator_notes)
    return line


def runq_wait_ns() -> int | None:
    """Nanoseconds this thread has waited, runnable, for a CPU (None where Linux does not say)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
