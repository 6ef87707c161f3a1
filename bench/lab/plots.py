"""The lab report's figures: PNG files drawn by matplotlib's Agg canvas from a :class:`Results`.

Each drawing function writes one PNG and returns its path, or returns None (and writes
nothing) when the results hold no data for it. Figures of several repeats show medians
with min-max whiskers; every axis names its unit and every latency figure names the
driver that measured it, since the fast driver (open loop) and Locust (closed loop) are
not comparable. The grouping the report's tables use (:func:`compared_steps`,
:func:`spread`) lives here too, so tables and figures always show the same numbers.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bench.lab.results import HEADLINE_SLO_MS, SEED_SLO_MS, Results, Run, Sample, Step

if TYPE_CHECKING:
    from bench.lab.ladder import Ladder

#: what each driver is, as the figures and tables name it
DRIVER_TITLES = {
    "fast": "fast driver (open loop)",
    "fast+deflate": "fast driver with permessage-deflate",
    "locust": "Locust (closed loop)",
}
DRIVER_ORDER = ("fast", "locust")
#: the percentiles the latency figure shows (max and p999 are in the tables)
PLOTTED_PERCENTILES = ("p50", "p90", "p95", "p99")
#: CPU bands: percentiles of the half-second samples inside windows this long
CPU_WINDOW_S = 5.0
CPU_BAND = (10, 90)
DPI = 100
_MIB = 2**20


@dataclass(frozen=True)
class StepKey:
    """Which steps are compared across configurations: one driver's step of one name."""

    driver: str
    name: str
    offered_per_s: float | None

    @property
    def title(self) -> str:
        """E.g. ``fast driver (open loop), rate 4000/s``."""
        return f"{DRIVER_TITLES.get(self.driver, self.driver)}, {self.name}"


@dataclass(frozen=True)
class Spread:
    """One figure over a configuration's repeats: median, min, max and how many."""

    median: float
    low: float
    high: float
    n: int


@dataclass(frozen=True)
class Plot:
    """One figure of the report: its file, or why there is none."""

    name: str
    title: str
    path: Path | None
    skipped: str = ""  # the reason, when path is None


def spread(values: Iterable[float | None]) -> Spread | None:
    """Median, min and max of the values that are not None (None if there are none)."""
    known = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not known:
        return None
    return Spread(statistics.median(known), min(known), max(known), len(known))


def config_names(results: Results) -> list[str]:
    """Every configuration, in the matrix's order, then any that only the runs name."""
    names = list(results.configs)
    names += [r.config for r in results.runs if r.config not in names]
    return list(dict.fromkeys(names))


def config_colors(results: Results) -> dict[str, tuple[float, ...]]:
    """One colour per configuration, the same in every figure."""
    palette = [tuple(c) for c in _tab_colors()]
    return {name: palette[i % len(palette)] for i, name in enumerate(config_names(results))}


def measured_runs(results: Results) -> list[Run]:
    """The runs whose figures count: every run that did not fail."""
    return [r for r in results.runs if r.status != "failed"]


def compared_steps(results: Results) -> dict[StepKey, dict[str, list[tuple[Run, Step]]]]:
    """Steps grouped by (driver, step name), then by configuration, in repeat order.

    Keys come fast driver first (by offered rate), then Locust; configurations in the
    matrix's order. Failed runs are left out, and so are the steps of a capacity climb
    (each configuration climbs its own rates: the ladder shows them, per configuration);
    the cost steps a climbing run makes first are kept (every rung runs the same rates).
    """
    groups: dict[StepKey, dict[str, list[tuple[Run, Step]]]] = {}
    for run in measured_runs(results):
        for step in run.steps:
            if run.knee and step.driver == "fast" and not step.cost:
                continue
            key = StepKey(step.driver, step.name, step.offered_per_s)
            groups.setdefault(key, {}).setdefault(run.config, []).append((run, step))
    order = {name: i for i, name in enumerate(config_names(results))}

    def rank(key: StepKey) -> tuple[int, float, str]:
        driver = DRIVER_ORDER.index(key.driver) if key.driver in DRIVER_ORDER else 99
        return driver, key.offered_per_s or 0.0, key.name

    return {
        key: {
            c: sorted(groups[key][c], key=lambda rs: rs[0].repeat)
            for c in sorted(groups[key], key=lambda c: order.get(c, 999))
        }
        for key in sorted(groups, key=rank)
    }


def room_members(step: Step) -> float:
    """Deliveries per message sent (the room size the driver used), 1 if unknown."""
    return step.expected / step.sent if step.sent else 1.0


def samples_during(run: Run, role: str, step: Step | None = None) -> tuple[list[Sample], bool]:
    """``role``'s samples while ``step`` ran, and True; the whole run's and False when the
    step's start is unknown or no sample falls inside it."""
    samples = run.samples.get(role, [])
    if step is not None and step.started_s is not None:
        start, end = step.started_s, step.started_s + step.duration_s
        inside = [s for s in samples if start <= s.t_s <= end]
        if inside:
            return inside, True
    return samples, False


# --- the figures ------------------------------------------------------------------------


def latency_percentiles(results: Results, out_png: Path, driver: str) -> Path | None:
    """Fan-out p50/p90/p95/p99 per configuration, one panel per step of ``driver``.

    Dots are medians over repeats, whiskers min-max, on a log axis; a red line marks the
    headline SLO (p99 < 100 ms) and grey ticks the seed report's p90/p95/p99 bounds.
    """
    groups = {k: v for k, v in compared_steps(results).items() if k.driver == driver}
    if not groups:
        return None
    colors = config_colors(results)
    fig, axes = new_figure(len(groups), cols=2 if len(groups) > 1 else 1, row_height=3.6)
    for ax, (key, by_config) in zip(axes, groups.items(), strict=False):
        width = 0.8 / max(1, len(by_config))
        for i, (config, pairs) in enumerate(by_config.items()):
            xs, meds, lows, highs = [], [], [], []
            for j, p in enumerate(PLOTTED_PERCENTILES):
                figure = spread(s.latency_ms.get(p) for _, s in pairs)
                if figure is None or figure.low <= 0:
                    continue  # not measured (a log axis has no 0)
                xs.append(j - 0.4 + width * (i + 0.5))
                meds.append(figure.median)
                lows.append(max(figure.median - figure.low, 0.0))
                highs.append(max(figure.high - figure.median, 0.0))
            n = len(pairs)
            ax.errorbar(
                xs,
                meds,
                yerr=[lows, highs],
                fmt="o",
                ms=5,
                capsize=3,
                color=colors.get(config),
                label=f"{config} (n={n})",
            )
        for p, bound in HEADLINE_SLO_MS.items():
            ax.axhline(
                bound, color="black", ls="--", lw=1.2, label=f"headline SLO: {p} < {bound:g} ms"
            )
        for j, p in enumerate(PLOTTED_PERCENTILES):
            if p in SEED_SLO_MS:
                ax.hlines(
                    SEED_SLO_MS[p],
                    j - 0.45,
                    j + 0.45,
                    color="0.45",
                    ls=":",
                    lw=1.5,
                    label="seed SLO (p90 200, p95 500, p99 1000 ms)" if p == "p99" else None,
                )
        _log_y(ax)
        ax.set_xticks(range(len(PLOTTED_PERCENTILES)), PLOTTED_PERCENTILES)
        ax.set_xlim(-0.5, len(PLOTTED_PERCENTILES) - 0.5)
        ax.set_xlabel("percentile of fan-out latency")
        ax.set_ylabel("fan-out latency (ms, log scale)")
        ax.set_title(key.title, fontsize=10)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    _figure_legend(fig, axes)
    fig.suptitle(
        f"Fan-out latency percentiles, {DRIVER_TITLES.get(driver, driver)}: "
        "median over repeats, whiskers min-max"
    )
    return save_png(fig, out_png)


def latency_over_time(results: Results, out_png: Path, driver: str) -> Path | None:
    """p50 and p99 over time per configuration, with Locust's users (or the fast driver's
    offered rate) on a second axis; one panel per configuration, its median repeat."""
    panels: list[tuple[str, Run]] = []
    for config in config_names(results):
        runs = [r for r in measured_runs(results) if r.config == config]
        runs = [r for r in runs if any(s.driver == driver and s.timeline for s in r.steps)]
        if runs:
            panels.append((config, _median_run(runs, driver)))
    if not panels:
        return None
    colors = config_colors(results)
    load_label = "users" if driver == "locust" else "offered (messages/s)"
    fig, axes = new_figure(len(panels), row_height=2.8)
    for ax, (config, run) in zip(axes, panels, strict=False):
        t, p50, p99, load = _timeline(run, driver)
        twin = ax.twinx()
        twin.fill_between(t, load, step="post", color="0.6", alpha=0.18, lw=0)
        twin.step(t, load, where="post", color="0.45", lw=1, label=load_label)
        twin.set_ylabel(load_label)
        twin.set_ylim(0, max(load, default=0) * 1.3 or 1)  # headroom: keeps it off the SLO line
        ax.set_zorder(twin.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.plot(t, p99, color=colors.get(config), lw=1.6, label="p99")
        ax.plot(t, p50, color=colors.get(config), lw=1.2, ls="--", label="p50")
        for p, bound in HEADLINE_SLO_MS.items():
            ax.axhline(bound, color="black", ls="--", lw=1, label=f"SLO {p} < {bound:g} ms")
        if np.isfinite(np.asarray(p99 + p50, dtype=float)).any():
            _log_y(ax)
        ax.set_ylabel("fan-out latency (ms)")
        ax.set_title(f"{config} (repeat {run.repeat + 1})", fontsize=10)
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        more, more_labels = twin.get_legend_handles_labels()
        ax.legend(handles + more, labels + more_labels, fontsize=7, loc="upper left")
    axes[len(panels) - 1].set_xlabel(
        "seconds into the Locust run"
        if driver == "locust"
        else "seconds since the driver's first step"
    )
    fig.suptitle(
        f"Fan-out latency over time, {DRIVER_TITLES.get(driver, driver)} "
        "(per configuration, the repeat with the median p99)"
    )
    return save_png(fig, out_png)


def cpu_bands(results: Results, out_png: Path) -> Path | None:
    """Server CPU% per configuration as a p10-p90 band of its half-second samples within
    rolling 5 s windows, with the median line; the load generator's in grey beside it.
    Repeats are pooled, each on its own clock from its first sample."""
    panels = [
        c
        for c in config_names(results)
        if any(r.samples.get("server") for r in measured_runs(results) if r.config == c)
    ]
    if not panels:
        return None
    colors = config_colors(results)
    fig, axes = new_figure(len(panels), row_height=2.3, sharex=True)
    for ax, config in zip(axes, panels, strict=False):
        runs = [r for r in measured_runs(results) if r.config == config]
        for role, color, alpha, ls in (
            ("generator", (0.55, 0.55, 0.55), 0.18, ":"),
            ("server", colors.get(config), 0.3, "-"),
        ):
            t, cpu = _pooled(runs, role, lambda s: s.cpu_percent)
            if not t.size:
                continue
            centers, low, mid, high = _rolling_band(t, cpu)
            label = "server" if role == "server" else "load generator"
            ax.fill_between(centers, low, high, color=color, alpha=alpha, lw=0)
            ax.plot(
                centers,
                mid,
                color=color,
                ls=ls,
                lw=1.4,
                label=f"{label}: median, band p{CPU_BAND[0]}-p{CPU_BAND[1]}",
            )
        ax.set_ylabel("CPU (% of one core)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{config} ({len(runs)} repeat{'s' if len(runs) != 1 else ''})", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[len(panels) - 1].set_xlabel("seconds since the run's first sample")
    fig.suptitle(
        f"CPU over time: median and p{CPU_BAND[0]}-p{CPU_BAND[1]} of the 0.5 s samples "
        f"in rolling {CPU_WINDOW_S:g} s windows"
    )
    return save_png(fig, out_png)


def throughput(results: Results, out_png: Path) -> Path | None:
    """Delivered messages/s against offered load (fast driver: offered rate x room
    members, with the ideal y = x) and against users (Locust), one line per configuration."""
    groups = compared_steps(results)
    colors = config_colors(results)
    fast: dict[str, list[tuple[float, Spread]]] = {}
    for key, by_config in groups.items():
        if key.driver != "fast" or key.offered_per_s is None:
            continue
        for config, pairs in by_config.items():
            members = statistics.median(room_members(s) for _, s in pairs)
            delivered = spread(s.delivered_per_s for _, s in pairs)
            if delivered is not None:
                fast.setdefault(config, []).append((key.offered_per_s * members, delivered))
    locust: dict[str, list[tuple[float, float]]] = {}
    for run in measured_runs(results):
        for step in run.steps:
            if step.driver != "locust":
                continue
            points = [(p.users, p.delivered_per_s) for p in step.timeline if p.users > 0]
            locust.setdefault(run.config, []).extend(
                points or [(step.connections, step.delivered_per_s)]
            )
    panels = [name for name, data in (("fast", fast), ("locust", locust)) if data]
    if not panels:
        return None
    fig, axes = new_figure(len(panels), cols=len(panels), row_height=4.2)
    for ax, panel in zip(axes, panels, strict=False):
        if panel == "fast":
            top = 0.0
            for config, points in fast.items():
                points.sort(key=lambda p: p[0])
                x = [p[0] for p in points]
                y = [p[1].median for p in points]
                err = [
                    [p[1].median - p[1].low for p in points],
                    [p[1].high - p[1].median for p in points],
                ]
                ax.errorbar(
                    x,
                    y,
                    yerr=err,
                    marker="o",
                    ms=4,
                    capsize=3,
                    color=colors.get(config),
                    label=config,
                )
                top = max(top, *x, *(p[1].high for p in points))
            ax.plot(
                [0, top], [0, top], color="0.5", ls="--", lw=1, label="ideal: delivered = offered"
            )
            ax.set_xlabel("offered deliveries/s (messages/s sent x room members)")
            ax.set_title(DRIVER_TITLES["fast"], fontsize=10)
        else:
            for config, points in locust.items():
                by_users: dict[int, list[float]] = {}
                for users, rate in points:
                    by_users.setdefault(users, []).append(rate)
                users = sorted(by_users)
                ax.plot(
                    users,
                    [statistics.median(by_users[u]) for u in users],
                    marker=".",
                    color=colors.get(config),
                    label=config,
                )
            ax.set_xlabel("Locust users")
            ax.set_title(f"{DRIVER_TITLES['locust']}: median over seconds and repeats", fontsize=10)
        ax.set_ylabel("delivered messages/s")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_formatter(_THOUSANDS)
        ax.yaxis.set_major_formatter(_THOUSANDS)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Delivered messages/s against offered load")
    return save_png(fig, out_png)


def capacity_ladder(results: Results, out_png: Path) -> Path | None:
    """One bar per climbed chat configuration (its median knee over repeats, min-max
    whiskers, hatched and marked "≥" when a lower bound), the relays as lines; under it,
    when the run measured them, each rung's and relay's CPU µs per delivered frame at each
    cost rate (median, min-max whiskers)."""
    from bench.lab.ladder import ladder

    found = ladder(results)
    if found is None or not found.chat_rungs:
        return None
    rungs = found.chat_rungs
    fig, axes = new_figure(2 if found.cost_rates else 1, row_height=4.6)
    ax = axes[0]
    colors = config_colors(results)
    x = np.arange(len(rungs))
    for i, rung in enumerate(rungs):
        ax.bar(
            i,
            rung.median,
            width=0.6,
            color=colors.get(rung.config),
            alpha=0.85,
            hatch="//" if rung.lower_bound else None,
            edgecolor="0.25",
        )
        ax.errorbar(
            i,
            rung.median,
            yerr=[[rung.median - rung.low], [rung.high - rung.median]],
            color="0.1",
            capsize=6,
            lw=1.2,
        )
        if rung.driver_ceiling:
            ax.plot(
                [i - 0.35, i + 0.35],
                [rung.driver_ceiling] * 2,
                color="crimson",
                lw=2,
                label="the driver's ceiling at that shape" if i == 0 else None,
            )
        ax.annotate(
            rung.label() + (" (driver-limited)" if rung.driver_limited else ""),
            (i, rung.high),
            textcoords="offset points",
            xytext=(0, 4),
            ha="center",
            fontsize=8,
        )
    styles = ("--", ":", "-.")
    for k, relay in enumerate(found.relays):
        ax.axhline(
            relay.median,
            color="0.3",
            ls=styles[k % len(styles)],
            lw=1.3,
            label=f"{relay.config}: {relay.label()}/s",
        )
    ax.set_xticks(x, [r.config for r in rungs], rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("knee: delivered messages/s at fan-out p99 < 100 ms")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(_THOUSANDS)
    ax.grid(True, axis="y", alpha=0.3)
    if found.relays or any(r.driver_ceiling for r in rungs):
        ax.legend(fontsize=8, loc="upper left")
    n = max(len(r.knees) for r in rungs)
    if found.cost_rates:
        _cost_panel(axes[1], found)
    fig.suptitle(
        f"Capacity ladder: median knee over {n} repeat(s), min-max whiskers; hatched = lower bound"
    )
    return save_png(fig, out_png)


def _cost_panel(ax: Axes, found: Ladder) -> None:
    """Each rung's (relays last) CPU µs per delivered frame, one bar per cost rate."""
    from bench.lab.ladder import delivered_label

    rungs = [r for r in found.rungs if r.costs]
    room = rungs[0].room_size if rungs else 10
    width = 0.8 / len(found.cost_rates)
    for k, rate in enumerate(found.cost_rates):
        xs, medians, lows, highs = [], [], [], []
        for i, rung in enumerate(rungs):
            cost = rung.costs.get(rate)
            if cost is None or cost.median is None:
                continue
            xs.append(i - 0.4 + width * (k + 0.5))
            medians.append(cost.median)
            lows.append(cost.median - min(cost.known))
            highs.append(max(cost.known) - cost.median)
        ax.bar(xs, medians, width=width * 0.9, label=f"at {delivered_label(rate, room)}")
        ax.errorbar(xs, medians, yerr=[lows, highs], fmt="none", color="0.1", capsize=3, lw=1)
        for x, m in zip(xs, medians, strict=True):
            ax.annotate(
                f"{m:.1f}",
                (x, m),
                textcoords="offset points",
                xytext=(0, 3),
                ha="center",
                fontsize=7,
            )
    ax.set_xticks(
        np.arange(len(rungs)),
        [r.config + (" (relay)" if r.target == "relay" else "") for r in rungs],
        rotation=15,
        ha="right",
        fontsize=8,
    )
    ax.set_ylabel("server CPU µs per delivered frame")
    ax.set_ylim(bottom=0)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")


def server_tail(run: Run, out_png: Path) -> Path | None:
    """One run's fan-out latency per second (fast driver; stalled seconds shaded) over the
    server's own view of the same seconds: GC pause time by generation, event-loop lag
    and commit time (``Run.metric_series``), with its notable events (``Run.tail_events``)."""
    points = [p for s in run.steps if s.driver == "fast" for p in s.timeline if p.p99_ms]
    if not points or not run.metric_series:
        return None
    stalls = [t for s in run.steps if s.driver == "fast" for t in s.stall_s]
    fig, axes = new_figure(3, row_height=1.9, sharex=True)
    ax = axes[0]
    ax.plot([p.t_s for p in points], [p.p99_ms for p in points], ".-", ms=3, lw=1, label="p99")
    ax.plot(
        [p.t_s for p in points], [p.p50_ms or 0 for p in points], ".-", ms=2, lw=0.8, label="p50"
    )
    for t in stalls:
        ax.axvspan(t - 1, t, color="red", alpha=0.2, lw=0)
    _log_y(ax)
    ax.set_ylabel("fan-out ms")
    ax.legend(fontsize=7, loc="upper left")
    series = run.metric_series
    t = [p["t_s"] for p in series[1:]]

    def per_second(key: str) -> list[float]:
        return [max(0.0, b.get(key, 0.0) - a.get(key, 0.0)) for a, b in itertools.pairwise(series)]

    ax = axes[1]
    for generation in "012":
        paused = per_second(f"chat_gc_pause_seconds_sum{{generation={generation}}}")
        if any(paused):
            ax.plot(t, [v * 1e3 for v in paused], lw=1, label=f"GC gen{generation} ms/s")

    def mean_ms(family: str) -> list[float]:
        """Per second: the histogram's mean observation, in ms (0 when none)."""
        sums, counts = per_second(f"{family}_sum"), per_second(f"{family}_count")
        return [1e3 * s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)]

    ax.plot(t, mean_ms("chat_loop_lag_seconds"), lw=1, label="mean loop lag ms")
    late = [e for e in run.tail_events if e["kind"] == "loop_lag"]
    if late:
        ax.plot(
            [e["t_s"] for e in late],
            [e["ms"] for e in late],
            "v",
            ms=4,
            label="late tick (≥ 10 ms)",
        )
    ax.set_ylabel("ms")
    ax.legend(fontsize=7, loc="upper left", ncols=3)
    ax = axes[2]
    ax.plot(t, mean_ms("chat_commit_seconds"), lw=1, label="mean commit ms")
    slow = [e for e in run.tail_events if e["kind"] in ("commit", "checkpoint")]
    for kind, marker in (("commit", "o"), ("checkpoint", "s")):
        marked = [e for e in slow if e["kind"] == kind]
        if marked:
            ax.plot(
                [e["t_s"] for e in marked],
                [e["ms"] for e in marked],
                marker,
                ms=4,
                label=f"slow {kind}",
            )
    ax.set_ylabel("ms")
    ax.set_xlabel("seconds since the run started")
    ax.legend(fontsize=7, loc="upper left", ncols=3)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{run.config}, repeat {run.repeat + 1}: latency, and the server's tail under it")
    return save_png(fig, out_png)


def rss_over_time(results: Results, out_png: Path) -> Path | None:
    """Server RSS over time, one line per run, coloured by configuration."""
    colors = config_colors(results)
    series = [(r, r.samples["server"]) for r in measured_runs(results) if r.samples.get("server")]
    if not series:
        return None
    fig, axes = new_figure(1, row_height=4.0)
    ax = axes[0]
    labelled: set[str] = set()
    for run, samples in series:
        t0 = samples[0].t_s
        ax.plot(
            [s.t_s - t0 for s in samples],
            [s.rss_bytes / _MIB for s in samples],
            color=colors.get(run.config),
            lw=1.2,
            alpha=0.8,
            label=None if run.config in labelled else run.config,
        )
        labelled.add(run.config)
    ax.set_xlabel("seconds since the run's first sample")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Server resident memory over time (one line per repeat)")
    return save_png(fig, out_png)


def draw_all(results: Results, plots_dir: Path) -> list[Plot]:
    """Draw every figure into ``plots_dir``; a figure without data is listed with the reason."""
    plots: list[Plot] = []

    def add(name: str, title: str, path: Path | None, missing: str) -> None:
        plots.append(Plot(name, title, path, "" if path else missing))

    add(
        "ladder",
        "Capacity ladder",
        capacity_ladder(results, plots_dir / "ladder.png"),
        "no configuration was climbed to its knee in these results",
    )
    for driver in DRIVER_ORDER:
        title = DRIVER_TITLES[driver]
        add(
            f"latency-{driver}",
            f"Fan-out latency percentiles, {title}",
            latency_percentiles(results, plots_dir / f"latency-{driver}.png", driver),
            f"no {title} step in these results",
        )
    for driver in ("locust", "fast"):
        title = DRIVER_TITLES[driver]
        add(
            f"latency-time-{driver}",
            f"Latency over time, {title}",
            latency_over_time(results, plots_dir / f"latency-time-{driver}.png", driver),
            f"no {title} step with a timeline in these results",
        )
    add(
        "cpu",
        "CPU over time (p10-p90 bands)",
        cpu_bands(results, plots_dir / "cpu.png"),
        "no server CPU samples in these results",
    )
    add(
        "throughput",
        "Delivered against offered load",
        throughput(results, plots_dir / "throughput.png"),
        "no fast-driver or Locust step in these results",
    )
    add(
        "rss",
        "Server RSS over time",
        rss_over_time(results, plots_dir / "rss.png"),
        "no server memory samples in these results",
    )
    return plots


# --- helpers ----------------------------------------------------------------------------

_THOUSANDS = FuncFormatter(lambda v, _pos: f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}")


def _tab_colors() -> Sequence[tuple[float, ...]]:
    from matplotlib import colormaps

    return [tuple(c) for c in colormaps["tab10"].colors]  # type: ignore[attr-defined]


def new_figure(
    panels: int, cols: int = 1, row_height: float = 3.0, sharex: bool = False
) -> tuple[Figure, list[Axes]]:
    """A figure on an Agg canvas with ``panels`` axes (unused grid cells hidden)."""
    rows = math.ceil(panels / cols)
    fig = Figure(figsize=(11 if cols > 1 else 10, row_height * rows + 0.7), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(rows, cols, squeeze=False, sharex=sharex)
    axes = [ax for row in grid for ax in row]
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


def _log_y(ax: Axes) -> None:
    """A log y axis labelled in plain numbers (1, 2, 5, 10, 20, ...), not powers of ten."""
    ax.set_yscale("log")

    def minor(value: float, _pos: object) -> str:
        mantissa = round(value / 10 ** math.floor(math.log10(value))) if value > 0 else 0
        return f"{value:g}" if mantissa in (2, 5) else ""

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def _figure_legend(fig: Figure, axes: list[Axes]) -> None:
    """One legend below the panels with every label any panel has, each once."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    fig.legend(
        list(entries.values()),
        list(entries),
        loc="outside lower center",
        ncols=min(3, len(entries)),
        fontsize=8,
    )


def save_png(fig: Figure, out_png: Path) -> Path:
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=DPI, format="png")
    return out_png


def _median_run(runs: list[Run], driver: str) -> Run:
    """The run whose mean p99 over ``driver``'s steps is the median (lower middle)."""

    def score(run: Run) -> float:
        p99 = [s.latency_ms.get("p99", 0.0) for s in run.steps if s.driver == driver]
        return statistics.fmean(p99) if p99 else 0.0

    ordered = sorted(runs, key=score)
    return ordered[(len(ordered) - 1) // 2]


def _timeline(run: Run, driver: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """Time (s since the driver's first point), p50, p99 and load of ``run``'s ``driver`` steps.

    One driver's steps share its clock; a step whose clock starts again is laid after the last.
    """
    t: list[float] = []
    p50: list[float] = []
    p99: list[float] = []
    load: list[float] = []
    offset: float | None = None
    for step in run.steps:
        if step.driver != driver or not step.timeline:
            continue
        first = step.timeline[0].t_s
        if offset is None:
            offset = -first
        elif t and first + offset <= t[-1]:
            offset = t[-1] + 1.0 - first
        for point in step.timeline:
            t.append(point.t_s + offset)
            p50.append(_positive(point.p50_ms))
            p99.append(_positive(point.p99_ms))
            load.append(point.users if driver == "locust" else step.offered_per_s or 0.0)
    return t, p50, p99, load


def _positive(value: float | None) -> float:
    """``value`` for a log axis: NaN (a gap) when it is missing or not above 0 (Locust
    reports 0 for a second without a percentile)."""
    return value if value is not None and value > 0 else math.nan


def _pooled(runs: list[Run], role: str, value: object) -> tuple[np.ndarray, np.ndarray]:
    """Every run's ``role`` samples as (seconds since that run's first sample, value)."""
    t: list[float] = []
    v: list[float] = []
    for run in runs:
        samples = run.samples.get(role, [])
        if not samples:
            continue
        t0 = samples[0].t_s
        t += [s.t_s - t0 for s in samples]
        v += [value(s) for s in samples]  # type: ignore[operator]
    return np.asarray(t, dtype=float), np.asarray(v, dtype=float)


def _rolling_band(
    t: np.ndarray, v: np.ndarray, window_s: float = CPU_WINDOW_S
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Centres every 0.5 s and the p10, median and p90 of the values within ±window/2."""
    centers = np.arange(t.min(), t.max() + 0.25, 0.5)
    low, mid, high = [], [], []
    for c in centers:
        inside = v[(t >= c - window_s / 2) & (t <= c + window_s / 2)]
        q = np.percentile(inside, [CPU_BAND[0], 50, CPU_BAND[1]])
        low.append(q[0])
        mid.append(q[1])
        high.append(q[2])
    return centers, np.asarray(low), np.asarray(mid), np.asarray(high)
