"""How the report writes a figure: numbers, ranges, ratios, verdicts, durations, settings."""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

from bench.lab.machine import CORE_BUSY

if TYPE_CHECKING:
    from bench.lab.plots import Spread

NO_DIFFERENCE = "≈ no difference"
DASH = "\u2013"  # en dash: between the ends of a range
TIMES = "\u00d7"  # multiplication sign: before a ratio
EMPTY = DASH  # a cell with no figure
GENERATOR_LIMITED = "⚠"


def num(x: float | None) -> str:
    """A figure to three significant digits or so, thousands separated; EMPTY for none."""
    if x is None or math.isnan(x):
        return EMPTY
    size = abs(x)
    if size >= 1000:
        return f"{x:,.0f}"
    if size >= 100:
        return f"{x:.0f}"
    if size >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def counter_text(x: float) -> str:
    """A counter's value: whole numbers without decimals, others as :func:`num`."""
    return f"{int(x):,}" if float(x).is_integer() else num(x)


def spread_cell(figure: Spread | None) -> str:
    """A median over repeats with its (min-max) range when the repeats differ."""
    if figure is None:
        return EMPTY
    if figure.n > 1 and figure.low != figure.high:
        return f"{num(figure.median)} ({num(figure.low)}{DASH}{num(figure.high)})"
    return num(figure.median)


def verdict(held: int, n: int) -> str:
    """ "✓ n/n" when every repeat held, otherwise "✗" with how many did."""
    return f"✓ {held}/{n}" if held == n else f"✗ {held}/{n}"


def ratio_cell(
    figure: Spread | None, base: Spread | None, floor: float | None, *, busy: bool = False
) -> str:
    """The ratio of medians with its range from the repeats' min-max, or "≈ no difference"
    when the ratio is within the noise floor or the two ranges overlap; "not confirmed:
    the server's core was busy" beside it when a step of either was (and the figure is
    one a busy core voids: :data:`bench.lab.pairs.FIGURE_BOUNDS`)."""
    if figure is None or base is None or base.median <= 0:
        return EMPTY
    ratio = figure.median / base.median
    if busy:
        return f"{TIMES}{ratio:.2f} (not confirmed: {CORE_BUSY})"
    low = figure.low / base.high if base.high > 0 else ratio
    high = figure.high / base.low if base.low > 0 else ratio
    overlaps = (figure.n > 1 or base.n > 1) and low <= 1 <= high
    in_floor = floor is not None and 1 / (1 + floor) <= ratio <= 1 + floor
    if overlaps or in_floor:
        return f"{NO_DIFFERENCE} ({TIMES}{ratio:.2f})"
    if f"{low:.2f}" != f"{high:.2f}":
        return f"{TIMES}{ratio:.2f} ({low:.2f}{DASH}{high:.2f})"
    return f"{TIMES}{ratio:.2f}"


def duration_text(seconds: float) -> str:
    """Seconds as "1 h 2 min 3 s", "2 min 3 s" or "3 s"."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min {secs} s"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def value_text(value: Any) -> str:
    """A recorded value as a cell: yes/no, counts, JSON for lists and dicts; EMPTY for None."""
    if value is None:
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return counter_text(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def slug(name: str) -> str:
    """A configuration name made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "config"


def inline(value: Any) -> str:
    """A settings value on one line: dicts as "key value, ...", lists comma-separated."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {inline(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "[" + ", ".join(inline(v) for v in value) + "]"
    return value_text(value)
