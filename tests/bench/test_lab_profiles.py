"""bench.lab.profiles on real cProfile snapshots: top tables, markdown, call graph, py-spy."""

from __future__ import annotations

import cProfile
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.lab.profiles import (
    WAITING_FUNCTIONS,
    call_graph_png,
    function_label,
    main,
    markdown_table,
    py_spy_flamegraph,
    snapshot_paths,
    top_functions,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIB_10_CALLS = 177  # calls of fib() that fib(10) makes
LOCK_ACQUIRE = "{method 'acquire' of '_thread.lock' objects}"


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def workload() -> int:
    lock = threading.Lock()
    lock.acquire()
    lock.release()
    return fib(10) + sum(sorted(range(1000), reverse=True))


def profile_to(path: Path) -> Path:
    """Profile :func:`workload` once into a pstats file."""
    profiler = cProfile.Profile()
    profiler.runcall(workload)
    profiler.dump_stats(path)
    return path


@pytest.fixture
def snapshots(tmp_path: Path) -> list[Path]:
    """Two snapshots of one run, as the server lays them out."""
    run = tmp_path / "profiles" / "run"
    run.mkdir(parents=True)
    return [profile_to(run / "1.prof"), profile_to(run / "2.prof")]


def row_of(rows: list[dict], name: str) -> dict:
    (row,) = [r for r in rows if r["function"].endswith(f"({name})")]
    return row


def test_top_functions_merges_snapshots_and_labels_with_short_paths(snapshots: list[Path]):
    top = top_functions(snapshots, limit=50)
    fib_row = row_of(top["cumulative"], "fib")
    assert fib_row["function"].startswith("tests/bench/test_lab_profiles.py:")
    assert fib_row["ncalls"] == 2 * FIB_10_CALLS
    assert row_of(top["cumulative"], "workload")["ncalls"] == 2
    assert top["files"] == [str(p) for p in snapshots]
    for order, key in (("cumulative", "cumtime_s"), ("own", "tottime_s")):
        rows = top[order]
        assert [r[key] for r in rows] == sorted((r[key] for r in rows), reverse=True)
        assert all(0 <= r["percent"] <= 100.0 + 1e-9 for r in rows)
        assert set(rows[0]) == {"function", "ncalls", "tottime_s", "cumtime_s", "percent"}
    assert sum(r["percent"] for r in top["own"]) <= 100.0 + 1e-9


def test_waiting_calls_are_left_out_of_the_rows_unless_asked(snapshots: list[Path]):
    hidden = top_functions(snapshots, limit=1000)
    shown = top_functions(snapshots, limit=1000, exclude=())
    assert LOCK_ACQUIRE in WAITING_FUNCTIONS
    assert LOCK_ACQUIRE not in {r["function"] for r in hidden["own"]}
    assert row_of_label(shown["own"], LOCK_ACQUIRE)["ncalls"] == 2
    assert hidden["total_s"] == shown["total_s"]
    assert hidden["waiting_s"] <= hidden["total_s"]


def row_of_label(rows: list[dict], label: str) -> dict:
    (row,) = [r for r in rows if r["function"] == label]
    return row


def test_limit_cuts_both_tables(snapshots: list[Path]):
    top = top_functions(snapshots, limit=3)
    assert len(top["cumulative"]) == 3 and len(top["own"]) == 3


def test_builtins_are_labelled_as_pstats_does():
    assert function_label(("~", 0, "<built-in method builtins.sorted>")) == (
        "{built-in method builtins.sorted}"
    )
    assert function_label(("/x/site-packages/websockets/frames.py", 12, "parse")) == (
        "websockets/frames.py:12(parse)"
    )


def test_markdown_table_is_a_pipe_table_with_one_row_per_function(snapshots: list[Path]):
    rows = top_functions(snapshots, limit=5)["own"]
    text = markdown_table(rows)
    lines = text.strip().splitlines()
    assert lines[0] == "| # | function | calls | own s | cumulative s | % |"
    assert set(lines[1]) <= set("|:- ")
    assert len(lines) == 2 + len(rows)
    assert all(line.startswith("| ") and line.endswith(" |") for line in lines[2:])
    assert lines[2].startswith(f"| 1 | `{rows[0]['function']}` | {rows[0]['ncalls']} |")


def test_markdown_table_escapes_pipes_in_labels():
    row = {"function": "a|b", "ncalls": 1, "tottime_s": 0.5, "cumtime_s": 1.0, "percent": 50.0}
    assert markdown_table([row]).splitlines()[2] == "| 1 | `a\\|b` | 1 | 0.500 | 1.000 | 50.0 |"


def test_snapshots_sort_by_run_then_number(tmp_path: Path):
    for run, n in (("b", 10), ("b", 2), ("a", 3), ("b", 1)):
        (tmp_path / run).mkdir(exist_ok=True)
        (tmp_path / run / f"{n}.prof").write_bytes(b"")
    found = [f"{p.parent.name}/{p.name}" for p in snapshot_paths(tmp_path)]
    assert found == ["a/3.prof", "b/1.prof", "b/2.prof", "b/10.prof"]


def test_an_empty_snapshot_has_no_top_and_no_graph(tmp_path: Path):
    empty = tmp_path / "1.prof"
    cProfile.Profile().dump_stats(empty)
    with pytest.raises(ValueError):
        top_functions([empty])
    assert call_graph_png([empty], tmp_path / "graph.png") is None


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz' dot is not installed")
def test_call_graph_is_a_png(snapshots: list[Path], tmp_path: Path):
    out = call_graph_png(snapshots, tmp_path / "plots" / "graph.png", node_thres=1, edge_thres=1)
    assert out == tmp_path / "plots" / "graph.png"
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_no_call_graph_without_dot(
    snapshots: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without Graphviz
    assert call_graph_png(snapshots, tmp_path / "graph.png") is None
    assert not (tmp_path / "graph.png").exists()


def test_cli_prints_both_tables_and_writes_the_graph(
    snapshots: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    png = tmp_path / "cli.png"
    run_dir = snapshots[0].parent
    assert main([str(run_dir), "--top", "4", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "2 snapshot(s)" in out
    assert "Top 4 by cumulative time" in out and "Top 4 by own time" in out
    assert out.count("| # | function |") == 2
    if shutil.which("dot"):
        assert png.read_bytes().startswith(PNG_SIGNATURE)


def test_cli_help_exits_0():
    result = subprocess.run(
        [sys.executable, "-m", "bench.lab.profiles", "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0 and "--png" in result.stdout


def test_py_spy_records_a_flame_graph_or_says_why_not(tmp_path: Path):
    spinner = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: sum(range(1000)); time.sleep(0.001)"]
    )
    try:
        svg, reason = py_spy_flamegraph(spinner.pid, 1, tmp_path / "flame.svg")
    finally:
        spinner.kill()
        spinner.wait()
    assert reason
    if svg is None:
        pytest.skip(f"py-spy cannot sample here: {reason}")
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    assert "samples" in reason


def test_py_spy_says_why_for_a_process_that_is_gone(tmp_path: Path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    svg, reason = py_spy_flamegraph(gone.pid, 1, tmp_path / "flame.svg")
    assert svg is None and str(gone.pid) in reason
