"""``python -m bench.overload``: a fresh chat server past its knee and back.

Each run starts a fresh chat server pinned to one core (``bench.tail``'s
:func:`~bench.tail.start_server`: tokens, a metrics port, rate limits raised) and has the
lab's fast driver, pinned to another core, open ``--connections`` in rooms of 10 and
offer, as fixed-rate steps of ``--step-s`` back to back (no drain between them, so the
load rises and drops at one instant; a delivery counts to the second it arrives in,
whichever step sent it: the driver's ``--continuous``):

- ``--under`` (0.5) of the knee for ``--before-s`` (10),
- ``--over`` (1.15) of the knee for ``--over-s`` (30),
- the under rate again for ``--after-s`` (15).

The knee is ``--knee-rate`` (sends/s), or measured first with ``bench.tail``'s climb
(``--capacity-step-s``-second steps, p99 under 100 ms) on a fresh server with the first
variant's settings, and used for every variant: the same offered load for all.

The variants are ``--env NAME=VALUE`` as in ``bench.tail`` (each value of a name is one
variant). Unless one of them sets ``OVERLOAD_LAG_MS``, each is run twice: with
``OVERLOAD_LAG_MS=0`` (no load shedding: the server before it) and as given (the
shedder's defaults, 10 ms behind for 20 ms). ``--repeat`` alternates them.

Meanwhile the server's ``/metrics`` is scraped every 0.5 s. Per second the run keeps
what was offered, sent and delivered, the fan-out p99 of what arrived in it, the sends
the shedder refused (``chat_overload_refused_total``) and the other ``unavailable``
answers, among them the store's own refusals (``chat_store_refused_total``: its queue
full, its WAL full), and at most the server's RSS, its store's queue depth, its outbound bytes and
whether it was shedding. Per variant and run, the verdicts the overload target asks for
(at 1.15x the knee for 30 s: queues and memory within their bounds, what is answered
answered within the SLO or refused, p99 back under the SLO within 5 s of the load
dropping), each with its figure:

- during the overload, the p99 of what was delivered against ``--slo-ms`` (100), and the
  share of the sends answered ``unavailable``;
- the store's queue depth at most against ``STORE_QUEUE_MAX``, the outbound bytes at most
  against ``MAX_OUTBOUND_BYTES`` x connections, the RSS at most against its most before
  the overload;
- after the drop, the recovery: seconds until p99 was under the SLO and stayed there to
  the end (``--recovery-s``, 5, the target).

It prints a line per step of the schedule while a run goes, each run's seconds and
verdicts after it, a summary at the end, writes everything as JSON (``--json``; by
default ``reports/<time>-overload/overload.json``) and a PNG (``--plot``; by default next
to the JSON): per variant, p99 per second (log scale) and refused/s against time, the
overload shaded.

A load measurement owns the machine: nothing else heavy may run meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

from bench.lab.driver.latency import HIST_DIGITS, HIST_MAX_US, HIST_MIN_US
from bench.lab.matrix import Load
from bench.lab.plots import new_figure, save_png
from bench.tail import (
    drive,
    measure_capacity,
    parse_variants,
    scrape,
    start_server,
    variant_name,
)
from chat_server.settings import SPECS
from chatlab.harness import ROOT, pin_this_thread
from chatlab.settings import parse_core_list

#: the metrics each second reads (as :func:`bench.tail.scrape` names them)
REFUSED = "chat_overload_refused_total{}"
UNAVAILABLE = "chat_errors_total{code=unavailable}"
SHEDDING = "chat_overload_shedding{}"
RSS = "process_resident_memory_bytes{}"
QUEUE = "chat_store_queue_depth{}"
OUTBOUND = "chat_outbound_buffer_bytes{}"
#: the history store's own refusals (answered unavailable, never stored), by reason
STORE_QUEUE_FULL = "chat_store_refused_total{reason=queue_full}"
STORE_WAL_FULL = "chat_store_refused_total{reason=wal_full}"
#: counters read as a rate per second, gauges as their most in the second
RATES = {
    "refused_per_s": REFUSED,
    "unavailable_per_s": UNAVAILABLE,
    "store_queue_full_per_s": STORE_QUEUE_FULL,
    "store_wal_full_per_s": STORE_WAL_FULL,
}
GAUGES = {"rss_bytes": RSS, "queue_depth": QUEUE, "outbound_bytes": OUTBOUND, "shedding": SHEDDING}
SCRAPE_EVERY_S = 0.5
#: the variant without load shedding, run beside each one that does not set it
NO_SHEDDING = {"overload_lag_ms": "0"}
PHASES = ("before", "over", "after")


@dataclass(frozen=True)
class Schedule:
    """The rates of one run: ``before_steps`` steps at ``under_rate``, ``over_steps`` at
    ``over_rate``, ``after_steps`` at ``under_rate``, each ``step_s`` long, back to back."""

    knee_rate: float
    under_rate: float
    over_rate: float
    step_s: float
    before_steps: int
    over_steps: int
    after_steps: int

    @property
    def rates(self) -> tuple[float, ...]:
        """One offered rate (sends/s) per step."""
        return (
            (self.under_rate,) * self.before_steps
            + (self.over_rate,) * self.over_steps
            + (self.under_rate,) * self.after_steps
        )

    @property
    def over_start_s(self) -> float:
        """When the overload begins, in seconds from the first step's start."""
        return self.before_steps * self.step_s

    @property
    def drop_s(self) -> float:
        """When the load drops back, in seconds from the first step's start."""
        return (self.before_steps + self.over_steps) * self.step_s

    @property
    def total_s(self) -> float:
        """The schedule's length in seconds."""
        return len(self.rates) * self.step_s

    def phase(self, step: int) -> str:
        """``before``, ``over`` or ``after``: the phase of step number ``step`` (from 0)."""
        if step < self.before_steps:
            return "before"
        return "over" if step < self.before_steps + self.over_steps else "after"

    def started_s(self, steps: list[dict[str, Any]], step: int) -> float:
        """When step number ``step`` began, in seconds from the first step's start, as the
        driver ran them (each step begins a little after the one before ends)."""
        return round(steps[step]["started_s"] - steps[0]["started_s"], 3)


def make_schedule(
    knee_rate: float,
    *,
    under: float,
    over: float,
    before_s: float,
    over_s: float,
    after_s: float,
    step_s: float,
) -> Schedule:
    """The schedule around ``knee_rate`` (sends/s); each phase a whole number (at least
    one) of ``step_s`` steps, else ValueError naming the phase."""
    if not knee_rate > 0 or not 0 < under < over or not step_s > 0:
        raise ValueError("needs a knee rate > 0, 0 < under < over and a step > 0")
    counts = []
    for name, seconds in (("--before-s", before_s), ("--over-s", over_s), ("--after-s", after_s)):
        steps = round(seconds / step_s)
        if steps < 1 or not math.isclose(steps * step_s, seconds):
            raise ValueError(f"{name} {seconds:g}: allowed: a multiple of --step-s {step_s:g}")
        counts.append(steps)
    return Schedule(knee_rate, round(under * knee_rate), round(over * knee_rate), step_s, *counts)


def per_second(
    steps: list[dict[str, Any]],
    scrapes: list[tuple[float, dict[str, float]]],
    t0: float,
    schedule: Schedule,
) -> list[dict[str, Any]]:
    """One row per second of the driver's timeline (``t_s``: its end, in seconds from
    the first step's start): its step's phase, offered, sent and delivered per second and p99
    (ms; None: nothing arrived), and from the scrapes (monotonic times, ``t0`` the
    driver's origin) the counters' rates over the scrapes bracketing the second and the
    gauges' most among the scrapes inside it (None where none was)."""
    if not steps:
        return []
    origin = steps[0]["started_s"]
    rows = []
    for index, step in enumerate(steps):
        start = step["started_s"]
        for point in step["timeline"]:
            end = point["t_s"]
            row: dict[str, Any] = {
                "t_s": round(end - origin, 3),
                "phase": schedule.phase(index),
                "offered_per_s": step["offered_per_s"],
                "sent_per_s": point["sent_per_s"],
                "delivered_per_s": point["delivered_per_s"],
                "p99_ms": point["p99_ms"],
            }
            row |= server_second(scrapes, t0 + start, t0 + end)
            rows.append(row)
            start = end
    return rows


def server_second(
    scrapes: list[tuple[float, dict[str, float]]], start: float, end: float
) -> dict[str, float | None]:
    """The server over ``[start, end]`` (monotonic): :data:`RATES` per second, each
    counter read at both ends by :func:`counter_at`, and :data:`GAUGES` at most among the
    scrapes inside; None what no scrape says."""
    figures: dict[str, float | None] = {}
    for key, name in RATES.items():
        first, last = counter_at(scrapes, start, name), counter_at(scrapes, end, name)
        figures[key] = (
            None if first is None or last is None else round((last - first) / (end - start), 1)
        )
    if figures["refused_per_s"] is not None and figures["unavailable_per_s"] is not None:
        # refused sends are unavailable errors too: the rest is what else answered so
        figures["unavailable_per_s"] = round(
            max(0.0, figures["unavailable_per_s"] - figures["refused_per_s"]), 1
        )
    inside = [s[1] for s in scrapes if start <= s[0] <= end]
    for key, name in GAUGES.items():
        values = [s[name] for s in inside if name in s]
        figures[key] = max(values) if values else None
    return figures


def counter_at(scrapes: list[tuple[float, dict[str, float]]], at: float, name: str) -> float | None:
    """Counter ``name`` at ``at`` (monotonic), linear between the scrapes either side
    (a counter absent from a scrape is 0 there); None outside the scrapes."""
    before = max((s for s in scrapes if s[0] <= at), key=lambda s: s[0], default=None)
    after = min((s for s in scrapes if s[0] >= at), key=lambda s: s[0], default=None)
    if before is None or after is None:
        return None
    low, high = before[1].get(name, 0.0), after[1].get(name, 0.0)
    if after[0] == before[0]:
        return low
    return low + (high - low) * (at - before[0]) / (after[0] - before[0])


def recovery_s(rows: list[dict[str, Any]], drop_s: float, slo_ms: float) -> float | None:
    """Seconds from ``drop_s`` until the per-second p99 was under ``slo_ms`` and stayed
    there to the last row: the end of the last second after the drop that was not (a
    second that sent but had nothing arrive counts as not), 0 when none; None when the
    last second still was not (it did not recover within the rows)."""
    after = [r for r in rows if r["t_s"] > drop_s]
    if not after:
        return None
    bad = [r for r in after if not _under(r, slo_ms)]
    if not bad:
        return 0.0
    if bad[-1] is after[-1]:
        return None
    return round(bad[-1]["t_s"] - drop_s, 1)


def _under(row: dict[str, Any], slo_ms: float) -> bool:
    p99 = row["p99_ms"]
    if p99 is None:
        return not row["sent_per_s"]  # nothing sent, nothing owed
    return p99 < slo_ms


def share(part: float, whole: float) -> float | None:
    """``part / whole``, None when ``whole`` is 0."""
    return part / whole if whole else None


def merged_percentile_ms(steps: list[dict[str, Any]], percentile: float) -> float | None:
    """The ``percentile`` (ms) of every delivery of ``steps`` (their HDR histograms
    merged); None when none arrived."""
    merged = HdrHistogram(HIST_MIN_US, HIST_MAX_US, HIST_DIGITS)
    for step in steps:
        if step.get("histogram"):
            merged.decode_and_add(step["histogram"])
    if not merged.get_total_count():
        return None
    return merged.get_value_at_percentile(percentile) / 1000


def bounds(env: dict[str, str], connections: int) -> dict[str, int]:
    """The server's bounds the run is held to: ``STORE_QUEUE_MAX``, and
    ``MAX_OUTBOUND_BYTES`` times the connections (from ``env``, else the defaults)."""
    defaults = {spec.env: spec.default for spec in SPECS}

    def setting(name: str) -> int:
        return int(env.get(name.lower(), defaults[name]))

    return {
        "queue_depth": setting("STORE_QUEUE_MAX"),
        "outbound_bytes": setting("MAX_OUTBOUND_BYTES") * connections,
    }


@dataclass
class Verdict:
    """What one run says against the overload target (see the module's docstring)."""

    slo_ms: float
    recovery_target_s: float
    over_p99_ms: float | None  # every delivery that arrived during the overload
    over_worst_second_p99_ms: float | None
    over_sent: int
    over_unavailable: int  # answered unavailable during the overload (the driver's count)
    over_refused_share: float | None
    over_delivered_per_s: float
    server_refused: float  # the shedder's count over the whole run
    other_unavailable: float
    # of the other unavailable, the store's refusals: STORE_QUEUE_MAX reached, the WAL full
    store_queue_full: float
    store_wal_full: float
    queue_depth_max: float | None
    queue_bound: int
    outbound_max_bytes: float | None
    outbound_bound_bytes: int
    rss_before_bytes: float | None
    rss_max_bytes: float | None
    # seconds of the overload and after with no scrape inside: /metrics (on the server's
    # loop) did not answer, and the bounds' figures do not see them
    unscraped_s: int
    recovery_s: float | None
    after_p99_ms: float | None

    @property
    def held(self) -> dict[str, bool]:
        """Each part of the target: held or not (a figure not measured: not held)."""
        return {
            "answered within the SLO": self.over_p99_ms is not None
            and self.over_p99_ms < self.slo_ms,
            "queue within its bound": self.queue_depth_max is not None
            and self.queue_depth_max <= self.queue_bound,
            "outbound bytes within their bound": self.outbound_max_bytes is not None
            and self.outbound_max_bytes <= self.outbound_bound_bytes,
            "recovered in time": self.recovery_s is not None
            and self.recovery_s <= self.recovery_target_s,
        }

    def lines(self) -> list[str]:
        """The verdict lines, each with its figure."""
        mib = 2**20
        held = self.held

        def mark(key: str) -> str:
            return "holds" if held[key] else "MISSES"

        share_text = (
            "-" if self.over_refused_share is None else f"{100 * self.over_refused_share:.1f} %"
        )
        recovery = f"{self.recovery_s:g} s" if self.recovery_s is not None else "not within the run"
        return [
            f"overload: p99 of what was delivered {_ms(self.over_p99_ms)} (worst second"
            f" {_ms(self.over_worst_second_p99_ms)}) against the SLO {self.slo_ms:g} ms:"
            f" {mark('answered within the SLO')}; {self.over_delivered_per_s:,.0f}"
            f" delivered/s",
            f"overload: {self.over_unavailable} of {self.over_sent} sends answered unavailable"
            f" ({share_text}); the shedder refused {self.server_refused:.0f} in the run,"
            f" other unavailable {self.other_unavailable:.0f} (the store's: queue full"
            f" {self.store_queue_full:.0f}, WAL full {self.store_wal_full:.0f})",
            f"bounds: store queue at most {_num(self.queue_depth_max)} of STORE_QUEUE_MAX"
            f" {self.queue_bound}: {mark('queue within its bound')}; outbound at most"
            f" {_num(self.outbound_max_bytes, mib)} MiB of MAX_OUTBOUND_BYTES x connections"
            f" {self.outbound_bound_bytes / mib:g} MiB:"
            f" {mark('outbound bytes within their bound')};"
            f" RSS at most {_num(self.rss_max_bytes, mib)} MiB"
            f" ({_num(self.rss_before_bytes, mib)} MiB before the overload)"
            + (
                f"; /metrics did not answer in {self.unscraped_s} s of the overload and after"
                if self.unscraped_s
                else ""
            ),
            f"recovery: p99 under {self.slo_ms:g} ms for good {recovery} after the drop"
            f" (target {self.recovery_target_s:g} s): {mark('recovered in time')}; p99 after"
            f" the drop {_ms(self.after_p99_ms)}",
        ]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _num(value: float | None, unit: float = 1.0) -> str:
    return "-" if value is None else f"{value / unit:,.1f}" if unit != 1 else f"{value:,.0f}"


def judge(
    steps: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    schedule: Schedule,
    limits: dict[str, int],
    *,
    slo_ms: float,
    recovery_target_s: float,
) -> Verdict:
    """The run's :class:`Verdict` from the driver's steps and the per-second rows."""
    first, last = schedule.before_steps, schedule.before_steps + schedule.over_steps
    over = steps[first:last]
    after = steps[last:]
    sent = sum(s["sent"] for s in over)
    unavailable = sum(s.get("error_detail", {}).get("unavailable", 0) for s in over)

    def most(key: str, phases: tuple[str, ...]) -> float | None:
        values = [r[key] for r in rows if r["phase"] in phases and r[key] is not None]
        return max(values) if values else None

    def total(key: str) -> float:
        return sum(r.get(key) or 0.0 for r in rows)

    over_rows = [r for r in rows if r["phase"] == "over"]
    return Verdict(
        slo_ms=slo_ms,
        recovery_target_s=recovery_target_s,
        over_p99_ms=merged_percentile_ms(over, 99),
        over_worst_second_p99_ms=most("p99_ms", ("over",)),
        over_sent=sent,
        over_unavailable=unavailable,
        over_refused_share=share(unavailable, sent),
        over_delivered_per_s=(
            sum(r["delivered_per_s"] for r in over_rows) / len(over_rows) if over_rows else 0.0
        ),
        server_refused=round(total("refused_per_s")),
        other_unavailable=round(total("unavailable_per_s")),
        store_queue_full=round(total("store_queue_full_per_s")),
        store_wal_full=round(total("store_wal_full_per_s")),
        queue_depth_max=most("queue_depth", PHASES),
        queue_bound=limits["queue_depth"],
        outbound_max_bytes=most("outbound_bytes", PHASES),
        outbound_bound_bytes=limits["outbound_bytes"],
        rss_before_bytes=most("rss_bytes", ("before",)),
        rss_max_bytes=most("rss_bytes", PHASES),
        unscraped_s=sum(1 for r in rows if r["phase"] != "before" and r["rss_bytes"] is None),
        recovery_s=recovery_s(rows, schedule.started_s(steps, last), slo_ms),
        after_p99_ms=merged_percentile_ms(after, 99),
    )


def with_defaults(variants: list[dict[str, str]]) -> list[dict[str, str]]:
    """Each variant as given, and before it the same without load shedding
    (:data:`NO_SHEDDING`), unless a variant sets ``OVERLOAD_LAG_MS`` itself."""
    if any("overload_lag_ms" in v for v in variants):
        return variants
    return [w for v in variants for w in ({**v, **NO_SHEDDING}, v)]


def one_run(
    args: argparse.Namespace, env: dict[str, str], schedule: Schedule, workdir: Path
) -> dict[str, Any]:
    """One fresh server driven through ``schedule``: its steps (without histograms and
    timelines), its seconds and its verdict."""
    server, target, metrics_port = start_server(args, env, workdir)
    assert metrics_port is not None
    scrapes: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()
    t0 = time.monotonic()

    def scrape_loop() -> None:
        pin_this_thread(parse_core_list(args.driver_core))  # beside the driver, not the server
        told = time.monotonic()
        while not stop.is_set():
            with contextlib.suppress(OSError):  # not up yet, or gone
                scrapes.append((time.monotonic(), scrape(metrics_port)))
            if len(scrapes) > 1 and scrapes[-1][0] - told >= schedule.step_s:
                told = scrapes[-1][0]
                print(progress(scrapes, told - t0), file=sys.stderr, flush=True)
            stop.wait(SCRAPE_EVERY_S)

    scraper = threading.Thread(target=scrape_loop, daemon=True)
    out = workdir / "driver.json"
    load = Load(
        connections=args.connections,
        rates=schedule.rates,
        step_s=schedule.step_s,
        warmup_s=args.warmup_s,
        drain_s=0,
    )
    try:
        scraper.start()
        status = drive(
            args,
            env,
            target,
            load,
            json_out=out,
            log_path=workdir / "driver.log",
            timeout_s=schedule.total_s + args.warmup_s + 300,
            t0_monotonic=t0,
            continuous=True,
        )
        if status != 0 or not out.exists():
            log = (workdir / "driver.log").read_text()[-2000:]
            raise RuntimeError(f"the driver exited {status}: {log}")
    finally:
        stop.set()
        scraper.join()
        server.stop()
    steps = json.loads(out.read_text())
    rows = per_second(steps, scrapes, t0, schedule)
    verdict = judge(
        steps,
        rows,
        schedule,
        bounds(env, args.connections),
        slo_ms=args.slo_ms,
        recovery_target_s=args.recovery_s,
    )
    kept = [{k: v for k, v in s.items() if k not in ("histogram", "timeline")} for s in steps]
    return {
        "variant": variant_name(env),
        "env": env,
        # as the driver ran them, in seconds from the first step's start
        "over_start_s": schedule.started_s(steps, schedule.before_steps),
        "drop_s": schedule.started_s(steps, schedule.before_steps + schedule.over_steps),
        "verdict": {**asdict(verdict), "held": verdict.held},
        "verdict_lines": verdict.lines(),
        "seconds": rows,
        "steps": kept,
    }


def progress(scrapes: list[tuple[float, dict[str, float]]], since_start_s: float) -> str:
    """A line on the server now (its last two scrapes), while a run goes."""
    figures = server_second(scrapes, scrapes[-2][0], scrapes[-1][0])
    rss = figures["rss_bytes"]
    return (
        f"  {since_start_s:5.0f} s: refused {_cell(figures['refused_per_s'], '.0f')}/s,"
        f" other unavailable {_cell(figures['unavailable_per_s'], '.0f')}/s, store queue"
        f" {_cell(figures['queue_depth'], '.0f')}, RSS"
        f" {_cell(None if rss is None else rss / 2**20, '.0f')} MiB"
        + (", shedding" if (figures["shedding"] or 0) >= 1 else "")
    )


def second_line(row: dict[str, Any]) -> str:
    """One second of a run as a table row (see :data:`SECOND_HEADER`)."""
    mib = 2**20
    shedding = "yes" if (row["shedding"] or 0) >= 1 or (row["refused_per_s"] or 0) > 0 else ""
    return (
        f"{row['t_s']:>6.0f} {row['phase']:<7}{row['offered_per_s']:>9.0f}"
        f"{row['delivered_per_s']:>11.0f}{_cell(row['p99_ms'], '.1f'):>9}"
        f"{_cell(row['refused_per_s'], '.0f'):>9}{_cell(row['unavailable_per_s'], '.0f'):>7}"
        f"{_cell(row['queue_depth'], '.0f'):>7}"
        f"{_cell(None if row['outbound_bytes'] is None else row['outbound_bytes'] / mib, '.1f'):>9}"
        f"{_cell(None if row['rss_bytes'] is None else row['rss_bytes'] / mib, '.0f'):>7}"
        f"  {shedding}"
    )


SECOND_HEADER = (
    f"{'t s':>6} {'phase':<7}{'offered':>9}{'deliv/s':>11}{'p99 ms':>9}{'refused':>9}"
    f"{'unav':>7}{'queue':>7}{'out MiB':>9}{'RSS':>7}  shedding"
)


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def plot(runs: list[dict[str, Any]], schedule: Schedule, slo_ms: float, out_png: Path) -> Path:
    """Per variant, p99 per second (log scale, each run a line) and refused/s (right
    axis) against time, the overload shaded and the SLO drawn."""
    names = list(dict.fromkeys(run["variant"] for run in runs))
    fig, axes = new_figure(len(names), row_height=3.2, sharex=True)
    # one refused/s scale for every panel, so that the variants compare at a glance
    most_refused = max(r["refused_per_s"] or 0.0 for run in runs for r in run["seconds"])
    for ax, name in zip(axes, names, strict=True):
        first = next(r for r in runs if r["variant"] == name)
        ax.axvspan(first["over_start_s"], first["drop_s"], color="tab:red", alpha=0.08)
        ax.axhline(slo_ms, color="tab:red", linestyle="--", linewidth=0.8, label="SLO")
        refused_ax = ax.twinx()
        for run in (r for r in runs if r["variant"] == name):
            seconds = run["seconds"]
            t = [r["t_s"] for r in seconds]
            p99 = [r["p99_ms"] if r["p99_ms"] else math.nan for r in seconds]
            refused = [r["refused_per_s"] or 0.0 for r in seconds]
            ax.plot(t, p99, color="tab:blue", marker=".", linewidth=1, label="p99 ms")
            refused_ax.plot(t, refused, color="tab:orange", linewidth=1, label="refused/s")
        ax.set_yscale("log")
        ax.set_ylabel("fan-out p99 (ms)")
        refused_ax.set_ylabel("sends refused/s")
        refused_ax.set_ylim(0, max(10.0, 1.1 * most_refused))
        ax.set_title(
            f"{name}: {schedule.under_rate:g} → {schedule.over_rate:g} → "
            f"{schedule.under_rate:g} sends/s (overload shaded)",
            fontsize=9,
        )
        handles = ax.get_legend_handles_labels()
        more = refused_ax.get_legend_handles_labels()
        labels = dict(zip(handles[1] + more[1], handles[0] + more[0], strict=True))
        ax.legend(list(labels.values()), list(labels), loc="upper right", fontsize=7)
    axes[-1].set_xlabel("seconds from the first step")
    return save_png(fig, out_png)


def summary(runs: list[dict[str, Any]]) -> list[str]:
    """Per variant: each run's key figures and how many runs held each part."""
    lines: list[str] = []
    for name in dict.fromkeys(run["variant"] for run in runs):
        group = [r for r in runs if r["variant"] == name]
        lines.append(f"{name}: {len(group)} run(s)")
        for run in group:
            v = run["verdict"]
            share_text = (
                "-" if v["over_refused_share"] is None else f"{100 * v['over_refused_share']:.1f} %"
            )
            recovery = "none" if v["recovery_s"] is None else f"{v['recovery_s']:g} s"
            lines.append(
                f"    run {run['repeat']}: overload p99 {_ms(v['over_p99_ms'])}, refused"
                f" {share_text}, queue at most {_num(v['queue_depth_max'])}, recovery"
                f" {recovery}; "
                + ", ".join(f"{k}: {'yes' if ok else 'NO'}" for k, ok in v["held"].items())
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the schedule on every variant and print what each did."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.overload",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--knee-rate",
        type=float,
        metavar="SENDS_PER_S",
        help="the knee in sends/s [measured first with bench.tail's climb on the first"
        " variant's settings]",
    )
    parser.add_argument(
        "--under", type=float, default=0.5, help="of the knee, before and after [0.5]"
    )
    parser.add_argument("--over", type=float, default=1.15, help="of the knee, the overload [1.15]")
    parser.add_argument("--before-s", type=float, default=10, help="seconds under, first [10]")
    parser.add_argument("--over-s", type=float, default=30, help="seconds over [30]")
    parser.add_argument("--after-s", type=float, default=15, help="seconds under, after [15]")
    parser.add_argument(
        "--step-s", type=float, default=5, help="the driver's steps; divides each phase [5]"
    )
    parser.add_argument("--warmup-s", type=float, default=2, help="at the under rate, first [2]")
    parser.add_argument("--slo-ms", type=float, default=100, help="the p99 SLO [100]")
    parser.add_argument(
        "--recovery-s", type=float, default=5, help="the recovery target after the drop [5]"
    )
    parser.add_argument("--connections", type=int, default=2000, help="in rooms of 10 [2000]")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant [1]")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        help="server setting NAME=VALUE (repeatable; each value of a name is a variant)",
    )
    parser.add_argument("--server-core", default="0", help="the server's core [0]")
    parser.add_argument("--driver-core", default="1", help="the driver's core [1]")
    parser.add_argument(
        "--capacity-step-s", type=float, default=20, help="the climb's steps (s) [20]"
    )
    parser.add_argument(
        "--capacity-start-rate", type=float, default=10000, help="the climb's first rate [10000]"
    )
    parser.add_argument(
        "--capacity-max-rate", type=float, default=40000, help="the climb's top rate [40000]"
    )
    parser.add_argument(
        "--json", type=Path, help="write everything here [reports/<time>-overload/]"
    )
    parser.add_argument("--plot", type=Path, help="the PNG [next to the JSON]")
    args = parser.parse_args(argv)
    try:
        variants = with_defaults(parse_variants(args.env))
        if args.knee_rate is not None:
            # validates the phases before anything starts
            make_schedule(args.knee_rate, **_phases(args))
    except ValueError as exc:
        parser.error(str(exc))
    if args.json is None:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        args.json = ROOT / "reports" / f"{stamp}-overload" / "overload.json"
    plot_png = args.plot or args.json.with_suffix(".png")
    knee_rate, measured = args.knee_rate, args.knee_rate is None
    if knee_rate is None:
        name = variant_name(variants[0])
        print(f"climbing {name} ({args.capacity_step_s:g}-s steps)...", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="chatlab-overload-climb-") as tmp:
            knee_rate, bracketed = measure_capacity(args, variants[0], Path(tmp))
        print(
            f"knee of {name}: {'' if bracketed else '≥ '}{knee_rate:g} sends/s",
            file=sys.stderr,
        )
    try:
        schedule = make_schedule(knee_rate, **_phases(args))
    except ValueError as exc:
        parser.error(str(exc))
    print(
        f"{schedule.under_rate:g} sends/s for {args.before_s:g} s, {schedule.over_rate:g} for"
        f" {args.over_s:g} s, {schedule.under_rate:g} for {args.after_s:g} s (knee"
        f" {knee_rate:g}), {args.connections} connections, {len(variants)} variant(s) x"
        f" {args.repeat}",
        file=sys.stderr,
    )
    runs: list[dict[str, Any]] = []
    for k in range(args.repeat):
        for env in variants:
            name = variant_name(env)
            print(f"{name}, run {k + 1}: {schedule.total_s:g} s...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix="chatlab-overload-") as tmp:
                run = one_run(args, env, schedule, Path(tmp))
            run["repeat"] = k + 1
            runs.append(run)
            print(f"\n{name}, run {k + 1}:")
            print(SECOND_HEADER)
            for row in run["seconds"]:
                print(second_line(row))
            for line in run["verdict_lines"]:
                print(f"    {line}")
            sys.stdout.flush()
    print()
    for line in summary(runs):
        print(line)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "command": ["python", "-m", "bench.overload", *(argv or sys.argv[1:])],
                "knee_rate": knee_rate,
                "knee_measured": measured,
                "connections": args.connections,
                "slo_ms": args.slo_ms,
                "schedule": {**asdict(schedule), "rates": schedule.rates},
                "runs": runs,
            },
            indent=2,
        )
    )
    plot(runs, schedule, args.slo_ms, plot_png)
    print(f"wrote {args.json} and {plot_png}", file=sys.stderr)
    return 0


def _phases(args: argparse.Namespace) -> dict[str, float]:
    return {
        "under": args.under,
        "over": args.over,
        "before_s": args.before_s,
        "over_s": args.over_s,
        "after_s": args.after_s,
        "step_s": args.step_s,
    }


if __name__ == "__main__":
    sys.exit(main())
