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
reads returned: with full receive buffers, that is seconds of sends (measured: a
server whose sends cost 1 ms handled 8 s of them in one iteration, and its next tick
was the first to see it behind). So the send path asks too (:meth:`LoadShedder.refusing`):
when no tick has run for ``target_s + interval_s``, the loop has been behind by at least
the target for the interval as surely as late ticks would have said, and the sends
still being handled in that iteration are refused with the rest.

A refused send costs its decode and an error frame, a small part of an accepted one's
commit, ack and fan-out, so shedding frees the loop: the accepted sends are served
within about the target, and the rest are told at once to come back.
Only sends are shed: joins, history pages and presence are bounded on their own
(docs/protocol.md, Limits). No I/O: the ticker calls :meth:`LoadShedder.observe`.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("chat_server.overload")

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
    late by that much too (or at a send, :meth:`refusing`); it stops at the first tick
    late by less. ``target_s`` 0: never. ``episodes`` counts the starts, ``refused``
    the sends refused (counted by :meth:`refuse`).

    The log tells of an *overload*, not of each episode (under a steady excess they
    come several a second): a WARNING when the first starts, one line per
    :data:`LOG_EVERY_S` while they go on, an INFO line once none started for
    :data:`OVER_AFTER_S`, with what it refused and how far behind the loop was.
    """

    def __init__(self, target_s: float, interval_s: float) -> None:
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
        #: the overload being logged: (began, episodes and refused then); None: none
        self._overload: tuple[float, int, int] | None = None
        self._last_shed = 0.0
        self._logged = 0.0
        self._worst_lag_s = 0.0

    @property
    def enabled(self) -> bool:
        """False when ``OVERLOAD_LAG_MS`` is 0."""
        return self.target_s > 0

    def observe(self, lag_s: float, now: float | None = None) -> None:
        """One tick ``lag_s`` late at ``now`` (monotonic seconds)."""
        if not self.enabled:
            return
        if now is None:
            now = time.monotonic()
        self._last_tick = now
        if lag_s < self.target_s:
            self._late_since = None
            self.shedding = False
        else:
            if self._late_since is None:
                self._late_since = now
            if not self.shedding and now - self._late_since >= self.interval_s:
                self._start(lag_s, now)
        if self._overload is not None:
            self._log_overload(lag_s, now)

    def refusing(self, now: float) -> bool:
        """Whether a send handled at ``now`` (monotonic seconds) is refused: while
        shedding, or when no tick has run for ``target_s + interval_s`` (the loop held by
        one long iteration: shedding starts here, and the ticks end it)."""
        if self.shedding:
            return True
        last = self._last_tick
        if last is None or not self.enabled or now - last < self.target_s + self.interval_s:
            return False
        self._late_since = last + self.target_s
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
