"""The auth service's Prometheus metrics, served at ``GET /metrics`` on its own port.

Families (prometheus_client adds ``_total`` to counters, ``_bucket``/``_sum``/``_count``
to histograms):

- ``auth_requests_total{route,method,status}``: answered requests (``route`` is one of
  the API's paths, or ``other``: the label set stays bounded whatever clients ask);
- ``auth_request_seconds{route}``: time from the request to its answer;
- ``auth_hash_jobs``: hashing jobs waiting or running now (at most ``HASH_QUEUE_MAX``,
  which ``auth_hash_jobs_max`` holds); past it logins get 503;
- ``auth_hash_seconds{op}``: a hashing job's time (``op``: ``hash``, ``verify``) from
  its hand-off to the pool to its result, the wait in the queue included;
- ``auth_hash_rejected_total``: jobs refused because the pool was saturated;
- ``auth_refresh_total{outcome}``: refresh tokens presented to ``POST /refresh``, by
  outcome (``rotated``, ``grace``, ``invalid``, ``reused``: :mod:`auth_service.sessions`);
- ``auth_sessions_revoked_total{reason}``: session families revoked by this process, by
  reason (``reuse``, ``logout``, ``limit``; ``admin`` is ``revoke-sessions``, a process of
  its own, so it stays 0 here);
- ``auth_task_failures_total{task}``: background tasks that ended by an exception
  (:mod:`chatlab.supervision`; the keyring refresh is restarted);
- ``process_*``: prometheus_client's process collector (CPU, memory, open files).

Each service instance has its own registry (never the process-global one), so two in
one process (tests, ``REGRESSION=auth_inline``) do not collide.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from auth_service.errors import Unavailable
from auth_service.passwords import InlinePasswords, PasswordPool, Verdict
from auth_service.sessions import Outcome, RevokeReason
from chatlab.supervision import supervisor

T = TypeVar("T")

#: request time bounds, in seconds: a login costs one argon2 hash (tens to hundreds of ms)
REQUEST_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AuthMetrics:
    """The service's metric families in a registry of their own."""

    def __init__(self, routes: Iterable[str]) -> None:
        self.registry = CollectorRegistry()
        self.routes = frozenset(routes)
        self.requests = Counter(
            "auth_requests",
            "HTTP requests answered, by route, method and status",
            ("route", "method", "status"),
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "auth_request_seconds",
            "time from a request to its answer, by route",
            ("route",),
            buckets=REQUEST_BUCKETS_S,
            registry=self.registry,
        )
        self.hash_jobs = Gauge(
            "auth_hash_jobs",
            "password hashing jobs waiting or running (the pool's queue)",
            registry=self.registry,
        )
        self.hash_jobs_max = Gauge(
            "auth_hash_jobs_max",
            "HASH_QUEUE_MAX: jobs in flight past which logins get 503",
            registry=self.registry,
        )
        self.hash_seconds = Histogram(
            "auth_hash_seconds",
            "a hashing job's time from its hand-off to its result (queue wait included)",
            ("op",),
            buckets=REQUEST_BUCKETS_S,
            registry=self.registry,
        )
        self.hash_rejected = Counter(
            "auth_hash_rejected",
            "hashing jobs refused because the pool was saturated (answered 503)",
            registry=self.registry,
        )
        for op in ("hash", "verify"):
            self.hash_seconds.labels(op)
        self.refreshes = Counter(
            "auth_refresh",
            "refresh tokens presented, by outcome (rotated, grace, invalid, reused)",
            ("outcome",),
            registry=self.registry,
        )
        for outcome in Outcome:
            self.refreshes.labels(str(outcome))
        self.sessions_revoked = Counter(
            "auth_sessions_revoked",
            "session families revoked, by reason (reuse, logout, admin, limit)",
            ("reason",),
            registry=self.registry,
        )
        for reason in RevokeReason:
            self.sessions_revoked.labels(str(reason))
        self.registry.register(_TaskFailures())  # type: ignore[arg-type]
        ProcessCollector(registry=self.registry)

    def route_of(self, path: str) -> str:
        """The ``route`` label for a request path: the path if the API has it, else ``other``."""
        return path if path in self.routes else "other"

    def watch_pool(self, in_flight: Callable[[], int], queue_max: int) -> None:
        """Read the pool's jobs in flight at scrape time."""
        self.hash_jobs.set_function(in_flight)
        self.hash_jobs_max.set(queue_max)

    async def endpoint(self, request: Request) -> Response:
        """``GET /metrics``: the Prometheus text exposition (format 0.0.4, as the chat server's)."""
        return Response(
            generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4}
        )


class _TaskFailures:
    """``auth_task_failures_total{task}``: the process supervisor's count, read at scrape time."""

    def collect(self) -> Iterator[Metric]:
        """Yield the one family."""
        family = CounterMetricFamily(
            "auth_task_failures",
            "background tasks that ended by an exception, by task (chatlab.supervision)",
            labels=["task"],
        )
        for task, count in sorted(supervisor().failures.items()):
            family.add_metric([task], count)
        yield family


class MeasuredPasswords:
    """A password pool (or the inline hasher) whose every job is timed into ``metrics``."""

    def __init__(self, passwords: PasswordPool | InlinePasswords, metrics: AuthMetrics) -> None:
        self._passwords = passwords
        self._metrics = metrics
        queue_max = getattr(passwords, "queue_max", 0)
        metrics.watch_pool(lambda: passwords.in_flight, queue_max)

    @property
    def in_flight(self) -> int:
        """Jobs waiting or running in the pool."""
        return self._passwords.in_flight

    async def hash(self, password: str) -> str:
        """The pool's :meth:`~PasswordPool.hash`, timed."""
        return await self._timed("hash", lambda: self._passwords.hash(password))

    async def verify(self, password_hash: str | None, password: str) -> Verdict:
        """The pool's :meth:`~PasswordPool.verify`, timed."""
        return await self._timed("verify", lambda: self._passwords.verify(password_hash, password))

    async def _timed(self, op: str, job: Callable[[], Awaitable[T]]) -> T:
        start = time.perf_counter()
        try:
            result = await job()
        except Unavailable:
            self._metrics.hash_rejected.inc()
            raise
        self._metrics.hash_seconds.labels(op).observe(time.perf_counter() - start)
        return result


class RequestMetrics:
    """ASGI middleware counting every HTTP answer by route, method and status."""

    def __init__(self, app: ASGIApp, metrics: AuthMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, noting the status it is answered with (500 if none)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            route = self.metrics.route_of(scope["path"])
            self.metrics.requests.labels(route, scope["method"], str(status)).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - start)
