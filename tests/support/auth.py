"""The auth service as the tests run it."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from chatlab.harness import FAST_ARGON2, AuthProcess

__all__ = ["TEST_SETTINGS", "RawReply", "at_once", "logins_answered", "metric_sum", "raw_request"]

T = TypeVar("T")

#: what the tests run with unless they say otherwise: cheap hashes, no per-client limits
TEST_SETTINGS = {
    **FAST_ARGON2,
    "LOGIN_RATE_PER_CLIENT_PER_MIN": "0",
    "REGISTER_RATE_PER_CLIENT_PER_MIN": "0",
    "REFRESH_RATE_PER_CLIENT_PER_MIN": "0",
    "EVENT_LOOP": "asyncio",
}


def logins_answered(replica: AuthProcess, status: int = 200) -> float:
    """How many ``POST /login`` ``replica`` answered with ``status`` (its Prometheus
    counter; a browser's CORS preflight, ``OPTIONS /login``, is not a login)."""
    return metric_sum(
        replica, "auth_requests_total", route="/login", method="POST", status=str(status)
    )


def metric_sum(replica: AuthProcess, sample: str, **labels: str) -> float:
    """The sum of ``replica``'s samples named ``sample`` (e.g. ``auth_refresh_total``,
    ``auth_hash_seconds_count``) whose labels include ``labels``; 0 when there are none."""
    text = replica.get("/metrics").body.decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


class RawReply:
    """An HTTP answer with every header kept (``Set-Cookie`` comes more than once)."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    @property
    def cookies(self) -> list[str]:
        """Every ``Set-Cookie`` header, in order."""
        return [v for k, v in self.headers if k.lower() == "set-cookie"]

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"RawReply({self.status}, {self.headers!r}, {self.body[:200]!r})"


def raw_request(
    auth: AuthProcess,
    method: str,
    path: str,
    payload: Any = None,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    source: str = "127.0.0.1",
) -> RawReply:
    """One request to ``auth`` from the local address ``source`` (any of 127.0.0.0/8),
    ``payload`` as JSON (or ``body`` as it is), every answer header kept."""
    if payload is not None:
        body = json.dumps(payload).encode()
    sent = {"Content-Type": "application/json"} if body is not None else {}
    conn = http.client.HTTPConnection(
        "127.0.0.1", auth.port, timeout=30, source_address=(source, 0)
    )
    try:
        conn.request(method, path, body, {**sent, **(headers or {})})
        answer = conn.getresponse()
        return RawReply(answer.status, answer.getheaders(), answer.read())
    finally:
        conn.close()


def at_once(calls: list[Callable[[], T]]) -> list[T]:
    """Make the calls from one thread each, released together; their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        results[index] = calls[index]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results
