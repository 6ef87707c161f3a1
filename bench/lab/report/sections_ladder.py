"""The report's sections on climbs: the findings it opens with, the capacity ladder of
knees with its sweep over connection counts, and why the tail moved."""

from __future__ import annotations

from pathlib import Path

from bench.lab.findings import findings, floor_fraction
from bench.lab.ladder import (
    Comparison,
    Ladder,
    Rung,
    by_connections,
    compare,
    deflate_label,
    delivered_label,
    floor_text,
)
from bench.lab.plots import Plot, server_tail
from bench.lab.report.analysis import Analysis
from bench.lab.report.formatting import DASH, EMPTY, GENERATOR_LIMITED, num, slug
from bench.lab.report.model import Block, Bullets, Heading, Image, Para, Table
from bench.lab.results import HEADLINE_SLO_MS, Results
from bench.lab.tailwatch import likely_cause


def findings_blocks(analysis: Analysis, plots: list[Plot], out_dir: Path) -> list[Block]:
    """The sentences the report opens with (what was busy and what that voided first), and
    the capacity-ladder chart under them."""
    found = analysis.ladder
    if found is None:
        if not analysis.machine.windows:
            return []
        return [Heading(2, "Findings"), Bullets([analysis.machine.sentence()])]
    blocks: list[Block] = [Heading(2, "Findings"), Bullets(findings(found))]
    chart = next((p for p in plots if p.name == "ladder" and p.path is not None), None)
    if chart is not None and chart.path is not None:
        blocks.append(Image(chart.path, chart.path.relative_to(out_dir).as_posix(), chart.title))
    return blocks


def ladder_blocks(found: Ladder | None) -> list[Block]:
    """Every climbed configuration: its knees and CPU per frame, its multiples of the
    baseline and of the relays with their verdicts, the shape it was measured at, and its
    climb's steps."""
    if found is None:
        return []
    room = found.rungs[0].room_size if found.rungs else 10
    blocks: list[Block] = [
        Heading(2, "Capacity ladder"),
        Para(
            "Each configuration's knee: the highest delivered messages/s whose fan-out p99 "
            "stayed under the SLO with nothing lost, found by the fast driver's climb "
            "(multiply the offered rate while it holds, then bisect to within "
            f"{found.resolution * 100:.0f} %). A difference is claimed only when it holds in every "
            f"repeat and exceeds the noise floor, here {floor_text(found.floor)} "
            f"({found.floor_source}), and no step that decided it was busy on the server's "
            "own core (a busy climb step is measured again, at most twice); otherwise it "
            'reads "not confirmed" with the reason. '
            "\u2265 marks a knee that is only a lower bound (the driver was the limit, or "
            "nothing broke up to the climb's top rate). Beside each knee, the server's CPU "
            "µs per delivered message frame at each stated cost rate (median over the paired "
            "rounds, or over repeats, min\u2013max): it holds where a knee is only a "
            "lower bound."
        ),
    ]
    relays = found.relays
    header = ["configuration", "knee (median)", "min\u2013max", "per repeat", "kind"]
    header += ["driver ceiling", "of its transport's floor", "vs baseline"]
    header += [f"vs {r.config}" for r in relays]
    header += [f"µs/frame at {delivered_label(rate, room)}" for rate in found.cost_rates]
    header += ["stalls / re-runs / busy re-runs"]
    rows = []
    for rung in found.rungs:
        versus = found.against_baseline.get(rung.config)
        if rung is found.baseline:
            cell = "baseline"
        elif versus is None:
            cell = EMPTY
        else:
            cell = f"{versus.ratio_text()} {_claim(versus)}"
        row = [
            rung.config + (" (relay)" if rung.target == "relay" else ""),
            rung.label() + (" (driver-limited)" if rung.driver_limited else ""),
            f"{rung.low:,.0f}{DASH}{rung.high:,.0f}",
            ", ".join(f"{k:,.0f}" for k in rung.knees),
            rung.knee_kind(),
            f"{rung.driver_ceiling:,.0f}" if rung.driver_ceiling else EMPTY,
            floor_fraction(rung, found.floors[rung.transport])
            if rung.transport in found.floors and rung.target == "chat"
            else EMPTY,
            cell,
        ]
        for relay in relays:
            comparison = found.against_relays.get(rung.config, {}).get(relay.config)
            row.append(comparison.ratio_text() if comparison else EMPTY)
        row += [
            rung.costs[rate].label() if rate in rung.costs else EMPTY for rate in found.cost_rates
        ]
        row.append(f"{rung.stalled_steps} / {rung.reruns} / {rung.busy_reruns}")
        rows.append(row)
    blocks.append(Table(header, rows))
    blocks += cost_blocks(found)
    blocks.append(
        Table(
            [
                "configuration",
                "connections",
                "room size",
                "body chars",
                "send frame bytes",
                "deflate (the server's reply)",
            ],
            [
                [
                    r.config,
                    f"{r.connections:,}",
                    str(r.room_size),
                    str(r.body_chars),
                    str(r.frame_bytes),
                    deflate_label(r.deflate, r.deflate_params),
                ]
                for r in found.rungs
            ],
        )
    )
    groups = by_connections(found)
    if len(groups) > 1:
        blocks += _sweep(groups, found.resolution)
    for rung in found.rungs:
        blocks.append(Heading(3, f"Climb: {rung.config}"))
        steps = [
            [
                str(run.repeat + 1),
                f"{s.offered_per_s or 0:,.0f}",
                f"{s.delivered_per_s:,.0f}",
                num(s.latency_ms.get("p99")),
                num(s.latency_ms.get("max")),
                "\u2713" if s.holds(HEADLINE_SLO_MS) else "\u2717",
                ", ".join(f"{t:.0f} s" for t in s.stall_s) or EMPTY,
                "re-run" if s.rerun else "superseded" if s.superseded else "",
                GENERATOR_LIMITED if s.generator_limited else "",
            ]
            for run in rung.runs
            for s in run.steps
            if s.driver == "fast"
        ]
        blocks.append(
            Table(
                [
                    "repeat",
                    "offered sends/s",
                    "delivered/s",
                    "p99 ms",
                    "max ms",
                    "held",
                    "stalled seconds",
                    "",
                    "driver limit",
                ],
                steps,
            )
        )
    return blocks


def cost_blocks(found: Ladder) -> list[Block]:
    """Each chat rung's CPU per frame against the rung before it, the baseline and its
    transport's relay, at every cost rate, with the verdicts."""
    if not found.cost_rates:
        return []
    room = found.rungs[0].room_size if found.rungs else 10
    rows = []
    for rung in found.chat_rungs:
        for rate in found.cost_rates:
            cost = rung.costs.get(rate)
            if cost is None:
                continue
            rows.append(
                [
                    rung.config,
                    delivered_label(rate, room),
                    cost.label(),
                    EMPTY if cost.wire_median is None else f"{cost.wire_median:.1f}",
                    *(
                        _cost_claim(table.get(rung.config, {}).get(rate))
                        for table in (
                            found.cost_vs_previous,
                            found.cost_vs_baseline,
                            found.cost_vs_relay,
                        )
                    ),
                ]
            )
    floors = "; ".join(
        f"{floor_text(found.cost_floor[rate][0])} at {delivered_label(rate, room)}"
        for rate in found.cost_rates
        if rate in found.cost_floor
    )
    return [
        Heading(3, "What a frame costs"),
        Para(
            "The server's CPU (user + system of its process tree, read by the driver over "
            "each cost step's send phase) divided by the message frames room members "
            "received; acks are not counted (the chat server writes N+1 frames per send, a "
            "relay N). Beside it, the bytes each delivered message took on the wire (websocket "
            "header and payload, compressed where deflate was negotiated; median over "
            "rounds), as the driver read them. The configurations that can share the "
            "server's core were started together and their cost steps taken one at a time, "
            "A B B A, so that each comparison is a list of pairs taken seconds apart. A "
            "ratio is the geometric mean of its pairs' ratios with its 95 % t interval and "
            "the number of pairs, below 1 costs less; confirmed when the whole interval lies "
            f"beyond the A/A pair's floor ({floors or 'none measured'}: how far the same "
            "statistic over the A/A pairs reaches from 1), whatever the machine did. The "
            "rung before is the ladder's previous step (for an A/A twin, its original)."
        ),
        Table(
            [
                "configuration",
                "at",
                "µs/frame",
                "wire bytes/message",
                "vs the rung before",
                "vs the baseline",
                "vs its transport's relay",
            ],
            rows,
        ),
    ]


def _cost_claim(comparison: Comparison | None) -> str:
    if comparison is None or not comparison.ratios:
        return EMPTY
    if comparison.verdict == "not confirmed":
        return f"{comparison.ratio_text()} (not confirmed: {comparison.reason})"
    what = "costs less" if comparison.verdict == "lower" else "costs more"
    return f"{comparison.ratio_text()} ({what}, confirmed; vs {comparison.reference})"


def tail_blocks(results: Results, out_dir: Path) -> list[Block]:
    """Why the tail moved: per configuration, its latency over time above the server's GC
    pauses, loop lag and commits; every stalled second with its likely cause."""
    watched = [r for r in results.runs if r.metric_series or r.tail_events]
    if not watched:
        return []
    blocks: list[Block] = [
        Heading(2, "Why the tail moved"),
        Para(
            "The server's own view, read about once a second while it was driven: GC pause "
            "time by generation, event-loop lag (a 10 ms ticker's lateness; ticks 10 ms or "
            "more late are marked), commit time, and the notable events it keeps (GC pauses "
            "of 50 ms or more, slow commits and checkpoints of 10 ms or more). Red bands mark "
            "the seconds a climb step stalled (p99 over 10\u00d7 the step's median, or no "
            "delivery); each is named below with the likeliest cause the server saw."
        ),
    ]
    rows = []
    for run in results.runs:
        for step in run.steps:
            for t in step.stall_s:
                point = next((p for p in step.timeline if p.t_s == t), None)
                p99 = num(point.p99_ms) if point is not None else EMPTY
                cause = (
                    likely_cause(run.tail_events, t - 1.0, t)
                    if run.metric_series or run.tail_events
                    else "the server's tail was not read (relay, or metrics off)"
                )
                note = (
                    "re-run"
                    if step.rerun
                    else "superseded by its re-run"
                    if step.superseded
                    else ""
                )
                rows.append(
                    [run.config, str(run.repeat + 1), step.name, f"{t:.0f} s", p99, cause, note]
                )
    if rows:
        blocks.append(
            Table(["configuration", "repeat", "step", "second", "p99 ms", "likely cause", ""], rows)
        )
    else:
        blocks.append(Para("No step stalled: no second passed 10\u00d7 its step's median p99."))
    summary = []
    for run in watched:
        events = run.tail_events
        gc = [e for e in events if e["kind"] == "gc"]
        late = [e for e in events if e["kind"] == "loop_lag"]
        slow = [e for e in events if e["kind"] in ("commit", "checkpoint")]
        summary.append(
            [
                run.config,
                str(run.repeat + 1),
                f"{len(gc)}" + (f" (max {max(e['ms'] for e in gc):.0f} ms)" if gc else ""),
                f"{len(late)}" + (f" (max {max(e['ms'] for e in late):.0f} ms)" if late else ""),
                f"{len(slow)}" + (f" (max {max(e['ms'] for e in slow):.0f} ms)" if slow else ""),
            ]
        )
    blocks.append(
        Table(
            ["configuration", "repeat", "GC pauses ≥ 50 ms", "late ticks ≥ 10 ms", "slow commits"],
            summary,
        )
    )
    shown: set[str] = set()
    for run in watched:
        if run.config in shown:
            continue
        stalled = [r for r in watched if r.config == run.config and any(s.stall_s for s in r.steps)]
        chosen = stalled[0] if stalled else run
        path = server_tail(chosen, out_dir / "plots" / f"tail-{slug(run.config)}.png")
        if path is None:
            continue
        shown.add(run.config)
        blocks.append(Heading(3, f"{run.config}: latency over time, the server's tail under it"))
        blocks.append(Image(path, path.relative_to(out_dir).as_posix(), f"tail of {run.config}"))
    return blocks


def _claim(comparison: Comparison) -> str:
    if comparison.verdict == "not confirmed":
        return f"not confirmed: {comparison.reason}"
    return f"({comparison.verdict}, confirmed)"


def _sweep(groups: dict[int, list[Rung]], resolution: float) -> list[Block]:
    """How the verdict moves with the connection count: each count's knees and ratios
    (told apart by the climb's ``resolution``)."""
    blocks: list[Block] = [
        Heading(3, "The shape is part of the result: by connection count"),
        Para(
            "The same configurations climbed at each connection count. A ratio measured at one "
            "count does not carry to another: read each row on its own."
        ),
    ]
    rows = []
    for count, rungs in groups.items():
        chats = [r for r in rungs if r.target == "chat"]
        relays = [r for r in rungs if r.target == "relay"]
        for chat in chats:
            ratios = [
                f"{compare(chat, relay, resolution).ratio_text()} of {relay.config}"
                for relay in relays
            ]
            rows.append([f"{count:,}", chat.config, chat.label(), "; ".join(ratios) or EMPTY])
    blocks.append(Table(["connections", "configuration", "knee", "against the relay"], rows))
    return blocks
