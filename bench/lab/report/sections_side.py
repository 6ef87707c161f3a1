"""The report's section on what a configuration costs besides CPU: bytes on the wire per
delivered message and memory per connection (:mod:`bench.lab.side`), beside its CPU µs
per delivered frame and knee, with a figure of both."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench.lab.ladder import Ladder, delivered_label
from bench.lab.plots import config_colors, new_figure, save_png
from bench.lab.report.formatting import DASH, EMPTY, TIMES
from bench.lab.report.model import Block, Heading, Image, Para, Table
from bench.lab.results import Results, Run

#: bench.wire's body sets, in the order the report shows them, and what they are
BODY_SETS = {
    "demo": "the demo's bodies (23 characters: a marker and a send time)",
    "chat": "20 to 80 characters of words",
    "long": "400 to 1,000 characters of words",
}
TRAFFIC = {"idle": "idle", "after": "after traffic"}


@dataclass
class SideFigures:
    """One configuration's side measurements, over its repeats."""

    config: str
    deflate: str  # its WS_DEFLATE
    negotiated: str = ""  # the server's Sec-WebSocket-Extensions reply to bench.wire
    # body set -> per repeat: bytes on the wire per delivered message, and plain
    wire: dict[str, list[float]] = field(default_factory=dict)
    plain: dict[str, list[float]] = field(default_factory=dict)
    chars: dict[str, float] = field(default_factory=dict)  # body set -> mean body length
    # traffic mode -> per repeat: bytes of RSS per connection
    memory: dict[str, list[float]] = field(default_factory=dict)
    connections: int = 0  # bench.memory's connection count
    skipped: str = ""

    def wire_median(self, kind: str) -> float | None:
        values = self.wire.get(kind)
        return statistics.median(values) if values else None

    def memory_kib(self, traffic: str) -> float | None:
        values = self.memory.get(traffic)
        return statistics.median(values) / 1024 if values else None


def side_figures(results: Results) -> list[SideFigures]:
    """Every configuration with a side measurement (or a reason it has none), in matrix order."""
    by_config: dict[str, list[Run]] = {}
    for run in results.runs:
        if run.wire or run.memory or run.side_skipped:
            by_config.setdefault(run.config, []).append(run)
    out = []
    for name in [c for c in results.configs if c in by_config]:
        runs = by_config[name]
        figures = SideFigures(name, runs[0].env.get("WS_DEFLATE", "off"))
        for run in runs:
            for row in run.wire:
                kind = row["bodies"]
                figures.wire.setdefault(kind, []).append(row["wire_bytes_per_delivery"])
                figures.plain.setdefault(kind, []).append(row["plain_bytes_per_delivery"])
                figures.chars[kind] = row["body_chars_mean"]
                figures.negotiated = row.get("negotiated", "") or figures.negotiated
            for row in run.memory:
                figures.memory.setdefault(row["traffic"], []).append(row["bytes_per_connection"])
                figures.connections = int(row["connections"])
        if not figures.wire and not figures.memory:
            figures.skipped = next((r.side_skipped for r in runs if r.side_skipped), "")
        out.append(figures)
    return out


def side_blocks(results: Results, found: Ladder | None, out_dir: Path) -> list[Block]:
    """Bytes on the wire and memory per connection beside CPU per frame and knee, and
    their figure."""
    figures = side_figures(results)
    measured = [f for f in figures if f.wire or f.memory]
    if not measured:
        return []
    rungs = {r.config: r for r in (found.rungs if found else [])}
    rates = found.cost_rates if found else []
    room = found.rungs[0].room_size if found and found.rungs else 10
    kinds = [k for k in BODY_SETS if any(k in f.wire for f in measured)]
    traffics = [t for t in TRAFFIC if any(t in f.memory for f in measured)]
    connections = max(f.connections for f in measured)
    chars = {k: next(f.chars[k] for f in measured if k in f.chars) for k in kinds}
    header = ["configuration", "WS_DEFLATE"]
    header += [f"µs/frame at {delivered_label(rate, room)}" for rate in rates]
    header += ["knee (delivered/s)"] if rungs else []
    header += [f"wire bytes/message, {k} ({chars[k]:.0f} chars)" for k in kinds]
    header += [f"KiB/connection, {TRAFFIC[t]}" for t in traffics]
    rows = []
    for f in figures:
        rung = rungs.get(f.config)
        row = [f.config, f.deflate]
        row += [
            rung.costs[rate].label() if rung and rate in rung.costs else EMPTY for rate in rates
        ]
        row += [rung.label() if rung else EMPTY] if rungs else []
        if f.skipped:
            rows.append(row + [f"not measured: {f.skipped}"] + [""] * (len(header) - len(row) - 1))
            continue
        for kind in kinds:
            wire, plain = f.wire_median(kind), f.plain.get(kind)
            if wire is None or not plain:
                row.append(EMPTY)
                continue
            share = wire / statistics.median(plain)
            row.append(f"{wire:.1f} ({TIMES}{share:.2f} of plain)")
        row += [_kib(f.memory_kib(t), f.memory.get(t, [])) for t in traffics]
        rows.append(row)
    blocks: list[Block] = [
        Heading(2, "Bytes on the wire and memory per connection"),
        Para(
            "Measured after each repeat of a configuration, on a server of its own started "
            "with the configuration's settings (the lab's server stopped first): bytes on "
            "the wire per delivered message (python -m bench.wire: rooms of 10 whose members "
            "offer permessage-deflate as browsers do and take turns sending; each message "
            "frame's websocket header and payload as they came off the wire, compressed "
            "where deflate was negotiated; "
            + "; ".join(f"{k}: {BODY_SETS[k]}" for k in kinds)
            + ") and memory per connection (python -m bench.memory: the server's RSS over "
            f"{connections:,} connections, idle, then after each has sent one message and "
            "received its room's ten). Medians over repeats, the range where they "
            f"differ; {TIMES} of plain is against the same messages without compression. "
            "Beside them, the configuration's CPU per delivered frame and knee from the "
            "capacity ladder, and the driver's own bytes per message are in its cost table."
        ),
        Table(header, rows),
    ]
    png = side_plot(results, measured, kinds, traffics, out_dir / "plots" / "side.png")
    if png is not None:
        title = "Bytes on the wire per delivered message and memory per connection"
        blocks.append(Image(png, png.relative_to(out_dir).as_posix(), title))
    return blocks


def _kib(median: float | None, values: list[float]) -> str:
    if median is None:
        return EMPTY
    low, high = min(values) / 1024, max(values) / 1024
    spread = f" ({low:.1f}{DASH}{high:.1f})" if high - low >= 0.05 else ""
    return f"{median:.1f}{spread}"


def side_plot(
    results: Results,
    figures: list[SideFigures],
    kinds: list[str],
    traffics: list[str],
    out_png: Path,
) -> Path | None:
    """Two panels of grouped bars, one bar per configuration: bytes on the wire per
    delivered message by body set, and KiB per connection by traffic mode."""
    panels = [p for p in (kinds and "wire", traffics and "memory") if p]
    if not panels:
        return None
    colors = config_colors(results)
    fig, axes = new_figure(len(panels), cols=len(panels), row_height=4.0)
    width = 0.8 / max(1, len(figures))
    for ax, panel in zip(axes, panels, strict=True):
        groups = kinds if panel == "wire" else traffics
        for i, f in enumerate(figures):
            values = [
                (f.wire_median(g) if panel == "wire" else f.memory_kib(g)) or 0.0 for g in groups
            ]
            bars = ax.bar(
                [k + i * width - 0.4 + width / 2 for k in range(len(groups))],
                values,
                width,
                color=colors.get(f.config),
                label=f.config,
            )
            ax.bar_label(
                bars,
                fmt="%.0f" if panel == "wire" else "%.1f",
                fontsize=7,
                rotation=90 if len(figures) > 3 else 0,  # side by side, they would touch
                padding=2,
            )
        ax.set_xticks(range(len(groups)), [g if panel == "wire" else TRAFFIC[g] for g in groups])
        if panel == "wire":
            ax.set_ylabel("bytes on the wire per delivered message")
            ax.set_title("Bytes per delivered message, by body set")
        else:
            ax.set_ylabel("KiB of server RSS per connection")
            ax.set_title("Memory per connection")
        ax.margins(y=0.12)  # room for the labels above the tallest bar
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    return save_png(fig, out_png)
