"""``figures.md``: the run's current-figures table, stamped, for ``docs/performance.md``.

One table (each rung's knee and CPU µs per delivered frame at each cost rate, medians
with min-max over repeats) under the stamp a reader needs to trust it: the commit, the
machine, the date, the shape and the one command that regenerates it. The design
document's "Current figures" section is this file pasted whole.
"""

from __future__ import annotations

from bench.lab.ladder import Ladder, delivered_label, floor_text
from bench.lab.report.formatting import DASH, EMPTY
from bench.lab.results import Results


def figures_markdown(results: Results, found: Ladder | None) -> str:
    """The table and its stamp as Markdown; "" when nothing was climbed."""
    if found is None:
        return ""
    room = found.rungs[0].room_size if found.rungs else 10
    header = ["rung", "knee, delivered/s (min\u2013max)"]
    header += [
        f"µs CPU per delivered frame at {delivered_label(r, room)}" for r in found.cost_rates
    ]
    lines = [
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
    ]
    for rung in found.rungs:
        name = rung.config + (" (relay)" if rung.target == "relay" else "")
        knee = f"{rung.label()} ({rung.low:,.0f}{DASH}{rung.high:,.0f})"
        if rung.driver_limited:
            knee += ", driver-limited"
        costs = [rung.costs[r].label() if r in rung.costs else EMPTY for r in found.cost_rates]
        lines.append("| " + " | ".join([name, knee, *costs]) + " |")
    machine = results.machine
    cores = (
        f"server on core {', '.join(map(str, machine.get('server_cores', [])))}, "
        f"driver on {', '.join(map(str, machine.get('generator_cores', [])))}"
        if machine.get("server_cores")
        else "cores as the lab split them"
    )
    floors = [f"knee {floor_text(found.floor)}"] + [
        f"µs/frame at {delivered_label(r, room)} {floor_text(found.cost_floor[r][0])}"
        for r in found.cost_rates
        if r in found.cost_floor
    ]
    connections = ", ".join(f"{n:,}" for n in sorted({r.connections for r in found.rungs}))
    stamp = [
        f"- **Commit:** {machine.get('commit') or 'not recorded'}",
        f"- **Machine:** {machine.get('cpu_model') or 'not recorded'}, "
        f"{machine.get('cores', '?')} cores, {cores}",
        f"- **Around it:** {found.machine.sentence()}",
        f"- **Date:** {results.started[:10]}, {results.repeat} repeats interleaved, "
        f"floors {'; '.join(floors)}",
        f"- **Shape:** {connections} connections in rooms of {room}; knees by the fast "
        "driver's climb to fan-out p99 < 100 ms with nothing lost; CPU per frame at fixed "
        "offered loads over each step's window",
        f"- **Regenerate** (one command): `{_without_out(results.command)}`",
    ]
    return "\n".join(lines) + "\n\n" + "\n".join(stamp) + "\n"


def _without_out(command: str) -> str:
    """``command`` without its ``--out DIR`` (a local path, not part of what to run)."""
    words = command.split()
    kept = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word == "--out":
            skip = True
            continue
        if not word.startswith("--out="):
            kept.append(word)
    return " ".join(kept)
