"""One Locust process's part of the current run: its options, user names, slots and counters."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gevent.event import Event

from chat_server.codecs import get_codec
from loadtest.client import Ledger
from loadtest.options import Options

if TYPE_CHECKING:
    import gevent
    from locust.runners import Runner

#: a send later than its schedule by more than this is late
LATE_SEND_THRESHOLD_S = 0.1
#: a user stopping this long after the run went quiet has every message in flight
TAIL_SETTLE_S = 2.0


class SlotPool:
    """Slot numbers for this process's users: the lowest free one first, so rooms fill in order."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 0

    def acquire(self) -> int:
        """A slot no live user holds."""
        if self._free:
            self._free.sort()
            return self._free.pop(0)
        self._next += 1
        return self._next - 1

    def release(self, slot: int) -> None:
        """Give a slot back."""
        self._free.append(slot)


@dataclass
class Plan:
    """How this process's users are named: set by the master (or locally) at test start."""

    processes: int = 1
    index: int = 0
    #: name -> a :class:`~loadtest.auth.Grant` as a dict (prelogin or ``--token-file``)
    tokens: dict[str, dict[str, Any]] = field(default_factory=dict)


class Process:
    """One Locust process's part of the current run; reset at each test start."""

    def __init__(self) -> None:
        self.options: Options | None = None
        self.plan = Plan()
        self.ledger = Ledger(late_threshold_s=LATE_SEND_THRESHOLD_S)
        self.slots = SlotPool()
        self.sending = Event()
        self.sending.set()
        self.quiet_since: float | None = None
        self.gate = Event()
        self.connected = 0
        self.cpu_max = 0.0
        self.cpu_over_s = 0
        self.overload_seconds = 0
        self.monitor: gevent.Greenlet | None = None
        self.runner: Runner | None = None
        self.codec = get_codec("orjson")

    def reset(self, options: Options) -> None:
        """Start a new run with ``options``: fresh counters, sending allowed, gate per auth mode."""
        self.options = options
        self.ledger = Ledger(late_threshold_s=LATE_SEND_THRESHOLD_S)
        self.slots = SlotPool()
        self.sending.set()
        self.quiet_since = None
        self.connected = 0
        self.cpu_max = 0.0
        self.cpu_over_s = 0
        self.overload_seconds = 0
        self.codec = get_codec(options.serializer)
        if options.auth_mode == "prelogin" and options.target == "chat":
            self.gate.clear()
        else:
            self.gate.set()

    def set_quiet(self, quiet: bool) -> None:
        """Stop (``quiet``) or resume sending; users keep receiving either way."""
        if quiet:
            self.quiet_since = time.monotonic()
            self.sending.clear()
        else:
            self.quiet_since = None
            self.sending.set()

    def tail_settled(self) -> bool:
        """True once the run has been quiet for :data:`TAIL_SETTLE_S`."""
        return self.quiet_since is not None and time.monotonic() - self.quiet_since >= TAIL_SETTLE_S

    def snapshot(self) -> dict[str, Any]:
        """Counters for the master and the final report."""
        return {
            **self.ledger.counts(),
            "cpu_max_percent": round(self.cpu_max, 1),
            "cpu_over_90_s": self.cpu_over_s,
            "overload_seconds": self.overload_seconds,
        }
