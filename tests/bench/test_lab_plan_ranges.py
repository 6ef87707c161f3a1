"""The plan's ranges against hand-computed cases: each tier planned at the ends of its
parts' intervals, the part that widens it most, a part measured once; and the README's
``plan`` command on the scaling run shipped with the repository."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from bench.lab.plan import EXAMPLE_TARGET, RANGE_NOTE, plan, plan_markdown
from bench.lab.scaling import Figure, Parts
from bench.lab.scaling_cli import EXAMPLE_RUN

ROOT = Path(__file__).resolve().parents[2]


def measured(value: float, low: float, high: float, unit: str = "") -> Figure:
    """A part measured three times: its median and its range over the repeats."""
    return Figure(value, low, high, unit, "by hand", repeats=3)


def once(value: float) -> Figure:
    """A part measured once: no interval."""
    return Figure(value, value, value, "", "by hand", repeats=1)


#: the hand-computed example's parts (u1 20, beta 2, knee 48,000, Redis 25 + 5 per
#: delivery, 11 logins per CPU-second, 32 KiB per connection), each with an interval but
#: the knee, measured once
PARTS = Parts(
    room_size=10,
    connections=2000,
    slo="p99=100",
    u1=measured(20, 19, 21, "µs/frame"),
    beta=measured(2, 1, 4, "µs/frame per process"),
    knee=once(48000),
    redis_commit_us=measured(25, 20, 30, "µs"),
    redis_delivery_us=measured(5, 4, 6, "µs"),
    logins_per_cpu_s=measured(11, 10, 12, "logins/CPU-s"),
    bytes_per_connection=measured(32768, 30000, 36000, "bytes"),
)


def test_auth_replicas_range_over_the_argon2_rate() -> None:
    auth = plan(PARTS, EXAMPLE_TARGET).tier("auth replicas")
    assert auth is not None and auth.range is not None
    # 100 logins/s over 0.7 x L per replica: L 12 -> 11.9 -> 12 + 1; L 11 -> 12.99 -> 13
    # + 1; L 10 -> 14.3 -> 15 + 1
    assert (auth.range.low, auth.total, auth.range.high) == (13, 14, 16)
    assert auth.range.widest is not None and auth.range.widest.part == "logins_per_cpu_s"
    assert auth.range.text() == "13\u201316"


def test_chat_range_is_widened_most_by_memory_when_memory_decides() -> None:
    chat = plan(PARTS, EXAMPLE_TARGET).tier("chat processes")
    assert chat is not None and chat.range is not None
    # memory decides at the medians: 2 GiB / 32,768 bytes = 65,536 connections per
    # process: 15.3 -> 16, + 1. At 30,000 bytes 71,583 per process: 14.0 -> 14, + 1; at
    # 36,000 59,652: 16.8 -> 17, + 1. The load needs fewer: 11 at the medians, at most 17
    # (u1 19, beta 4: 17 x 48,000 x 19 / (19 + 6.73 x 4) = 337,700 >= 333,333; 16 hold
    # 321,100), so the most is 17 + 1 whichever decides
    assert (chat.range.low, chat.total, chat.range.high) == (15, 17, 18)
    widest = chat.range.widest
    assert widest is not None and widest.part == "bytes_per_connection"
    assert (widest.low, widest.high) == (15, 18)
    # beta alone moves it one process (4: 17 by the load -> 18), u1 none
    assert widest.text() == "bytes_per_connection 30,000\u201336,000 bytes: 15\u201318"


def test_chat_range_is_widened_most_by_beta_when_the_load_decides() -> None:
    # beta 1 to 6: at 6, 21 processes hold 21 x 960,000 / (20 + 7.11 x 6) = 321,800 <
    # 333,333 and 22 hold 334,700: 22 + 1; memory alone moves it 15 to 18
    parts = replace(PARTS, beta=measured(2, 1, 6, "µs/frame per process"))
    chat = plan(parts, EXAMPLE_TARGET).tier("chat processes")
    assert chat is not None and chat.range is not None
    assert chat.range.widest is not None and chat.range.widest.part == "beta"
    assert (chat.range.widest.low, chat.range.widest.high) == (17, 23)
    assert chat.total == 17 and chat.range.low == 15 and chat.range.high >= 23


def test_every_range_holds_the_point_estimate() -> None:
    for target in (
        EXAMPLE_TARGET,
        replace(EXAMPLE_TARGET, spread=1.0),
        replace(EXAMPLE_TARGET, users=10_000_000, room_size=4),
    ):
        for tier in plan(PARTS, target).tiers:
            assert tier.range is not None
            assert tier.range.low <= tier.total <= tier.range.high, (target, tier)


def test_a_part_measured_once_widens_nothing_and_is_named() -> None:
    found = plan(PARTS, EXAMPLE_TARGET)
    assert found.no_interval == ("knee",)
    # the knee once, everything else fixed at its median too: no tier moves
    names = ["u1", "beta", "bytes_per_connection", "redis_commit_us", "redis_delivery_us"]
    names.append("logins_per_cpu_s")
    fixed = replace(PARTS, **{name: once(getattr(PARTS, name).value) for name in names})
    flat = plan(fixed, EXAMPLE_TARGET)
    for tier in flat.tiers:
        assert tier.range is not None
        assert (tier.range.low, tier.range.high) == (tier.total, tier.total)
        assert tier.range.widest is None
    text = plan_markdown(flat)
    assert "| chat processes | 16 | 17 | 17 | no part |" in text
    assert "No interval (measured once, or every repeat alike), so they widen no range" in text


def test_redis_range_follows_the_chat_tier_and_its_own_parts() -> None:
    redis = plan(PARTS, EXAMPLE_TARGET).tier("Redis primaries")
    assert redis is not None and redis.range is not None
    # medians: 33,333 sends/s x (25 + 5 x 7.73) µs over 0.7 of a core = 3.03 -> 4; at
    # the low ends (20 + 4 x 7.48, rooms over 15 processes) 2.38 -> 3; at the high ends
    # (30 + 6 x 7.93, 19 processes) 3.70 -> 4
    assert (redis.range.low, redis.total, redis.range.high) == (3, 4, 4)
    assert redis.range.widest is not None
    # commit, delivery and memory each move it 3 to 4 alone; the delivery's interval moves
    # the need most (2.66 to 3.40)
    assert redis.range.widest.part == "redis_delivery_us"


def test_the_table_prints_each_range_and_says_how_it_is_made() -> None:
    text = plan_markdown(plan(PARTS, EXAMPLE_TARGET))
    assert "| tier | for the load | with n+1 | range with n+1 | widened most by |" in text
    assert "| auth replicas | 13 | 14 | 13\u201316 | logins_per_cpu_s 10.00\u201312.00" in text
    assert RANGE_NOTE in text


# ---- the README's command on the shipped run ------------------------------------------


def readme_plan_command() -> list[str]:
    """The README's ``bench.lab plan`` example, as arguments."""
    readme = (ROOT / "README.md").read_text()
    line = next(
        ln for ln in readme.splitlines() if "-m bench.lab plan --users" in ln and "--from" in ln
    )
    command = shlex.split(line.split("#", 1)[0])
    return command[command.index("plan") + 1 :]


def test_the_readmes_plan_command_runs_on_the_shipped_run_and_prints_ranges(
    tmp_path: Path,
) -> None:
    args = readme_plan_command()
    assert str(EXAMPLE_RUN.relative_to(ROOT)) in " ".join(args)
    done = subprocess.run(
        [sys.executable, "-m", "bench.lab", "plan", *args, "--out", str(tmp_path / "p.md")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    table = [ln for ln in done.stdout.splitlines() if ln.startswith("|")]
    assert len(table) == 5  # the header, its rule and three tiers
    for row in table[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert re.fullmatch(r"\d+(\u2013\d+)?", cells[3]), row
    # the README shows what it prints
    readme = (ROOT / "README.md").read_text()
    shown = readme[readme.index("it prints:") :]
    shown = shown[shown.index("```\n") + 4 :]
    assert shown[: shown.index("```")].strip().splitlines() == table
    assert "shipped example" in done.stdout
    # the shipped run is a real run of the lab: its steps carry their own measurements
    results = json.loads(EXAMPLE_RUN.read_text())
    assert results["matrix"] == "scaling" and results["machine"]["commit"]
    steps = [s for r in results["runs"] for s in r["steps"]]
    assert steps and all(s["server_cpu_s"] is not None for s in steps if s.get("cost"))
