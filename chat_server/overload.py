"""Overload that degrades: sends refused while the event loop is behind.

Past its knee a server cannot keep up with what arrives. Each connection's frames are
handled as they are read (:mod:`chat_server.transport`), so nothing piles up inside the
process: what grows is the work waiting for the loop, in the kernel's receive buffers,
and every message in it waits longer than the one before. Left alone that queue grows
for as long as the load lasts (the knee's "collapse": p50 from milliseconds to hundreds
of them within one step), and the server delivers everything late instead of most
things on time.

The age of that queue is the loop's lag: how late a 10-ms ticker runs
(:class:`chat_server.tail.LoopLagTicker`), since a tick waits behind the whole
iteration that handles the backlog. :class:`LoadShedder` is CoDel's control law
(Nichols and Jacobson, "Controlling Queue Delay", 2012) applied to that age: a lag at or
above ``target_s`` (``OVERLOAD_LAG_MS``) at every tick for ``interval_s``
(``OVERLOAD_INTERVAL_MS``) means a standing queue, not a burst, and from then on new
sends are answered ``unavailable`` (not stored, not delivered: the client retries with
its ``ref``) until a tick runs on time again. One late tick (a collection, a burst of
joins) never sheds: the next tick on time clears it.

A tick only runs between loop iterations, and one iteration handles every frame its
reads returned: with full receive buffers, that can be seconds of sends, and the tick
after it is the first to see the loop behind. So the send path asks too
(:meth:`LoadShedder.refusing`): when no tick has run for ``target_s + interval_s``, the
loop has been behind by at least the target for the interval as surely as late ticks
would have said, and the sends still being handled in that iteration are refused with
the rest.

Behind is not always overloaded: on a shared host the loop can be late because the host
took its vCPU (steal) or a handler slept, and refusing sends would not give that time
back. So shedding starts only when the loop's own thread wanted a CPU for at least
:data:`BUSY_SHARE` of the time it was behind: running, or runnable and waiting for a CPU
another process held (both from the thread's schedstat, :func:`demand_clock`; steal is
neither), against the wall clock over the same span. A server with more work than its
share of a core sheds; one that was paused or asleep does not.

A refused send is decoded and answered with one error frame, and is not committed,
acked or fanned out, so shedding gives the loop back to the sends it accepts, and the
rest are told at once to come back; how fast the accepted ones are then served
past the knee is what ``python -m bench.overload`` measures
(docs/decisions/0022-overload.md). Only sends are shed: joins, history pages and
presence are bounded on their own (docs/protocol.md, Limits). The ticker calls
:meth:`LoadShedder.observe`; its only read is the thread's schedstat (one ``pread``),
and a send reads it only when no tick came for ``target_s + interval_s``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("chat_server.overload")

#: the loop thread's time running or runnable over the span it was behind, as a share
#: of that span, at least: an overload (its own work holds it), not the host or a sleep
BUSY_SHARE = 0.8
#: the calling thread's scheduler statistics: run and wait (runnable) time, in ns
SCHEDSTAT = "/proc/thread-self/schedstat"
#: the refusal's detail, as the client reads it
REFUSAL = "server overloaded: retry later with the same ref"
#: while an overload lasts, one log line per this many seconds
LOG_EVERY_S = 10.0
#: an overload is over (its INFO line) once no send was refused for this long: under a
#: steady excess the shedder stops and starts again every few iterations
OVER_AFTER_S = 1.0


class LoadShedder:
    """Whether new sends are refused now (``shedding``), from the loop's lag.

    ``observe(lag_s, now)`` at every tick: shedding starts at a tick whose lag is at
    least ``target_s`` when every tick since one at least ``interval_s`` earlier was
    late by that much too and the loop's thread wanted a CPU for :data:`BUSY_SHARE` of
    that span (``cpu_clock``, :func:`demand_clock` unless given), or at a send
    (:meth:`refusing`); it stops at the first tick late by less. ``target_s`` 0:
    never. ``episodes`` counts the starts, ``refused`` the sends refused (counted by
    :meth:`refuse`).

    The log tells of an *overload*, not of each episode (under a steady excess they
    come several a second): a WARNING when the first starts, one line per
    :data:`LOG_EVERY_S` while they go on, an INFO line once none started for
    :data:`OVER_AFTER_S`, with what it refused and how far behind the loop was.
    """

    def __init__(
        self,
        target_s: float,
        interval_s: float,
        cpu_clock: Callable[[], float] | None = None,
    ) -> None:
        if target_s < 0 or interval_s < 0:
            raise ValueError("the target and the interval cannot be negative")
        self.target_s = target_s
        self.interval_s = interval_s
        self.shedding = False
        self.episodes = 0
        self.refused = 0
        #: when the run of late ticks began (None: the last tick was on time)
        self._late_since: float | None = None
        #: when the last tick ran (None: none yet)
        self._last_tick: float | None = None
        #: the loop thread's demand clock (run + runnable seconds) at the last tick and
        #: when the run of late ticks began
        self._cpu_clock = cpu_clock or demand_clock()
        self._last_cpu = 0.0
        self._late_cpu = 0.0
        #: the overload being logged: (began, episodes and refused then); None: none
        self._overload: tuple[float, int, int] | None = None
        self._last_shed = 0.0
        self._logged = 0.0
        self._worst_lag_s = 0.0

    @property
    def enabled(self) -> bool:
        """False when ``OVERLOAD_LAG_MS`` is 0."""
        return self.target_s > 0

    def observe(self, lag_s: float, now: float | None = None, cpu: float | None = None) -> None:
        """One tick ``lag_s`` late at ``now`` (monotonic seconds), the loop thread's
        demand clock then ``cpu`` (seconds; read when not given)."""
        if not self.enabled:
            return
        if now is None:
            now = time.monotonic()
        if cpu is None:
            cpu = self._cpu_clock()
        self._last_tick, self._last_cpu = now, cpu
        if lag_s < self.target_s:
            self._late_since = None
            self.shedding = False
        else:
            if self._late_since is None:
                self._late_since, self._late_cpu = now, cpu
            if not self.shedding and now - self._late_since >= self.interval_s:
                if _busy(self._late_cpu, cpu, now - self._late_since):
                    self._start(lag_s, now)
                else:  # behind, but not from its own work: judge the next span afresh
                    self._late_since, self._late_cpu = now, cpu
        if self._overload is not None:
            self._log_overload(lag_s, now)

    def refusing(self, now: float, cpu: float | None = None) -> bool:
        """Whether a send handled at ``now`` (monotonic seconds) is refused: while
        shedding, or when no tick has run for ``target_s + interval_s`` and the loop's
        thread was busy for :data:`BUSY_SHARE` of that time (``cpu``: its CPU time now,
        read when needed if not given): one long iteration of its own work. Shedding
        starts here, and the ticks end it."""
        if self.shedding:
            return True
        last = self._last_tick
        if last is None or not self.enabled or now - last < self.target_s + self.interval_s:
            return False
        if cpu is None:
            cpu = self._cpu_clock()
        if not _busy(self._last_cpu, cpu, now - last):
            return False
        self._late_since, self._late_cpu = last + self.target_s, self._last_cpu
        self._start(now - last, now)
        return True

    def refuse(self) -> None:
        """Count one send refused."""
        self.refused += 1

    def _start(self, lag_s: float, now: float) -> None:
        self.shedding = True
        self.episodes += 1
        self._last_shed = now
        if self._overload is not None:
            self._worst_lag_s = max(self._worst_lag_s, lag_s)
            return
        self._overload = (now, self.episodes - 1, self.refused)
        self._logged = now
        self._worst_lag_s = lag_s
        log.warning(
            "overload: the event loop is %.0f ms behind (OVERLOAD_LAG_MS %.0f for"
            " OVERLOAD_INTERVAL_MS %.0f): refusing new sends with unavailable",
            lag_s * 1e3,
            self.target_s * 1e3,
            self.interval_s * 1e3,
        )

    def _log_overload(self, lag_s: float, now: float) -> None:
        """At each tick of an overload: its periodic line, or its end."""
        assert self._overload is not None
        began, episodes, refused = self._overload
        if self.shedding:
            self._last_shed = now
            self._worst_lag_s = max(self._worst_lag_s, lag_s)
        if now - self._last_shed >= OVER_AFTER_S:
            self._overload = None
            log.info(
                "overload: over after %.1f s: %d sends refused in %d episodes, the loop at"
                " most %.0f ms behind",
                self._last_shed - began,
                self.refused - refused,
                self.episodes - episodes,
                self._worst_lag_s * 1e3,
            )
        elif now - self._logged >= LOG_EVERY_S:
            self._logged = now
            log.warning(
                "overload: for %.0f s now: %d sends refused in %d episodes, the loop at most"
                " %.0f ms behind",
                now - began,
                self.refused - refused,
                self.episodes - episodes,
                self._worst_lag_s * 1e3,
            )


def _busy(cpu_before: float, cpu_now: float, span_s: float) -> bool:
    """Whether the loop's thread ran for at least :data:`BUSY_SHARE` of ``span_s``."""
    return span_s <= 0 or cpu_now - cpu_before >= BUSY_SHARE * span_s


def demand_clock() -> Callable[[], float]:
    """A clock of the calling thread's demand for a CPU: seconds it ran plus seconds it
    was runnable and waited (Linux schedstat: one ``pread`` of an open file), opened on
    first use by the thread that reads it (the event loop's); the thread's CPU time
    where there is no schedstat."""
    fd: int | None = None

    def read() -> float:
        nonlocal fd
        try:
            if fd is None:
                fd = os.open(SCHEDSTAT, os.O_RDONLY)
            run_ns, wait_ns, _ = os.pread(fd, 128, 0).split()
        except (OSError, ValueError):
            return time.thread_time()
        return (int(run_ns) + int(wait_ns)) / 1e9

    return read
