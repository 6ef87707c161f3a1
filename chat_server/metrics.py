"""Prometheus metrics on ``CHAT_HOST:METRICS_PORT/metrics`` (``METRICS_PORT=0``: off).

The per-message path only bumps plain integers (frames in and out, errors by code,
ack-latency buckets); everything is turned into Prometheus families at scrape
time by a custom collector, on the event loop, so a scrape sees one consistent
snapshot and the hot path never takes prometheus_client's locks.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

#: upper bounds (ms) of the ack-latency histogram: accept -> ack sent
ACK_LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class Counters:
    """Plain counters the server bumps on its hot path; read by the collector."""

    __slots__ = ("ack_latency_buckets", "ack_latency_count", "ack_latency_sum_ms", "frames_in")

    def __init__(self) -> None:
        self.frames_in = 0
        self.ack_latency_buckets = [0] * (len(ACK_LATENCY_BUCKETS_MS) + 1)
        self.ack_latency_sum_ms = 0.0
        self.ack_latency_count = 0

    def observe_ack_latency_ms(self, latency_ms: float) -> None:
        """Count one ack's latency from accept to ack."""
        self.ack_latency_buckets[bisect.bisect_left(ACK_LATENCY_BUCKETS_MS, latency_ms)] += 1
        self.ack_latency_sum_ms += latency_ms
        self.ack_latency_count += 1


class ChatCollector:
    """Builds the metric families from the server's state at scrape time."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], counters: Counters) -> None:
        self._snapshot = snapshot
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        """Yield every family (called by the registry on each scrape)."""
        state = self._snapshot()
        yield GaugeMetricFamily(
            "chat_connections", "open websocket connections", value=state["connections"]
        )
        yield GaugeMetricFamily("chat_rooms", "rooms with members in this process", state["rooms"])
        yield CounterMetricFamily(
            "chat_frames_in", "frames received from clients", value=self._counters.frames_in
        )
        yield CounterMetricFamily(
            "chat_frames_out", "frames written to clients", value=state["frames_out"]
        )
        errors = CounterMetricFamily("chat_errors", "error frames sent, by code", labels=["code"])
        for code, count in sorted(state["errors"].items()):
            errors.add_metric([code], count)
        yield errors
        yield GaugeMetricFamily(
            "chat_outbound_buffer_bytes",
            "bytes the server holds for its connections (transport write buffers)",
            value=state["outbound_bytes"],
        )
        yield CounterMetricFamily(
            "chat_slow_consumer_closes",
            "connections closed with 1013 slow consumer",
            value=state["slow_consumer_closes"],
        )
        yield _histogram(
            "chat_ack_latency_ms",
            "from accepting a send to sending its ack (durable), in ms",
            ACK_LATENCY_BUCKETS_MS,
            self._counters.ack_latency_buckets,
            self._counters.ack_latency_sum_ms,
        )
        store = state["store"]
        sizes = store["batch_sizes"]  # power of two k -> batches of size [k, 2k)
        bounds = sorted(sizes)
        yield _histogram(
            "chat_group_commit_batch_size",
            "messages per group commit (bucket k holds sizes below 2k)",
            tuple(2 * k - 1 for k in bounds),
            [sizes[k] for k in bounds] + [0],
            float(store["messages_committed"] + store["messages_failed"]),
        )


def _histogram(
    name: str, doc: str, bounds: tuple[float, ...], counts: list[int], total: float
) -> HistogramMetricFamily:
    cumulative = 0
    buckets = []
    for bound, count in zip(bounds, counts, strict=False):
        cumulative += count
        buckets.append((str(bound), cumulative))
    cumulative += counts[len(bounds)] if len(counts) > len(bounds) else 0
    buckets.append(("+Inf", cumulative))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


class MetricsServer:
    """``GET /metrics`` on its own port, served on the event loop by websockets' HTTP path."""

    def __init__(self, host: str, port: int, collector: ChatCollector) -> None:
        self.host = host
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)  # type: ignore[arg-type]
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
        response.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
        return response

    async def close(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def _never_called(connection: ServerConnection) -> None:  # pragma: no cover
    await connection.close()
