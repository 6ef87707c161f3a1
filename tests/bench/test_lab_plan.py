"""The capacity plan against hand-computed cases, and ``python -m bench.lab plan`` end to
end on a saved scaling run: its output, its file, its --help, its refusals."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from bench.lab.__main__ import main
from bench.lab.plan import EXAMPLE_TARGET, Target, plan, plan_markdown, target_errors
from bench.lab.results import Results
from tests.support.lab import hand_parts

Build = Callable[..., Results]


PARTS = hand_parts(logins_per_cpu_s=11)


def test_the_readme_example_by_hand() -> None:
    found = plan(PARTS, EXAMPLE_TARGET)
    # 1,000,000 users x 2/min = 33,333 sends/s; x 10 members = 333,333 delivered/s
    assert found.figures["delivered_per_s"] == pytest.approx(333333.33, abs=0.01)
    # load: 11 processes, rooms over 11 (1 - (10/11)^10) = 6.759 of them: 11 x 960,000 /
    # (20 + 2 x 5.759) = 335,046 >= 333,333 (10: 309,414 < it)
    assert found.figures["processes_by_load"] == 11
    # memory: 1,000,000 / 65,536 = 15.3 -> 16 decide, then one more
    assert found.figures["processes_by_connections"] == 16
    chat = found.tier("chat processes")
    assert chat is not None and (chat.for_load, chat.total) == (16, 17)
    assert chat.decided_by.startswith("connections")
    # Redis with all 17 up: rooms over 17 (1 - (16/17)^10) = 7.728 processes;
    # 33,333 x (25 + 5 x 7.728) = 2.12 s of CPU per s over 0.7 of a core: 3.03 -> 4
    spread = 17 * (1 - (16 / 17) ** 10)
    assert found.spread == pytest.approx(spread)
    redis = found.tier("Redis primaries")
    assert redis is not None and (redis.total, redis.replicas) == (4, 4)
    assert math.ceil(33333.333 * (25 + 5 * spread) / 0.7e6) == 4
    # auth: 100 / (1 core x 0.7 x 11 = 7.7 per replica) = 12.99 -> 13, then one more
    auth = found.tier("auth replicas")
    assert auth is not None and (auth.for_load, auth.total) == (13, 14)
    assert found.not_planned == ()


def test_rooms_on_one_process_need_only_the_knee() -> None:
    # spread 1: 333,333 / 48,000 = 6.9 -> 7 processes by load (memory allowing)
    target = replace(EXAMPLE_TARGET, spread=1.0, process_memory_gib=64)
    found = plan(PARTS, target)
    chat = found.tier("chat processes")
    assert chat is not None and (chat.for_load, chat.total) == (7, 8)
    assert chat.decided_by.startswith("delivered/s")
    # Redis: 33,333 x 30 µs = 1.0 core over 0.7 -> 2 primaries
    redis = found.tier("Redis primaries")
    assert redis is not None and redis.total == 2


def test_a_small_target_still_gets_one_spare_on_every_tier() -> None:
    target = Target(users=100, sends_per_user_per_min=1, room_size=10, logins_per_s=0)
    found = plan(PARTS, target)
    assert [(t.name, t.for_load, t.total, t.replicas) for t in found.tiers] == [
        ("chat processes", 1, 2, 0),
        ("Redis primaries", 1, 1, 1),
        ("auth replicas", 1, 2, 0),
    ]


def test_the_plan_names_each_figures_source_and_its_assumptions() -> None:
    text = plan_markdown(plan(PARTS, EXAMPLE_TARGET))
    assert "| chat processes | 16 | 17 |" in text
    assert "| Redis primaries | 4 | 4 + 4 replicas |" in text
    assert "| auth replicas | 13 | 14 |" in text
    assert "knee, one process on Redis: 48,000 (by hand)" in text
    assert "N x (1 - (1 - 1/N)^m)" in text
    assert "62,500 connections per process with one lost" in text  # 1,000,000 / 16
    rooms_of_5 = plan_markdown(plan(PARTS, replace(EXAMPLE_TARGET, room_size=5)))
    assert "rooms of 5, measured at 10" in rooms_of_5


def test_missing_figures_leave_their_tier_unplanned_and_say_which() -> None:
    parts = replace(PARTS, logins_per_cpu_s=None, knee=None)
    found = plan(parts, EXAMPLE_TARGET)
    assert [t.name for t in found.tiers] == ["Redis primaries"]
    assert found.not_planned == (
        "chat processes: not measured: knee",
        "auth replicas: not measured: logins per CPU-second",
    )


def test_bad_targets_are_named_input_by_input() -> None:
    bad = Target(users=-5, sends_per_user_per_min=-1, room_size=0, logins_per_s=-2)
    errors = target_errors(bad)
    assert errors[0] == "--users -5: connected users must be at least 1"
    assert any(e.startswith("--room-size 0") for e in errors)
    assert any(e.startswith("--sends-per-min -1") for e in errors)
    assert any(e.startswith("--logins-per-s -2") for e in errors)
    assert target_errors(replace(EXAMPLE_TARGET, spread=11.0)) == [
        "--room-spread 11: between 1 and the room size (10), or 'random'"
    ]
    assert target_errors(replace(EXAMPLE_TARGET, share=1.5))[0].startswith("--cpu-share 1.5")
    assert target_errors(EXAMPLE_TARGET) == []


# ---- the command ---------------------------------------------------------------------

EXAMPLE = ["--users", "1000000", "--sends-per-min", "2", "--room-size", "10"]
EXAMPLE += ["--logins-per-s", "100"]


@pytest.fixture
def saved(scaling_results: Build, tmp_path: Path) -> Path:
    """A scaling run's results.json, saved as the lab saves it."""
    run_dir = tmp_path / "reports" / "20261201-100000-scaling"
    run_dir.mkdir(parents=True)
    path = run_dir / "results.json"
    scaling_results().save(path)
    return path


def test_plan_prints_and_writes_the_plan_beside_the_figures(
    saved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *EXAMPLE, "--from", str(saved)]) == 0
    out = capsys.readouterr().out
    # the fixture's figures are the hand-computed ones: u1 20, beta 2, knee 48,000,
    # Redis 25 + 5 s, 11 logins per CPU-second, 32,768 bytes per connection
    assert "| chat processes | 16 | 17 |" in out
    assert "| Redis primaries | 4 | 4 + 4 replicas |" in out
    assert "| auth replicas | 13 | 14 |" in out
    assert "scaling run 2026-12-01T10:00:00 (commit abc1234), 'one Redis'" in out
    written = (saved.parent / "plan.md").read_text()
    assert "| chat processes | 16 | 17 |" in written and str(saved) in written


def test_plan_takes_the_newest_scaling_run_by_itself(
    saved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = saved.parent.parent
    status = main(["plan", *EXAMPLE, "--reports-dir", str(reports), "--room-spread", "1"])
    assert status == 0
    assert f"Figures from: {saved}" in capsys.readouterr().out


def test_plan_with_no_figures_names_the_command_to_run_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *EXAMPLE, "--reports-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no measured figures" in err
    assert "python -m bench.lab scaling" in err and "--from" in err


def test_plan_on_a_run_without_some_parts_says_what_to_measure(
    scaling_results: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = asdict(scaling_results(side_parts=False))
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    assert main(["plan", *EXAMPLE, "--from", str(path), "--out", str(tmp_path / "p.md")]) == 1
    captured = capsys.readouterr()
    assert "NOT PLANNED: chat processes: not measured: bytes_per_connection" in captured.out
    assert "NOT PLANNED: auth replicas" in captured.out
    assert "python -m bench.lab scaling" in captured.err


def test_plan_help_explains_every_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--users",
        "--sends-per-min",
        "--room-size",
        "--logins-per-s",
        "--refreshes-per-s",
        "--slo",
        "--connections-per-user",
        "--room-spread",
        "--cpu-share",
        "--process-memory-gib",
        "--auth-cores",
        "--from",
        "--reports-dir",
        "--out",
    ):
        assert f"  {flag} " in text, flag
    assert "python -m bench.lab plan --users 1000000" in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--users", "-5"], "--users -5: connected users must be at least 1"),
        (["--room-size", "0"], "--room-size 0: a room has at least 1 member"),
        (["--slo", "p98=1"], "bad SLO item 'p98=1'"),
        (["--room-spread", "many"], "'many': 'random' or a number of processes"),
    ],
)
def test_plan_refuses_bad_input_with_one_line_and_exit_2(
    change: list[str], message: str, saved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*EXAMPLE]
    flag = change[0]
    if flag in args:
        i = args.index(flag)
        args[i + 1] = change[1]
    else:
        args += change
    with pytest.raises(SystemExit) as exited:
        main(["plan", *args, "--from", str(saved)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert not (saved.parent / "plan.md").exists()


# ---- the auth tier: logins' argon2 and every request's event loop --------------------


def test_refreshes_size_the_auth_tier_by_its_event_loop_beside_the_logins_hashing() -> None:
    # 1,000 refreshes per CPU-second: each replica's loop at 0.7 answers 700 requests/s
    parts = hand_parts(logins_per_cpu_s=11, refreshes_per_cpu_s=1000)
    # 100 logins/s: argon2 100 / 7.7 = 12.99 replicas; the loop (100 + 0) / 700 = 0.14
    few = plan(parts, EXAMPLE_TARGET)
    auth = few.tier("auth replicas")
    assert auth is not None and (auth.for_load, auth.total) == (13, 14)
    assert few.figures["auth_need_hashing"] == pytest.approx(100 / 7.7)
    assert few.figures["auth_need_loop"] == pytest.approx(100 / 700)
    assert auth.decided_by.startswith("logins/s: 100 at 7.7 per replica")
    assert "(argon2 12.99; event loop 0.14 replicas)" in auth.decided_by
    # 20,000 refreshes/s: the loop (100 + 20,000) / 700 = 28.7 -> 29, then one more
    many = plan(parts, replace(EXAMPLE_TARGET, refreshes_per_s=20_000))
    auth = many.tier("auth replicas")
    assert auth is not None and (auth.for_load, auth.total) == (29, 30)
    assert auth.decided_by.startswith("logins + refreshes/s: 100 + 20,000 at 700 per replica")
    assert "(argon2 12.99; event loop 28.71 replicas)" in auth.decided_by
    assert any("refreshes per CPU-second: 1,000 (by hand)" in s for s in auth.sources)
    text = plan_markdown(many)
    assert "100 logins/s, 20000 refreshes/s" in text
    assert "| auth replicas | 29 | 30 |" in text


def test_refreshes_asked_for_without_their_figure_leave_the_auth_tier_unplanned() -> None:
    found = plan(PARTS, replace(EXAMPLE_TARGET, refreshes_per_s=500))
    assert found.tier("auth replicas") is None
    assert found.not_planned == ("auth replicas: not measured: refreshes per CPU-second",)
    # none asked for: argon2 alone, as before the refresh figure, and the plan says so
    alone = plan(PARTS, EXAMPLE_TARGET)
    assert alone.tier("auth replicas") is not None
    assert any("sized from argon2 alone" in a for a in alone.assumptions)
    assert target_errors(replace(EXAMPLE_TARGET, refreshes_per_s=-1)) == [
        "--refreshes-per-s -1: must be 0 or more"
    ]


def test_plan_takes_refreshes_per_second_on_the_command_line(
    saved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the fixture's run: 11 logins and 1,100 refreshes per CPU-second (medians)
    args = ["plan", *EXAMPLE, "--refreshes-per-s", "20000", "--from", str(saved)]
    assert main([*args, "--out", str(saved.parent / "p.md")]) == 0
    out = capsys.readouterr().out
    # (100 + 20,000) / (0.7 x 1,100 = 770) = 26.1 -> 27, then one more
    assert "| auth replicas | 27 | 28 |" in out
    assert "event loop 26.10 replicas" in out
