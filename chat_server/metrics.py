"""Prometheus metrics on ``CHAT_HOST:METRICS_PORT/metrics`` (``METRICS_PORT=0``: off).

The per-message path only bumps plain integers (frames in and out, errors by code,
ack-latency buckets), whatever ``WORKERS`` is. One process (``WORKERS=1``) turns
them into Prometheus families at scrape time with a custom collector
(:class:`ChatCollector`, served by :class:`MetricsServer` on the event loop), so a
scrape sees one consistent snapshot and the hot path never takes prometheus_client's
locks.

With ``WORKERS`` above 1 the supervisor serves ``METRICS_PORT``
(:class:`WorkersMetricsServer`) from prometheus_client's multiprocess mode: each
worker copies its plain counters into its files every :data:`PUBLISH_INTERVAL_S`
(:class:`MetricsPublisher`), the supervisor sums the files at scrape time. Names,
help, types and labels are the same either way, so one dashboard reads both.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, Protocol

import psutil
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.samples import Sample
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from chat_server.errors import ErrorCode
from chat_server.overload import LoadShedder
from chat_server.store.base import REFUSAL_REASONS
from chat_server.tail import (
    COMMIT_BUCKETS_S,
    PAUSE_BUCKETS_S,
    GcWatch,
    LoopLagTicker,
    PlainHistogram,
)
from chatlab.supervision import RESTART, supervisor

if TYPE_CHECKING:
    from chat_server.auth import JwksKeys

log = logging.getLogger("chat_server.metrics")

#: upper bounds (ms) of the ack-latency histogram: accept -> ack sent
ACK_LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
#: how often a worker (``WORKERS`` > 1) copies its counters for the supervisor to serve
PUBLISH_INTERVAL_S: Final = 1.0
#: the Prometheus text format, whichever process answers the scrape
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# (name, help) of each family, the same whichever process serves it
CONNECTIONS = ("chat_connections", "open websocket connections")
ROOMS = ("chat_rooms", "rooms with members in this process")
FRAMES_IN = ("chat_frames_in", "frames received from clients")
FRAMES_OUT = ("chat_frames_out", "frames written to clients")
ERRORS = ("chat_errors", "error frames sent, by code")
OUTBOUND_BYTES = (
    "chat_outbound_buffer_bytes",
    "bytes the server holds for its connections (transport write buffers)",
)
SLOW_CONSUMER_CLOSES = ("chat_slow_consumer_closes", "connections closed with 1013 slow consumer")
ADDRESS_REFUSALS = (
    "chat_address_refusals",
    "upgrades answered 503 because their client address held MAX_CONNECTIONS_PER_ADDRESS",
)
ACK_LATENCY_MS = (
    "chat_ack_latency_ms",
    "from accepting a send to sending its ack (durable), in ms",
)
BATCH_SIZE = (
    "chat_group_commit_batch_size",
    "messages per group commit (bucket k holds sizes below 2k)",
)
DELIVERY_LATENCY_MS = (
    "chat_delivery_latency_ms",
    "from accepting a send to handing its message to the room's members' connections here"
    " (once per broadcast, when its commit is reported or the broker delivers it; the"
    " writes follow at the end of that loop iteration), in ms",
)
GC_PAUSE = ("chat_gc_pause_seconds", "cyclic garbage collection pauses, by generation")
GC_PAUSE_MAX = (
    "chat_gc_pause_max_seconds",
    "the longest cyclic garbage collection pause since start, by generation",
)
LOOP_LAG = ("chat_loop_lag_seconds", "how late a 10 ms ticker on the event loop ran")
LOOP_LAG_MAX = ("chat_loop_lag_max_seconds", "the latest the 10 ms ticker ran since start")
COMMIT_SECONDS = ("chat_commit_seconds", "history store group commits: transaction time")
OVERLOAD_SHEDDING = (
    "chat_overload_shedding",
    "1 while the process refuses new sends because its event loop is behind"
    " (OVERLOAD_LAG_MS for OVERLOAD_INTERVAL_MS); with WORKERS, how many do",
)
OVERLOAD_REFUSED = (
    "chat_overload_refused",
    "sends answered unavailable because the event loop was behind (not stored)",
)
OVERLOAD_EPISODES = (
    "chat_overload_episodes",
    "times the process began refusing sends because its event loop was behind",
)
STORE_QUEUE_DEPTH = (
    "chat_store_queue_depth",
    "messages accepted and waiting for their group commit",
)
STORE_REFUSED = (
    "chat_store_refused",
    "sends the history store refused before storing them (answered unavailable), by reason:"
    " queue_full (STORE_QUEUE_MAX), wal_full (a blocked checkpoint), node_unreachable,"
    " node_short_of_replicas, no_node (Redis), closed",
)
# the Redis history store's (BROKER=redis)
SHORT_OF_REPLICAS = (
    "chat_redis_primaries_short_of_replicas",
    "Redis primaries whose last commit was confirmed on fewer replicas than"
    " REDIS_ACK_REPLICAS asks: their rooms' sends are answered unavailable until they have them",
)
UNREACHABLE_PRIMARIES = (
    "chat_redis_primaries_unreachable",
    "Redis primaries this process takes for unreachable (a commit or read unanswered in time,"
    " a connection refused): their rooms' sends are answered unavailable until a probe finds"
    " them back",
)
NODE_BUSY = (
    "chat_redis_node_busy",
    "requests answered unavailable because their Redis node had REDIS_NODE_CONNECTIONS of"
    " this process's requests in flight for the whole REDIS_POOL_WAIT_S",
)
# the SQLite history store's (one process: WORKERS > 1 keeps history in Redis)
WAL_FILE_BYTES = (
    "chat_wal_file_bytes",
    "the SQLite history store's WAL file size, as its checkpointer last saw it (every 0.25 s)",
)
WAL_RESTARTS = (
    "chat_wal_restarts",
    "times the SQLite history store's checkpointer restarted the WAL (holding the commits)",
)
WAL_RESTART_HOLD = (
    "chat_wal_restart_hold_seconds",
    "how long the SQLite history store's checkpointer held the commits to restart the WAL",
)
# the process's background work and keys (chatlab.supervision, chat_server.auth)
TASK_FAILURES = (
    "chat_task_failures",
    "background tasks and threads that ended by an exception, by task (each is restarted,"
    " or stops the process, or was one request's work: chatlab.supervision)",
)
JWKS_AGE = (
    "chat_jwks_age_seconds",
    "seconds since the JWK set was last refreshed (JWT_JWKS_URL set; else absent)",
)
JWKS_MAX_AGE = (
    "chat_jwks_max_age_seconds",
    "JWKS_MAX_AGE_S: age past which the JWK set is stale (its keys are still accepted)",
)
# prometheus_client's ProcessCollector families (one process); workers publish the same
PROCESS_CPU = ("process_cpu_seconds", "Total user and system CPU time spent in seconds.")
PROCESS_GAUGES = (
    ("process_virtual_memory_bytes", "Virtual memory size in bytes.", "livesum"),
    ("process_resident_memory_bytes", "Resident memory size in bytes.", "livesum"),
    ("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "min"),
    ("process_open_fds", "Number of open file descriptors.", "livesum"),
    ("process_max_fds", "Maximum number of open file descriptors.", "livemax"),
)


class Counters:
    """Plain counters the server bumps on its hot path; read by the collector.

    Besides frames and ack latency: the delivery latency (accept to write, per
    broadcast), the history store's commit times (observed by whichever thread
    commits), and the process' tail view (:mod:`chat_server.tail`): GC pauses and
    event-loop lag, once :meth:`start_tail` ran.
    """

    __slots__ = (
        "ack_latency",
        "commit_seconds",
        "delivery_latency",
        "frames_in",
        "gc",
        "loop_lag",
        "overload",
    )

    def __init__(self, overload: LoadShedder | None = None) -> None:
        self.frames_in = 0
        self.ack_latency = PlainHistogram(ACK_LATENCY_BUCKETS_MS)
        self.delivery_latency = PlainHistogram(ACK_LATENCY_BUCKETS_MS)
        self.commit_seconds = PlainHistogram(COMMIT_BUCKETS_S)
        self.gc = GcWatch()
        self.loop_lag = LoopLagTicker()
        #: the load shedder (:mod:`chat_server.overload`; none given: one that never sheds)
        self.overload = overload or LoadShedder(0.0, 0.0)

    def tail_summary(self) -> dict[str, Any]:
        """GC pauses, loop lag, commit times and delivery latency in brief, for ``/stats``."""
        return {
            "gc": self.gc.summary(),
            "loop_lag": {
                **self.loop_lag.lag.summary(),
                "notable": [
                    {"at": round(at, 3), "lag_s": round(lag, 6)}
                    for at, lag in self.loop_lag.notable
                ],
            },
            "commit": self.commit_seconds.summary(),
            "overload": {
                "shedding": self.overload.shedding,
                "refused": self.overload.refused,
                "episodes": self.overload.episodes,
                "lag_ms": round(self.overload.target_s * 1e3),
                "interval_ms": round(self.overload.interval_s * 1e3),
            },
        }


class ChatCollector:
    """Builds the metric families from the server's state at scrape time."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        counters: Counters,
        jwks: JwksKeys | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._counters = counters
        self._jwks = jwks

    def collect(self) -> Iterator[Metric]:
        """Yield every family (called by the registry on each scrape)."""
        state = self._snapshot()
        yield GaugeMetricFamily(*CONNECTIONS, value=state["connections"])
        yield GaugeMetricFamily(*ROOMS, value=state["rooms"])
        yield CounterMetricFamily(*FRAMES_IN, value=self._counters.frames_in)
        yield CounterMetricFamily(*FRAMES_OUT, value=state["frames_out"])
        errors = CounterMetricFamily(*ERRORS, labels=["code"])
        counted = state["errors"]
        for code in sorted({*ALL_ERROR_CODES, *counted}):
            errors.add_metric([code], counted.get(code, 0))
        yield errors
        yield GaugeMetricFamily(*OUTBOUND_BYTES, value=state["outbound_bytes"])
        yield CounterMetricFamily(*SLOW_CONSUMER_CLOSES, value=state["slow_consumer_closes"])
        yield CounterMetricFamily(*ADDRESS_REFUSALS, value=state["address_refusals"])
        yield _plain_histogram(*ACK_LATENCY_MS, self._counters.ack_latency)
        store = state["store"]
        sizes = store["batch_sizes"]  # power of two k -> batches of size [k, 2k)
        bounds = sorted(sizes)
        yield _histogram(
            *BATCH_SIZE,
            tuple(2 * k - 1 for k in bounds),
            [sizes[k] for k in bounds] + [0],
            float(store["messages_committed"] + store["messages_failed"]),
        )
        counters = self._counters
        yield _plain_histogram(*DELIVERY_LATENCY_MS, counters.delivery_latency)
        yield _plain_histogram(*COMMIT_SECONDS, counters.commit_seconds)
        yield _plain_histogram(*LOOP_LAG, counters.loop_lag.lag)
        gc_pauses = HistogramMetricFamily(*GC_PAUSE, labels=["generation"])
        for generation, histogram in counters.gc.pauses.items():
            gc_pauses.add_metric(
                [str(generation)], _buckets(histogram.bounds, histogram.counts), histogram.sum
            )
        yield gc_pauses
        longest = GaugeMetricFamily(*GC_PAUSE_MAX, labels=["generation"])
        for generation, histogram in counters.gc.pauses.items():
            longest.add_metric([str(generation)], histogram.max)
        yield longest
        yield GaugeMetricFamily(*LOOP_LAG_MAX, value=counters.loop_lag.lag.max)
        overload = counters.overload
        yield GaugeMetricFamily(*OVERLOAD_SHEDDING, value=int(overload.shedding))
        yield CounterMetricFamily(*OVERLOAD_REFUSED, value=overload.refused)
        yield CounterMetricFamily(*OVERLOAD_EPISODES, value=overload.episodes)
        yield GaugeMetricFamily(*STORE_QUEUE_DEPTH, value=store["queue_depth"])
        refused = CounterMetricFamily(*STORE_REFUSED, labels=["reason"])
        for reason in REFUSAL_REASONS:  # every reason from start, at zero
            refused.add_metric([reason], store["refused"].get(reason, 0))
        yield refused
        if store.get("primaries_short_of_replicas") is not None:
            yield GaugeMetricFamily(*SHORT_OF_REPLICAS, value=store["primaries_short_of_replicas"])
        if store.get("primaries_unreachable") is not None:
            yield GaugeMetricFamily(*UNREACHABLE_PRIMARIES, value=store["primaries_unreachable"])
        if store.get("node_busy_refusals") is not None:
            yield CounterMetricFamily(*NODE_BUSY, value=store["node_busy_refusals"])
        if supervisor().failures:  # from the first failure on, as the workers' files show it
            failures = CounterMetricFamily(*TASK_FAILURES, labels=["task"])
            for task, count in sorted(supervisor().failures.items()):
                failures.add_metric([task], count)
            yield failures
        if self._jwks is not None:
            yield GaugeMetricFamily(*JWKS_AGE, value=self._jwks.age_s())
            yield GaugeMetricFamily(*JWKS_MAX_AGE, value=self._jwks.max_age_s)
        if store.get("wal_file_bytes") is not None:
            yield GaugeMetricFamily(*WAL_FILE_BYTES, value=store["wal_file_bytes"])
            yield CounterMetricFamily(*WAL_RESTARTS, value=store["wal_restarts"])
            yield _histogram(
                *WAL_RESTART_HOLD,
                COMMIT_BUCKETS_S,
                store["restart_hold_counts"],
                store["restart_hold_sum_s"],
            )


#: every error code the contract defines: each is exposed from start, at 0 until it happens
ALL_ERROR_CODES: Final = tuple(code.value for code in ErrorCode)


def _buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs, ``+Inf`` last, from per-bucket counts."""
    cumulative = 0
    buckets = []
    for bound, count in zip(bounds, counts, strict=False):
        cumulative += count
        buckets.append((str(bound), cumulative))
    cumulative += counts[len(bounds)] if len(counts) > len(bounds) else 0
    buckets.append(("+Inf", cumulative))
    return buckets


def _histogram(
    name: str, doc: str, bounds: tuple[float, ...], counts: list[int], total: float
) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=_buckets(bounds, counts), sum_value=total)


def _plain_histogram(name: str, doc: str, histogram: PlainHistogram) -> HistogramMetricFamily:
    return _histogram(name, doc, histogram.bounds, histogram.counts, histogram.sum)


class MetricsServer:
    """``GET /metrics`` on its own port, served on the event loop by websockets' HTTP path."""

    def __init__(self, host: str, port: int, collector: ChatCollector) -> None:
        self.host = host
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)  # type: ignore[arg-type]
        # process_cpu_seconds_total, resident memory, open fds: prometheus_client's own
        ProcessCollector(registry=self.registry)
        self._server: Server | None = None

    async def start(self) -> None:
        """Listen; OSError if the port cannot be bound."""
        self._server = await serve(
            _never_called, self.host, self.port, process_request=self._respond, compression=None
        )

    def _respond(self, connection: ServerConnection, request: Request) -> Response:
        if request.path.split("?")[0] != "/metrics":
            return connection.respond(HTTPStatus.NOT_FOUND, "not found: try /metrics\n")
        response = connection.respond(HTTPStatus.OK, generate_latest(self.registry).decode())
        # websockets' Headers append on assignment: replace, do not add a second one
        del response.headers["Content-Type"]
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    async def close(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def _never_called(connection: ServerConnection) -> None:  # pragma: no cover
    await connection.close()


# ---- WORKERS > 1: workers publish, the supervisor serves ---------------------------------


class _Incrementable(Protocol):
    def inc(self, amount: float) -> None: ...


class MetricsPublisher:
    """A worker's metrics with ``WORKERS`` > 1: its plain counters copied into
    prometheus_client's multiprocess files for the supervisor to serve.

    Every ``interval_s``, and a last time at :meth:`close`, each counter grows by
    what the worker counted since the previous copy, each gauge is set (mode
    ``livesum``: the supervisor sums the live workers'), each histogram bucket grows
    by its own count. Only this copy writes the files, never the per-message path.
    The process must have ``PROMETHEUS_MULTIPROC_DIR`` in its environment from its
    start (the supervisor puts it there); a worker killed loses at most the counts
    of its last interval.
    """

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        counters: Counters,
        batch_max: int,
        interval_s: float = PUBLISH_INTERVAL_S,
        jwks: JwksKeys | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._counters = counters
        self._jwks = jwks
        self._task_failures = Counter(*TASK_FAILURES, ["task"], registry=None)
        # every worker refreshes its own set: the oldest is the one to alert on (created
        # only with a set: a gauge's file holds a sample from its creation)
        self._jwks_gauges = (
            None
            if jwks is None
            else (
                Gauge(*JWKS_AGE, registry=None, multiprocess_mode="livemax"),
                Gauge(*JWKS_MAX_AGE, registry=None, multiprocess_mode="livemax"),
            )
        )
        self._interval_s = interval_s
        # registry=None: the files are the output, nothing here is scraped
        self._connections = Gauge(*CONNECTIONS, registry=None, multiprocess_mode="livesum")
        self._rooms = Gauge(*ROOMS, registry=None, multiprocess_mode="livesum")
        self._outbound_bytes = Gauge(*OUTBOUND_BYTES, registry=None, multiprocess_mode="livesum")
        self._frames_in = Counter(*FRAMES_IN, registry=None)
        self._frames_out = Counter(*FRAMES_OUT, registry=None)
        self._errors = Counter(*ERRORS, ["code"], registry=None)
        for code in ALL_ERROR_CODES:  # every code from start, at zero, as with one process
            self._errors.labels(code)
        self._slow_consumer_closes = Counter(*SLOW_CONSUMER_CLOSES, registry=None)
        self._address_refusals = Counter(*ADDRESS_REFUSALS, registry=None)
        self._ack_latency = Histogram(
            *ACK_LATENCY_MS, registry=None, buckets=ACK_LATENCY_BUCKETS_MS
        )
        self._batch_bounds = batch_size_bounds(batch_max)
        self._batch_size = Histogram(*BATCH_SIZE, registry=None, buckets=self._batch_bounds)
        self._delivery_latency = Histogram(
            *DELIVERY_LATENCY_MS, registry=None, buckets=ACK_LATENCY_BUCKETS_MS
        )
        self._commit_seconds = Histogram(*COMMIT_SECONDS, registry=None, buckets=COMMIT_BUCKETS_S)
        self._loop_lag = Histogram(*LOOP_LAG, registry=None, buckets=PAUSE_BUCKETS_S)
        self._gc_pause = Histogram(
            *GC_PAUSE, ["generation"], registry=None, buckets=PAUSE_BUCKETS_S
        )
        self._queue_depth = Gauge(*STORE_QUEUE_DEPTH, registry=None, multiprocess_mode="livesum")
        self._store_refused = Counter(*STORE_REFUSED, ["reason"], registry=None)
        for reason in REFUSAL_REASONS:  # every reason from start, at zero
            self._store_refused.labels(reason)
        self._shedding = Gauge(*OVERLOAD_SHEDDING, registry=None, multiprocess_mode="livesum")
        self._refused = Counter(*OVERLOAD_REFUSED, registry=None)
        self._episodes = Counter(*OVERLOAD_EPISODES, registry=None)
        # each worker commits to the same primaries: the most any live worker sees short
        self._short_of_replicas = Gauge(
            *SHORT_OF_REPLICAS, registry=None, multiprocess_mode="livemax"
        )
        self._unreachable = Gauge(
            *UNREACHABLE_PRIMARIES, registry=None, multiprocess_mode="livemax"
        )
        self._node_busy = Counter(*NODE_BUSY, registry=None)
        self._gc_pause_max = Gauge(
            *GC_PAUSE_MAX, ["generation"], registry=None, multiprocess_mode="max"
        )
        self._loop_lag_max = Gauge(*LOOP_LAG_MAX, registry=None, multiprocess_mode="max")
        # the workers' process figures: CPU and memory summed (the supervisor's own are
        # not in them: it only waits), the earliest start, the highest fd limit
        self._cpu = Counter(*PROCESS_CPU, registry=None)
        self._process = psutil.Process()
        self._process_gauges = {
            name: Gauge(name, doc, registry=None, multiprocess_mode=mode)
            for name, doc, mode in PROCESS_GAUGES
        }
        self._published: dict[str, float] = {}
        self._published_buckets: dict[str, list[int]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Publish now, then every ``interval_s`` in the background."""
        self._publish_logged()
        self._task = supervisor().start(
            "chat-metrics-publisher", self._publish_every_interval, RESTART
        )

    async def close(self) -> None:
        """Stop the background copies and publish the final counts."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
        self._publish_logged()

    async def _publish_every_interval(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self._publish_logged()

    def _publish_logged(self) -> None:
        try:
            self.publish()
        except Exception:  # the next copy may succeed: keep serving, say why
            log.exception("metrics: could not publish this worker's counters")

    def publish(self) -> None:
        """Copy the worker's counters into its multiprocess files now."""
        state = self._snapshot()
        counters = self._counters
        self._connections.set(state["connections"])
        self._rooms.set(state["rooms"])
        self._outbound_bytes.set(state["outbound_bytes"])
        self._grow(self._frames_in, "frames_in", counters.frames_in)
        self._grow(self._frames_out, "frames_out", state["frames_out"])
        self._grow(self._slow_consumer_closes, "slow_consumer", state["slow_consumer_closes"])
        self._grow(self._address_refusals, "address_refusals", state["address_refusals"])
        for code, count in state["errors"].items():
            self._grow(self._errors.labels(code), f"errors {code}", count)
        store = state["store"]
        sizes = [0] * (len(self._batch_bounds) + 1)
        for k, count in store["batch_sizes"].items():  # k = 2**i: sizes [k, 2k), bound 2k - 1
            sizes[min(k.bit_length() - 1, len(self._batch_bounds))] += count
        self._grow_histogram(
            self._batch_size,
            "batch_size",
            sizes,
            float(store["messages_committed"] + store["messages_failed"]),
        )
        self._queue_depth.set(store["queue_depth"])
        for reason, count in store["refused"].items():
            self._grow(self._store_refused.labels(reason), f"store refused {reason}", count)
        self._short_of_replicas.set(store.get("primaries_short_of_replicas") or 0)
        self._unreachable.set(store.get("primaries_unreachable") or 0)
        self._grow(self._node_busy, "node_busy", store.get("node_busy_refusals") or 0)
        for histogram, key, plain in (
            (self._ack_latency, "ack_latency", counters.ack_latency),
            (self._delivery_latency, "delivery_latency", counters.delivery_latency),
            (self._commit_seconds, "commit_seconds", counters.commit_seconds),
            (self._loop_lag, "loop_lag", counters.loop_lag.lag),
        ):
            self._grow_histogram(histogram, key, plain.counts, plain.sum)
        for generation, plain in counters.gc.pauses.items():
            self._grow_histogram(
                self._gc_pause.labels(str(generation)), f"gc {generation}", plain.counts, plain.sum
            )
            self._gc_pause_max.labels(str(generation)).set(plain.max)
        self._loop_lag_max.set(counters.loop_lag.lag.max)
        self._shedding.set(int(counters.overload.shedding))
        self._grow(self._refused, "overload_refused", counters.overload.refused)
        self._grow(self._episodes, "overload_episodes", counters.overload.episodes)
        for task, count in supervisor().failures.items():
            self._grow(self._task_failures.labels(task), f"task {task}", count)
        if self._jwks is not None and self._jwks_gauges is not None:
            self._jwks_gauges[0].set(self._jwks.age_s())
            self._jwks_gauges[1].set(self._jwks.max_age_s)
        self._publish_process()

    def _publish_process(self) -> None:
        """This worker's CPU seconds, memory, start time and file descriptors."""
        process = self._process
        with process.oneshot():
            times = process.cpu_times()
            memory = process.memory_info()
            values = {
                "process_virtual_memory_bytes": memory.vms,
                "process_resident_memory_bytes": memory.rss,
                "process_start_time_seconds": process.create_time(),
                "process_open_fds": process.num_fds(),
                "process_max_fds": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            }
        self._grow(self._cpu, "cpu", times.user + times.system)
        for name, value in values.items():
            self._process_gauges[name].set(value)

    def _grow(self, value: _Incrementable, key: str, total: float) -> None:
        """Add to ``value`` what ``total`` gained since it was last published under ``key``."""
        delta = total - self._published.get(key, 0)
        if delta:
            value.inc(delta)
            self._published[key] = total

    def _grow_histogram(
        self, histogram: Histogram, key: str, counts: list[int], total: float
    ) -> None:
        # Histogram's public API is observe(): one value, one file write, so a second of
        # acks would cost a write each. Its per-bucket values (_buckets, _sum: internal,
        # unchanged in prometheus_client for years, pinned by test_metrics) take the
        # second's counts in one write per bucket that moved, and the exact sum.
        before = self._published_buckets.get(key) or [0] * len(counts)
        for value, now, then in zip(histogram._buckets, counts, before, strict=True):
            if now != then:
                value.inc(now - then)
        self._published_buckets[key] = list(counts)
        self._grow(histogram._sum, f"{key} sum", total)


def batch_size_bounds(batch_max: int) -> tuple[int, ...]:
    """Bucket bounds 1, 3, 7, ... (``2k - 1`` for each power of two ``k``) up to ``batch_max``."""
    bounds = [1]
    while bounds[-1] < batch_max:
        bounds.append(2 * bounds[-1] + 1)
    return tuple(bounds)


class WorkersMetricsServer:
    """``GET /metrics`` in the supervisor (``WORKERS`` > 1): the sum of what every worker
    published (:class:`MetricsPublisher`), in a private directory of its own.

    Counters and histograms sum every worker that ever ran (a dead worker's files
    stay, so no total goes backwards); gauges sum the live workers once
    :meth:`process_exited` was told of the dead ones. Served from a thread, so the
    supervisor's loop stays as it is.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        #: fresh and empty: nothing of an earlier run is summed; removed by :meth:`close`
        self.directory = tempfile.mkdtemp(prefix="chatlab-metrics-")
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_WorkersCollector(self.directory))  # type: ignore[arg-type]
        self._http: _MetricsHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def worker_environ(self) -> dict[str, str]:
        """What a worker's environment needs to publish here."""
        return {"PROMETHEUS_MULTIPROC_DIR": self.directory}

    def start(self) -> None:
        """Listen and serve in a daemon thread; OSError if the port cannot be bound."""
        self._http = _MetricsHTTPServer(self.host, self.port, self.registry)
        # restarted if it raises: a scrape endpoint that died would read as a dead service
        self._thread = supervisor().thread(
            self._http.serve_forever, "metrics-http", RESTART, daemon=True
        )
        self._thread.start()

    def process_exited(self, pid: int) -> None:
        """Drop a dead worker's gauges (its counters stay in the sums)."""
        mark_process_dead(pid, self.directory)

    def close(self) -> None:
        """Stop serving and remove the directory."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        shutil.rmtree(self.directory, ignore_errors=True)


class _WorkersCollector:
    """prometheus_client's sum of the workers' files, with bucket bounds written as
    :class:`ChatCollector` writes them (``le="5"``, where prometheus_client writes ``5.0``)."""

    def __init__(self, directory: str) -> None:
        self._merged = MultiProcessCollector(None, directory)

    def collect(self) -> Iterator[Metric]:
        """Yield every family the workers published, summed."""
        for metric in self._merged.collect():
            if metric.type == "histogram":
                metric.samples = [_integer_bound(sample) for sample in metric.samples]
            yield metric


def _integer_bound(sample: Sample) -> Sample:
    le = sample.labels.get("le")
    if le is None or not float(le).is_integer():  # +Inf is not an integer either
        return sample
    return sample._replace(labels={**sample.labels, "le": str(int(float(le)))})


class _MetricsHTTPServer(ThreadingHTTPServer):
    """A thread per scrape; binds the first address ``host`` resolves to."""

    daemon_threads = True

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self.address_family = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0][0]
        self.registry = registry
        super().__init__((host, port), _MetricsHandler)


class _MetricsHandler(BaseHTTPRequestHandler):
    """``GET /metrics``; any other path is 404, as with one process."""

    server: _MetricsHTTPServer

    def do_GET(self) -> None:
        """Answer a scrape."""
        if self.path.split("?")[0] != "/metrics":
            self._reply(HTTPStatus.NOT_FOUND, b"not found: try /metrics\n", "text/plain")
        else:
            self._reply(HTTPStatus.OK, generate_latest(self.server.registry), CONTENT_TYPE)

    def _reply(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing per scrape."""
