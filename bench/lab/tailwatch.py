"""The server's own view of its tail while the lab drives it: what the report shows under a
configuration's latency-over-time plot, and what it names as a stall's likely cause.

A :class:`TailWatch` thread reads, about once a second, the chat server's Prometheus
``/metrics`` (the GC pause, event-loop lag and commit histograms' counts and sums, the store
queue, process CPU) into ``Run.metric_series``, and its ``/stats`` ``tail`` section (the
notable GC pauses, late loop ticks, slow commits and checkpoints, each with its unix time)
into ``Run.tail_events``, on the samples' clock (``t_s``). ``/stats`` keeps only the last 64
events of each kind, so it is read while the run goes, not once at the end.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from chatlab.harness import pin_this_thread

#: the series kept each second (prefixes of scrape_metrics' keys)
KEPT = (
    "chat_gc_pause_seconds_count",
    "chat_gc_pause_seconds_sum",
    "chat_loop_lag_seconds_count",
    "chat_loop_lag_seconds_sum",
    "chat_commit_seconds_count",
    "chat_commit_seconds_sum",
    "chat_store_queue_depth",
    "process_cpu_seconds_total",
)
INTERVAL_S = 1.0


def tail_events(tail: dict[str, Any], unix_t0: float) -> list[dict[str, Any]]:
    """``/stats``' ``tail`` section as events on the samples' clock (``t_s`` = unix time
    less ``unix_t0``), each ``{"kind", "t_s", "ms"}`` (GC pauses with ``generation``).
    A commit or checkpoint is stamped when it ended: its ``t_s`` is when it began."""
    events: list[dict[str, Any]] = []
    for pause in tail.get("gc", {}).get("notable", []):
        events.append(
            {
                "kind": "gc",
                "t_s": round(pause["at"] - pause["pause_s"] - unix_t0, 3),
                "ms": round(pause["pause_s"] * 1e3, 1),
                "generation": pause["generation"],
            }
        )
    for tick in tail.get("loop_lag", {}).get("notable", []):
        events.append(
            {
                "kind": "loop_lag",
                "t_s": round(tick["at"] - tick["lag_s"] - unix_t0, 3),
                "ms": round(tick["lag_s"] * 1e3, 1),
            }
        )
    for kind, key in (("commit", "slow_commits"), ("checkpoint", "slow_checkpoints")):
        for event in tail.get(key, []):  # stamped when it ended
            took = event["took_s"]
            events.append(
                {
                    "kind": kind,
                    "t_s": round(event["at"] - took - unix_t0, 3),
                    "ms": round(took * 1e3, 1),
                }
            )
    return sorted(events, key=lambda e: e["t_s"])


def likely_cause(events: list[dict[str, Any]], start_s: float, end_s: float) -> str:
    """The likeliest cause the server saw of a stall in ``[start_s, end_s]``: its longest
    GC pause, slow commit or checkpoint overlapping it (a late loop tick says the loop was
    held but not by what), as "gen2 GC of 145 ms at 11.7 s"; or that it saw nothing."""
    overlapping = [e for e in events if e["t_s"] <= end_s and e["t_s"] + e["ms"] / 1e3 >= start_s]
    causes = [e for e in overlapping if e["kind"] != "loop_lag"]
    if causes:
        worst = max(causes, key=lambda e: e["ms"])
        what = {
            "gc": f"gen{worst.get('generation', '?')} GC",
            "commit": "commit",
            "checkpoint": "WAL checkpoint",
        }[worst["kind"]]
        return f"{what} of {worst['ms']:.0f} ms at {worst['t_s']:.1f} s"
    lags = [e for e in overlapping if e["kind"] == "loop_lag"]
    if lags:
        worst = max(lags, key=lambda e: e["ms"])
        return (
            f"the event loop was held {worst['ms']:.0f} ms at {worst['t_s']:.1f} s "
            "(no GC pause or slow commit seen then)"
        )
    return "nothing the server saw (no GC pause, slow commit or late loop tick): the driver's side?"


class TailWatch:
    """A thread reading the server's metrics and tail events while a run is driven."""

    def __init__(
        self,
        scrape: Callable[[int], dict[str, float]],
        metrics_port: int,
        stats_url: str,
        t0_monotonic: float,
        cores: list[int] | None = None,
        *,
        stats_context: ssl.SSLContext | None = None,
    ) -> None:
        self._scrape = scrape
        self._stats_context = stats_context  # verifies an https:// stats_url
        self._cores = cores  # where its thread runs: the generator's cores
        self._port = metrics_port
        self._stats_url = stats_url
        self._t0 = t0_monotonic
        self.series: list[dict[str, float]] = []
        self._events: dict[tuple[str, float], dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-tailwatch", daemon=True)

    def start(self) -> TailWatch:
        self._thread.start()
        return self

    def stop(self) -> tuple[list[dict[str, float]], list[dict[str, Any]]]:
        """Stop (after one last read); the series and the events, in time order."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._read_events()
        events = sorted(self._events.values(), key=lambda e: e["t_s"])
        return self.series, events

    def _run(self) -> None:
        pin_this_thread(self._cores)
        beat = 0
        while not self._stop.wait(INTERVAL_S):
            with suppress(OSError, ValueError):
                values = self._scrape(self._port)
                point = {"t_s": round(time.monotonic() - self._t0, 3)}
                point.update({k: v for k, v in values.items() if k.startswith(KEPT)})
                self.series.append(point)
            beat += 1
            if beat % 5 == 0:
                self._read_events()

    def _read_events(self) -> None:
        with suppress(OSError, ValueError, KeyError):
            with urllib.request.urlopen(
                self._stats_url, timeout=5, context=self._stats_context
            ) as reply:
                tail = json.loads(reply.read())["tail"]
            unix_t0 = time.time() - (time.monotonic() - self._t0)
            for event in tail_events(tail, unix_t0):
                self._events[(event["kind"], round(event["t_s"], 2))] = event
