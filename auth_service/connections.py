"""Bounds on what a client can make the auth service hold: time to send a request, and
connections open at once.

uvicorn times out only an idle keep-alive connection (``timeout_keep_alive``: here
``AUTH_IDLE_TIMEOUT_S``); its h11 protocol sets no timer while a request's header or
body is still arriving, and its ``limit_concurrency`` answers 503 only once a whole
request header came. So a client sending a byte now and then held a connection, and
a descriptor, for ever (slowloris). :class:`ConnectionGuard` closes that gap:

- a request's header must be complete within ``header_timeout_s`` of the connection's
  first byte (or of its opening), its body within ``body_timeout_s`` of the header's
  end; past either the answer is ``408 request_timeout`` and the connection closes.
  Bytes trickling in do not restart either clock;
- at most ``max_connections`` connections are open: one more is answered
  ``503 unavailable`` with ``Retry-After: 1`` as soon as it is accepted, and closed;
  the first refusal of an episode is logged at WARNING, then one line per 10 s with
  the count.

Built on uvicorn's :class:`~uvicorn.protocols.http.h11_impl.H11Protocol`, passed as
``uvicorn.Config(http=...)``, its documented way to choose the HTTP protocol class.
The subclass reads h11's public connection states (``conn.their_state``) and hooks
``connection_made``, ``data_received`` and ``on_response_complete``, which are
uvicorn's own, not a public API: ``pyproject.toml`` pins uvicorn below 0.55 for that
(``tests/auth_service/test_connections.py`` holds the behaviour).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Final

import h11
import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("auth_service.connections")

#: seconds between two warnings while the connection bound keeps being reached
WARN_EVERY_S: Final = 10.0


@dataclass(frozen=True)
class ConnectionGuard:
    """The bounds (settings ``AUTH_HEADER_TIMEOUT_S``, ``AUTH_BODY_TIMEOUT_S``,
    ``AUTH_MAX_CONNECTIONS``) and the count of refusals, shared by every connection."""

    header_timeout_s: float
    body_timeout_s: float
    max_connections: int

    def protocol(self) -> type[H11Protocol]:
        """uvicorn's h11 protocol with these bounds (for ``uvicorn.Config(http=...)``)."""
        return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": self})


class _Refusals:
    """Refusals at the connection bound, logged once per episode and then every 10 s."""

    def __init__(self) -> None:
        self.count = 0
        self.unlogged = 0
        self.logged_at = float("-inf")

    def refused(self, bound: int) -> None:
        self.count += 1
        self.unlogged += 1
        now = time.monotonic()
        if now - self.logged_at >= WARN_EVERY_S:
            log.warning(
                "AUTH_MAX_CONNECTIONS=%d reached: %d connections answered 503 since the last "
                "line (%d in all)",
                bound,
                self.unlogged,
                self.count,
            )
            self.unlogged = 0
            self.logged_at = now


REFUSALS = _Refusals()


def _raw_response(status: int, reason: str, code: str, detail: str, retry_after: int = 0) -> bytes:
    """A whole ``Connection: close`` answer with the API's error body, as bytes."""
    body = orjson.dumps({"error": code, "detail": detail})
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


BUSY: Final = _raw_response(
    503, "Service Unavailable", "unavailable", "too many connections; retry later", 1
)
HEADER_TOO_SLOW: Final = _raw_response(
    408, "Request Timeout", "request_timeout", "the request header did not arrive in time"
)
BODY_TOO_SLOW: Final = _raw_response(
    408, "Request Timeout", "request_timeout", "the request body did not arrive in time"
)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header and a body deadline and a connection bound."""

    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        #: what the armed deadline waits for: "header", "body" or None
        self._waiting_for: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Refuse the connection past the bound, else start the header's clock."""
        super().connection_made(transport)
        if len(self.connections) > self.guard.max_connections:
            REFUSALS.refused(self.guard.max_connections)
            self._close_with(BUSY)
            return
        self._wait_for("header")

    def data_received(self, data: bytes) -> None:
        """Feed uvicorn, then follow the request's progress with the deadlines."""
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        """After an answer, uvicorn's idle timer runs until the next request's first byte."""
        super().on_response_complete()
        self._wait_for(None)
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the deadline with the connection."""
        self._wait_for(None)
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Arm the deadline the request's state needs (h11's view of the client's side)."""
        if self.transport.is_closing():
            self._wait_for(None)
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            # a fresh connection's clock runs from its opening; a kept-alive one's from the
            # next request's first byte (until then uvicorn's idle timer runs)
            if self._waiting_for is None and self.timeout_keep_alive_task is None:
                self._wait_for("header")
        elif state is h11.SEND_BODY:
            if self._waiting_for != "body":
                self._wait_for("body")
        else:  # the whole request came: answering is the app's business
            self._wait_for(None)

    def _wait_for(self, what: str | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting_for = what
        if what is not None:
            timeout_s = (
                self.guard.header_timeout_s if what == "header" else self.guard.body_timeout_s
            )
            self._deadline = self.loop.call_later(timeout_s, self._too_slow, what)

    def _too_slow(self, what: str) -> None:
        """The header or body did not come in time: 408 (unless an answer began), close."""
        self._deadline = None
        self._waiting_for = None
        if self.transport.is_closing():
            return
        started = self.cycle is not None and self.cycle.response_started
        if self.cycle is not None:
            self.cycle.disconnected = True  # the app's receive() gets http.disconnect
            self.cycle.message_event.set()
        self._close_with(
            None if started else HEADER_TOO_SLOW if what == "header" else BODY_TOO_SLOW
        )

    def _close_with(self, answer: bytes | None) -> None:
        self._unset_keepalive_if_required()
        if answer is not None:
            self.transport.write(answer)
        self.transport.close()
