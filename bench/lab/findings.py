"""The sentences a lab report opens with, written from a :class:`~bench.lab.ladder.Ladder`:
the machine first when it was busy, what a frame cost, what held, what differed against
which floor, each chat rung against its transport's floor, and what is not confirmed
and why. No I/O."""

from __future__ import annotations

import statistics

from bench.lab.ladder import (
    CEILING_SHARE,
    DASH,
    TIMES,
    Comparison,
    Ladder,
    Rung,
    delivered_label,
    floor_text,
)
from bench.lab.machine import OTHERS_LIMIT_PERCENT, STEAL_LIMIT_MS_PER_S
from bench.lab.pairs import COST_STEAL_LIMIT_MS_PER_S


def findings(found: Ladder) -> list[str]:
    """The sentences the report opens with: what was busy and what that voided (one line
    per kind of figure), then what a frame cost, what held, what differed, and what is
    not confirmed and why."""
    sentences = what_was_busy(found)
    base = found.baseline
    shape = _shape(found.rungs)
    if base is not None:
        sentences.append(
            f"{shape}: the baseline {base.config} held {base.label()} delivered/s "
            f"(median of {len(base.knees)}; {base.low:,.0f}{DASH}{base.high:,.0f})."
        )
    sentences += _cost_findings(found)
    sentences += [
        profiling_sentence(c, room_size=base.room_size if base else 10) for c in found.profiling
    ]
    higher = [c for c in found.against_baseline.values() if c.verdict == "higher"]
    lower = [c for c in found.against_baseline.values() if c.verdict == "lower"]
    unconfirmed = [c for c in found.against_baseline.values() if c.verdict == "not confirmed"]
    if higher or lower:
        parts = [f"{c.config} {c.ratio_text()}" for c in higher + lower]
        sentences.append(
            f"Knees confirmed against the baseline (every repeat, beyond the "
            f"{floor_text(found.floor)} floor): {'; '.join(parts)}."
        )
    if unconfirmed:
        parts = [f"{c.config} ({c.ratio_text()}: {c.reason})" for c in unconfirmed]
        sentences.append(f"Knees not confirmed: {'; '.join(parts)}.")
    limited = [r.config for r in found.rungs if r.driver_limited]
    if limited:
        sentences.append(
            f"The fast driver itself was the limit for {', '.join(limited)} (it saturated, or "
            f"the knee is above {CEILING_SHARE:.0%} of its ceiling at that shape): their knees "
            "are lower bounds and are not ranked; their CPU per frame is not bounded by the "
            "driver."
        )
    sentences += _floor_findings(found)
    kinds = sorted({r.knee_kind() for r in found.rungs})
    sentences.append(
        "Knees are "
        + " and ".join(kinds)
        + (
            ": a burst's knee is higher than a sustained one (set the matrix's sustain_s "
            "to hold 90 % of each knee afterwards)."
            if any(k.startswith("burst") for k in kinds)
            else "."
        )
    )
    for relay in found.relays:
        parts = []
        for rung in found.chat_rungs:
            comparison = found.against_relays.get(rung.config, {}).get(relay.config)
            if comparison is not None and comparison.ratios:
                doubt = "" if comparison.verdict != "not confirmed" else " (not confirmed)"
                parts.append(f"{rung.config} {comparison.ratio_text()}{doubt}")
        if parts:
            sentences.append(
                f"Knees against the relay {relay.config} ({relay.label()} delivered/s): "
                + "; ".join(parts)
                + "."
            )
    reruns = sum(r.reruns for r in found.rungs)
    stalled = sum(r.stalled_steps for r in found.rungs)
    if stalled:
        sentences.append(
            f"{stalled} climb step(s) showed a stall (a second over "
            f"10{TIMES} the step's median p99, "
            f"or with no delivery); {reruns} were run again and the re-run decided."
        )
    else:
        sentences.append("No climb step showed a stall.")
    sentences.append(found.machine.sentence())
    return sentences


def what_was_busy(found: Ladder) -> list[str]:
    """One line per kind of figure: what the machine did over its steps and what that
    voided (:data:`bench.lab.pairs.FIGURE_BOUNDS`). CPU per frame is judged against its
    paired A/A floor whatever the machine did; knees and percentiles are voided by a
    step whose server core was busy (:func:`bench.lab.pairs.step_busy`)."""
    bounds = (
        f"other work past {OTHERS_LIMIT_PERCENT:g} % of it or steal past "
        f"{STEAL_LIMIT_MS_PER_S:g} ms/s there"
    )
    lines = []
    if found.cost_rates:
        core, host = found.cost_core, found.cost_machine
        if found.paired_rounds:
            how = (
                f"{found.paired_rounds} paired rounds, A B B A, of the servers sharing the "
                "server's core"
            )
            if found.idle_percent is not None:
                mean, most = found.idle_percent
                how += f" (the idle ones used {mean:.1f} % of it, at most {most:.1f} %)"
        else:
            how = "the runs' cost steps, repeat by repeat"
        did = (
            f"the host stole {host.mean_steal_ms_per_s:.1f} ms/s on average (up to "
            f"{host.worst_steal_ms_per_s:.1f})"
            if host.windows
            else "the host's steal was not recorded"
        )
        if core.windows:
            did += (
                f", and other work used {core.mean_others_percent:.0f} % of the server's core "
                f"(up to {core.worst_others_percent:.0f} %; {core.busy_windows} of "
                f"{core.windows} steps past the bounds)"
            )
        if found.cost_stolen:
            void = (
                f"{found.cost_stolen} step(s) voided, their pairs left out: the host stole "
                f"more than {COST_STEAL_LIMIT_MS_PER_S:g} ms/s from the server's core."
            )
        else:
            void = (
                f"Nothing voided (a step is when the host steals more than "
                f"{COST_STEAL_LIMIT_MS_PER_S:g} ms/s from the server's core)."
            )
        lines.append(
            f"CPU per frame: from {how}, judged against the A/A pair's paired floor whatever "
            f"other work the machine did: over its steps {did}. {void}"
        )
    climb = found.climb_core
    voided = [r.config for r in found.rungs if any(r.busy)]
    reruns = sum(r.busy_reruns for r in found.rungs)
    if climb.windows:
        lines.append(
            f"Knees: {reruns} climb step(s) were measured again because the server's core "
            f"was busy ({bounds}; at most twice each); of the {climb.windows} steps kept, "
            f"{climb.busy_windows} were still busy. "
            + (
                f"Knees resting on one are voided: {', '.join(voided)}."
                if voided
                else "No knee rests on a busy step."
            )
        )
    elif found.rungs and found.machine.busy:
        lines.append(
            "Knees: the server's core was not read in these results, so a knee is judged by "
            "the whole machine's load instead. "
            + (
                f"Knees resting on a busy step are voided: {', '.join(voided)}."
                if voided
                else "No knee rests on a busy step."
            )
        )
    fixed = found.fixed_core
    if fixed.windows:
        lines.append(
            f"Percentiles: {fixed.busy_windows} of {fixed.windows} fixed-rate steps were busy "
            f"on the server's core ({bounds})"
            + (
                "; differences that rest on them are not confirmed."
                if fixed.busy
                else "; none is voided."
            )
        )
    return lines


def floor_fraction(rung: Rung, floor: Rung) -> str:
    """``rung``'s knee and CPU per frame as fractions of its transport's ``floor``: the
    median of the repeat-by-repeat ratios, with their range when repeats differ."""
    parts = []
    knees = [a / b for a, b in zip(rung.knees, floor.knees, strict=False) if b > 0]
    if knees:
        bound = "≥ " if rung.lower_bound else "≤ " if floor.lower_bound else ""
        parts.append(f"knee {bound}{_ratios(knees)}")
    for rate, cost in rung.costs.items():
        theirs = floor.costs.get(rate)
        if theirs is None:
            continue
        ratios = [
            a / b
            for a, b in zip(cost.values, theirs.values, strict=False)
            if a is not None and b is not None and b > 0
        ]
        if ratios:
            where = delivered_label(rate, rung.room_size)
            parts.append(f"CPU per frame {_ratios(ratios)} at {where}")
    return ", ".join(parts) or DASH


def _ratios(ratios: list[float]) -> str:
    """``0.81 (0.78-0.84)`` (an en dash between): the median ratio and its range."""
    median = statistics.median(ratios)
    low, high = min(ratios), max(ratios)
    spread = f" ({low:.2f}{DASH}{high:.2f})" if f"{low:.2f}" != f"{high:.2f}" else ""
    return f"{median:.2f}{spread}"


def _floor_findings(found: Ladder) -> list[str]:
    """Each chat rung against its transport's floor relay, as fractions."""
    sentences = []
    for transport, floor in found.floors.items():
        rungs = [r for r in found.chat_rungs if r.transport == transport and not r.same_as]
        if not rungs:
            continue
        parts = [f"{r.config}: {floor_fraction(r, floor)}" for r in rungs]
        sentences.append(
            f"Against the {transport} floor, {floor.config} ({floor.label()} delivered/s, "
            f"the {transport} relay with the highest knee): " + "; ".join(parts) + "."
        )
    return sentences


def profiling_sentence(comparison: Comparison, room_size: int) -> str:
    """What profiling cost, as the findings and the profiles section say it."""
    if not comparison.ratios:
        return (
            f"What profiling costs is not known: {comparison.config} and {comparison.reference} "
            "have no repeat with CPU per frame at the same rate."
        )
    if comparison.verdict == "not confirmed":
        verdict = f"not confirmed: {comparison.reason}"
    else:
        verdict = "confirmed"
    return (
        f"Profiling (PROFILE=cprofile) costs {comparison.ratio_text()} the server's CPU per "
        f"frame at {delivered_label(comparison.rate, room_size)}: {comparison.config} against "
        f"{comparison.reference}, same rate, pair by pair ({verdict})."
    )


def _cost_findings(found: Ladder) -> list[str]:
    """Per cost rate: each rung's CPU µs per frame and what it differs by from the rung
    before it and from the relay of its transport, confirmed or not and why."""
    sentences = []
    room = found.rungs[0].room_size if found.rungs else 10
    for rate in found.cost_rates:
        floor = found.cost_floor.get(rate)
        measured = [r for r in found.rungs if (c := r.costs.get(rate)) and c.known]
        if not measured:
            continue
        where = f"at {delivered_label(rate, room)}"
        if floor is None:
            floor_note = "no floor: one repeat and no A/A pair, so nothing is confirmed"
        else:
            floor_note = f"floor {floor_text(floor[0])}, {floor[1]}"
        parts = []
        for rung in measured:
            cost = rung.costs[rate]
            text = f"{rung.config} {cost.median:.1f}"
            claims = []
            for table, what in (
                (found.cost_vs_previous, "the rung before" if not rung.same_as else "its A/A twin"),
                (found.cost_vs_relay, "its transport's relay"),
            ):
                comparison = table.get(rung.config, {}).get(rate)
                if comparison is None or not comparison.ratios:
                    continue
                if comparison.verdict == "not confirmed":
                    verdict = f"not confirmed: {comparison.reason}"
                else:
                    verdict = "costs less" if comparison.verdict == "lower" else "costs more"
                    verdict += f", {comparison.reason}" if comparison.reason else ""
                claims.append(
                    f"{comparison.ratio_text()} {what} ({comparison.reference}), {verdict}"
                )
            if not all(cost.held):
                claims.append("over its knee here: an overload's cost")
            parts.append(text + (f" ({'; '.join(claims)})" if claims else ""))
        sentences.append(
            f"Server CPU µs per delivered frame {where} ({floor_note}): " + "; ".join(parts) + "."
        )
    return sentences


def _shape(rungs: list[Rung]) -> str:
    """ "At 2,000 connections in rooms of 10 (60-character bodies, 95-byte frames)"."""
    counts = sorted({r.connections for r in rungs if r.connections})
    sizes = sorted({r.room_size for r in rungs if r.room_size})
    frames = sorted({r.frame_bytes for r in rungs if r.frame_bytes})
    bodies = sorted({r.body_chars for r in rungs if r.body_chars})
    where = " and ".join(f"{n:,}" for n in counts) or "?"
    text = f"At {where} connections in rooms of {'/'.join(map(str, sizes)) or '?'}"
    details = []
    if bodies:
        details.append(f"{'/'.join(map(str, bodies))}-character bodies")
    if frames:
        details.append(
            DASH.join(map(str, (frames[0], frames[-1]) if len(frames) > 1 else frames))
            + "-byte send frames"
        )
    return text + (f" ({', '.join(details)})" if details else "")
