"""The server's view of its own tail: GC pauses, event-loop lag, and the GC policy.

Latency spikes far below the knee come from the process, not the load: a cyclic
garbage collection of the oldest generation walks every tracked object (tens of
milliseconds or more with thousands of connections open; measured in
``docs/decisions/0007-gc-policy.md``), and every callback waiting on the loop waits
behind it. This module measures that from inside (:class:`GcWatch`,
:class:`LoopLagTicker`, histograms the metrics expose as ``chat_gc_pause_seconds`` and
``chat_loop_lag_seconds``) and applies the policy ``GC_POLICY`` chooses
(:func:`apply_gc_policy`).

``GC_POLICY=tuned`` (the default): once the server is up, every object made so far
(modules, settings, codecs: the long-lived ones) is moved out of the collector's
reach with :func:`gc.freeze`, and the thresholds are raised
(:data:`TUNED_THRESHOLDS`) so that the young generations are collected rarely and
the oldest never automatically. What a full collection would free (reference
cycles that outlived two young collections, such as a closed connection's
objects) is freed by :class:`QuietCollector`: a full collection once the server
has been idle for a second, or at the latest every ``GC_FULL_INTERVAL_S``. The cost is memory:
cyclic garbage waits for that collection (``docs/decisions/0007-gc-policy.md``).
``GC_POLICY=default`` keeps CPython's own thresholds (for the lab to compare).
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

log = logging.getLogger("chat_server.tail")

#: upper bounds (s) of the GC pause and loop lag histograms
PAUSE_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
)
#: upper bounds (s) of the commit-duration histogram
COMMIT_BUCKETS_S: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
#: the loop-lag ticker's period
LOOP_TICK_S: Final = 0.01
#: gen0, gen1, gen2 thresholds of GC_POLICY=tuned (CPython's defaults: 700, 10, 10);
#: gen2 is collected by QuietCollector only (a threshold this high never triggers it)
TUNED_THRESHOLDS: Final = (50_000, 20, 1_000_000)
#: GC pauses at least this long are remembered (``/stats``) and logged
NOTABLE_PAUSE_S: Final = 0.05
#: loop ticks at least this late, and commits and checkpoints at least this long, are
#: remembered with their time (``/stats``), to tell what a stall coincided with
NOTABLE_LAG_S: Final = 0.01
#: how many notable events of each kind are kept
NOTABLE_KEPT: Final = 64
#: a full collection waits for the server to be idle (no frame received) this long
QUIET_FOR_S: Final = 1.0
#: ... and for the last one to be at least this old
QUIET_MIN_INTERVAL_S: Final = 30.0


class PlainHistogram:
    """A histogram of plain numbers: observed on the hot path, read at scrape time.

    ``counts[i]`` holds the observations ``<= bounds[i]`` (and above the previous
    bound); the last count holds those above every bound. Only one thread observes.
    """

    __slots__ = ("bounds", "count", "counts", "max", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0
        self.max = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1
        self.max = max(self.max, value)

    def summary(self) -> dict[str, float]:
        """Count, sum and max, for ``/stats``."""
        return {"count": self.count, "sum_s": round(self.sum, 6), "max_s": round(self.max, 6)}


class GcWatch:
    """Times every cyclic garbage collection through :data:`gc.callbacks`.

    ``pauses[generation]`` is the histogram of pause lengths; ``notable`` the last
    64 pauses of at least :data:`NOTABLE_PAUSE_S` as ``(unix time, generation,
    seconds, objects collected)``, each also logged at INFO.
    """

    def __init__(self) -> None:
        self.pauses = {generation: PlainHistogram(PAUSE_BUCKETS_S) for generation in range(3)}
        #: objects moved out of the collector's reach when the policy froze them (counted
        #: once: ``gc.get_freeze_count()`` walks them all, on the loop)
        self.frozen = 0
        self.notable: deque[tuple[float, int, float, int]] = deque(maxlen=NOTABLE_KEPT)
        self._started = 0.0

    def install(self) -> None:
        """Start timing collections (idempotent)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        """Stop timing collections."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = info["generation"]
        self.pauses[generation].observe(pause)
        if pause >= NOTABLE_PAUSE_S:
            self.notable.append((time.time(), generation, pause, info.get("collected", 0)))
            log.info(
                "gc: generation %d collection paused the server %.0f ms", generation, pause * 1e3
            )

    def summary(self) -> dict[str, Any]:
        """The collector's thresholds and frozen objects, per generation count/sum/max of
        the pauses, and the notable ones, for ``/stats``."""
        return {
            "thresholds": list(gc.get_threshold()),
            "frozen_objects": self.frozen,
            "pauses": {str(g): h.summary() for g, h in self.pauses.items()},
            "notable": [
                {"at": round(at, 3), "generation": g, "pause_s": round(p, 6), "collected": c}
                for at, g, p, c in self.notable
            ],
        }


class LoopLagTicker:
    """A callback every :data:`LOOP_TICK_S` that records how late it ran (``lag``).

    Whatever holds the loop (a GC pause, a long batch, a blocking call) shows as
    lateness here, whatever its cause. Each of ``listeners`` is called with the lag
    after each tick (the quiet collector and the load shedder listen).
    """

    def __init__(self) -> None:
        self.lag = PlainHistogram(PAUSE_BUCKETS_S)
        self.listeners: list[Callable[[float], None]] = []
        #: ``(unix time, lag s)`` of the last ticks late by :data:`NOTABLE_LAG_S` or more
        self.notable: deque[tuple[float, float]] = deque(maxlen=NOTABLE_KEPT)
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start ticking on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._schedule()

    def stop(self) -> None:
        """Stop ticking."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = time.perf_counter() + LOOP_TICK_S
        self._handle = self._loop.call_later(LOOP_TICK_S, self._tick)

    def _tick(self) -> None:
        lag = max(0.0, time.perf_counter() - self._due)
        self.lag.observe(lag)
        if lag >= NOTABLE_LAG_S:
            self.notable.append((time.time(), lag))
        self._schedule()
        for listener in self.listeners:
            listener(lag)


class QuietCollector:
    """``GC_POLICY=tuned``'s full collections: when the server is idle, or when overdue.

    Called on every loop-lag tick: once ``activity()`` (a count that grows with the
    load, such as frames received) has not moved for :data:`QUIET_FOR_S`, a full
    collection runs if the last one is older than ``min_interval_s`` (once per idle
    spell: the next waits for the activity to move and stop again); under
    continuous load one runs anyway once ``max_interval_s`` passed, so cyclic
    garbage stays bounded. Each is timed by :class:`GcWatch` like any other.
    """

    def __init__(
        self, activity: Callable[[], int], min_interval_s: float, max_interval_s: float
    ) -> None:
        self.activity = activity
        self.min_interval_s = min_interval_s
        self.max_interval_s = max_interval_s
        self.collections = 0
        self._last = time.monotonic()
        self._seen = -1
        self._still_since = self._last
        #: this idle spell had its collection: the next waits for new activity
        self._spell_done = False

    def on_tick(self, lag_s: float) -> None:
        """One loop-lag tick: collect once per idle spell, or when overdue."""
        now = time.monotonic()
        seen = self.activity()
        if seen != self._seen:
            self._seen = seen
            self._still_since = now
            self._spell_done = False
        since_last = now - self._last
        idle = not self._spell_done and now - self._still_since >= QUIET_FOR_S
        if (idle and since_last >= self.min_interval_s) or since_last >= self.max_interval_s:
            self._last = now
            self._spell_done = idle
            self.collections += 1
            gc.collect()


def start_tail(
    gc_watch: GcWatch,
    ticker: LoopLagTicker,
    activity: Callable[[], int],
    policy: str,
    full_interval_s: float,
) -> QuietCollector | None:
    """Once the server is up: time collections, tick, apply ``GC_POLICY`` (on the loop)."""
    gc_watch.install()
    quiet = None
    if policy == "tuned":
        quiet = QuietCollector(activity, QUIET_MIN_INTERVAL_S, full_interval_s)
        ticker.listeners.append(quiet.on_tick)
    ticker.start()
    gc_watch.frozen = apply_gc_policy(policy)
    return quiet


def apply_gc_policy(policy: str) -> int:
    """Apply ``GC_POLICY`` (see the module docstring); the objects it froze."""
    if policy == "default":
        return 0
    gc.collect()
    gc.freeze()
    gc.set_threshold(*TUNED_THRESHOLDS)
    frozen = gc.get_freeze_count()
    log.info("gc: policy tuned: %d objects frozen, thresholds %s", frozen, TUNED_THRESHOLDS)
    return frozen
