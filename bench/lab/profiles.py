"""The lab's profile analysis: top functions, markdown tables, call graphs, flame graphs.

Reads the chat server's ``PROFILE=cprofile`` snapshots (``PROFILE_DIR/<run>/<n>.prof``,
pstats files, each one window of the event loop thread and the history writer
thread merged: :mod:`chat_server.profiling`); several files are merged into one
profile. Times are cProfile's, in seconds of wall time per thread: a thread waiting
(the loop in ``epoll``, the writer on its condition) counts as time in the waiting
call (:data:`WAITING_FUNCTIONS`). Percentages are of the merged profile's total own
time, which sums every profiled thread.

Nothing here raises over a picture: :func:`call_graph_png` and
:func:`py_spy_flamegraph` return None (and say why) when a tool is missing or fails.

``python -m bench.lab.profiles PROF_OR_DIR... [--top N] [--png out.png]`` prints both
tables.
"""

from __future__ import annotations

import argparse
import logging
import marshal
import math
import os
import pstats
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("bench.lab.profiles")

ROOT = Path(__file__).resolve().parents[2]
_STDLIB = Path(sysconfig.get_paths()["stdlib"])
_SITE_PACKAGES = "site-packages/"
_SNAPSHOT = re.compile(r"^(\d+)\.prof$")

#: builtins whose own time is a thread waiting for work, not working (labels as shown)
WAITING_FUNCTIONS = frozenset(
    {
        "{method 'poll' of 'select.epoll' objects}",
        "{method 'control' of 'select.kqueue' objects}",
        "{method 'acquire' of '_thread.lock' objects}",
    }
)

Func = tuple[str, int, str]


def snapshot_paths(directory: Path) -> list[Path]:
    """Every ``<n>.prof`` under ``directory`` (a run directory or a whole ``PROFILE_DIR``),
    by run directory, then by ``n`` as a number (``2.prof`` before ``10.prof``)."""

    def key(path: Path) -> tuple[str, int]:
        match = _SNAPSHOT.match(path.name)
        return (str(path.parent), int(match.group(1)) if match else 0)

    return sorted((p for p in directory.rglob("*.prof") if p.is_file()), key=key)


def expand_paths(paths: Iterable[Path]) -> list[Path]:
    """Files as given, directories replaced by their snapshots (:func:`snapshot_paths`)."""
    expanded: list[Path] = []
    for path in paths:
        expanded.extend(snapshot_paths(path) if path.is_dir() else [path])
    return expanded


def load_stats(prof_paths: Sequence[Path]) -> pstats.Stats:
    """The pstats files merged into one; empty files are skipped. ValueError if none holds
    data; OSError or a pstats error for a file that is not a profile."""
    merged: pstats.Stats | None = None
    for path in prof_paths:
        try:
            stats = pstats.Stats(str(path))
        except TypeError:  # pstats' word for a profile without any function
            logger.warning("profile %s is empty; skipped", path)
            continue
        if merged is None:
            merged = stats
        else:
            merged.add(stats)
    if merged is None:
        raise ValueError(f"no profile data in {len(prof_paths)} file(s)")
    return merged


def short_path(filename: str) -> str:
    """A code file's path made short: after ``site-packages/``, else relative to the
    project root or the standard library; anything else as it is."""
    cut = filename.rfind(_SITE_PACKAGES)
    if cut >= 0:
        return filename[cut + len(_SITE_PACKAGES) :]
    path = Path(filename)
    if path.is_absolute():
        for base in (ROOT, _STDLIB):
            if path.is_relative_to(base):
                return path.relative_to(base).as_posix()
    return filename


def function_label(func: Func) -> str:
    """``file:line(name)`` with a short path, or pstats' ``{built-in ...}`` for C functions."""
    filename, line, name = func
    if filename == "~" and line == 0:
        return f"{{{name[1:-1]}}}" if name.startswith("<") and name.endswith(">") else name
    return f"{short_path(filename)}:{line}({name})"


def top_functions(
    prof_paths: Sequence[Path], limit: int = 20, exclude: Collection[str] = WAITING_FUNCTIONS
) -> dict[str, Any]:
    """The ``limit`` functions with the most cumulative and the most own time.

    Returns ``{"cumulative": rows, "own": rows, "total_s", "waiting_s", "functions",
    "files"}``; a row is ``{"function", "ncalls", "tottime_s", "cumtime_s", "percent"}``
    where ``percent`` is the row's sort key (cumulative or own time) over the total
    own time ``total_s``. Functions whose label is in ``exclude`` (by default the calls
    waiting for work, whose own time is ``waiting_s``) are left out of the rows, not
    of the total; pass ``()`` to list them too.
    """
    stats = load_stats(prof_paths)
    table: dict[Func, tuple[int, int, float, float, dict[Func, Any]]]
    table = stats.stats  # type: ignore[attr-defined]
    total_s = float(stats.total_tt)  # type: ignore[attr-defined]
    rows = []
    waiting_s = 0.0
    for func, (_, ncalls, tottime, cumtime, _) in table.items():
        label = function_label(func)
        if label in WAITING_FUNCTIONS:
            waiting_s += tottime
        if label not in exclude:
            rows.append(
                {"function": label, "ncalls": ncalls, "tottime_s": tottime, "cumtime_s": cumtime}
            )

    def ranked(key: str) -> list[dict[str, Any]]:
        chosen = sorted(rows, key=lambda row: (-row[key], row["function"]))[:limit]
        return [
            {**row, "percent": 100.0 * row[key] / total_s if total_s else 0.0} for row in chosen
        ]

    return {
        "cumulative": ranked("cumtime_s"),
        "own": ranked("tottime_s"),
        "total_s": total_s,
        "waiting_s": waiting_s,
        "functions": len(table),
        "files": [str(p) for p in prof_paths],
    }


def markdown_table(rows: Sequence[Mapping[str, Any]], limit: int | None = None) -> str:
    """A top table (rows of :func:`top_functions`) as a GitHub-markdown pipe table.

    Function labels are code spans (they hold ``<listcomp>``, ``*``, ``_``) with any
    ``|`` escaped as ``\\|``; times in seconds, three decimals.
    """
    lines = [
        "| # | function | calls | own s | cumulative s | % |",
        "|--:|:--|--:|--:|--:|--:|",
    ]
    for rank, row in enumerate(rows[:limit], start=1):
        label = str(row["function"]).replace("`", "'").replace("|", "\\|")
        lines.append(
            f"| {rank} | `{label}` | {row['ncalls']} | {row['tottime_s']:.3f} "
            f"| {row['cumtime_s']:.3f} | {row['percent']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _shortened(stats: pstats.Stats) -> dict[Func, Any]:
    """The pstats table with every file path shortened (for readable call graph nodes)."""

    def short(func: Func) -> Func:
        return (short_path(func[0]), func[1], func[2])

    table: dict[Func, Any] = stats.stats  # type: ignore[attr-defined]
    return {
        short(func): (cc, nc, tt, ct, {short(caller): v for caller, v in callers.items()})
        for func, (cc, nc, tt, ct, callers) in table.items()
    }


def call_graph_png(
    prof_paths: Sequence[Path],
    out_png: Path,
    node_thres: float = 0.5,
    edge_thres: float = 0.1,
    timeout_s: float = 120,
) -> Path | None:
    """Draw the merged profiles' call graph (gprof2dot, then Graphviz ``dot``) as a PNG.

    Nodes under ``node_thres`` percent and edges under ``edge_thres`` percent of the
    total time are left out. Returns ``out_png``, or None after logging a warning
    when there is no data, gprof2dot or dot is missing, or either fails.
    """
    dot = shutil.which("dot")
    if dot is None:
        logger.warning("no call graph: Graphviz' dot is not installed")
        return None
    try:
        table = _shortened(load_stats(prof_paths))
    except (OSError, ValueError, EOFError) as exc:
        logger.warning("no call graph: %s", exc)
        return None
    with tempfile.TemporaryDirectory(prefix="chatlab-callgraph-") as tmp:
        merged, graph = Path(tmp) / "merged.prof", Path(tmp) / "graph.dot"
        with merged.open("wb") as file:
            marshal.dump(table, file)
        steps = (
            [
                *(sys.executable, "-m", "gprof2dot", "--format", "pstats"),
                *("--node-thres", str(node_thres), "--edge-thres", str(edge_thres)),
                *("--output", str(graph), str(merged)),
            ],
            [dot, "-Tpng", "-o", str(out_png), str(graph)],
        )
        out_png.parent.mkdir(parents=True, exist_ok=True)
        for command in steps:
            try:
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=timeout_s, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                logger.warning("no call graph: %s failed: %s", Path(command[0]).name, exc)
                return None
            if done.returncode != 0:
                logger.warning(
                    "no call graph: %s exited %d: %s",
                    " ".join(command[:3]),
                    done.returncode,
                    done.stderr.strip()[-500:],
                )
                return None
    return out_png


def _py_spy() -> str | None:
    """The py-spy beside this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def py_spy_flamegraph(
    pid: int, duration_s: float, out_svg: Path, subprocesses: bool = False, rate_hz: int = 100
) -> tuple[Path | None, str]:
    """Sample process ``pid`` with py-spy for ``duration_s`` into a flame graph SVG.

    Sampling does not pause the process (``--nonblocking``) and sees every thread,
    C extensions excluded. ``subprocesses`` follows the supervisor's workers. Returns
    ``(out_svg, "N samples ...")``, or ``(None, why)`` when py-spy is missing, the
    process is gone, or it may not be traced (ptrace refused); never raises for those.
    """
    binary = _py_spy()
    if binary is None:
        return None, "py-spy is not installed (the lab extra installs it)"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None, f"no process {pid}"
    except PermissionError:
        return None, f"process {pid} belongs to another user: py-spy may not trace it"
    seconds = max(1, math.ceil(duration_s))
    command = [
        *(binary, "record", "--pid", str(pid), "--duration", str(seconds)),
        *("--rate", str(rate_hz), "--format", "flamegraph", "--output", str(out_svg)),
        "--nonblocking",
        *(["--subprocesses"] if subprocesses else []),
    ]
    out_svg.parent.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + 30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"py-spy failed: {exc}"
    said = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or not out_svg.is_file() or out_svg.stat().st_size == 0:
        lines = said.splitlines()
        errors = [line for line in lines if line.startswith("Error")] or lines[-1:]
        error = errors[0] if errors else f"exit {done.returncode}"
        if re.search(r"ptrace|[Pp]ermission denied|[Oo]peration not permitted", said):
            return None, (
                f"py-spy may not trace process {pid} ({error}): it needs root, "
                "CAP_SYS_PTRACE or kernel.yama.ptrace_scope=0"
            )
        return None, f"py-spy could not sample process {pid}: {error}"
    samples = re.search(r"Samples: (\d+) Errors: (\d+)", said)
    detail = f"{samples.group(1)} samples, {samples.group(2)} errors" if samples else "recorded"
    return out_svg, f"{detail} at {rate_hz} Hz over {seconds} s"


def main(argv: list[str] | None = None) -> int:
    """Print the top tables of the given snapshots; optionally write the call graph."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.lab.profiles",
        description="Top functions of chat server profile snapshots (PROFILE=cprofile), merged.",
    )
    parser.add_argument(
        "prof", nargs="+", type=Path, help=".prof files, or directories holding them"
    )
    parser.add_argument("--top", type=int, default=20, help="rows per table (default: 20)")
    parser.add_argument("--png", type=Path, help="also draw the call graph into this PNG")
    parser.add_argument(
        "--show-waiting",
        action="store_true",
        help="list the calls that wait for work (epoll, lock acquire) too",
    )
    args = parser.parse_args(argv)
    paths = expand_paths(args.prof)
    if not paths:
        print("no .prof files found", file=sys.stderr)
        return 1
    try:
        top = top_functions(paths, args.top, exclude=() if args.show_waiting else WAITING_FUNCTIONS)
    except (OSError, ValueError, EOFError) as exc:
        print(f"cannot read the profiles: {exc}", file=sys.stderr)
        return 1
    print(
        f"{len(paths)} snapshot(s), {top['functions']} functions, "
        f"{top['total_s']:.3f} s of own time ({top['waiting_s']:.3f} s waiting for work)\n"
    )
    for order in ("cumulative", "own"):
        print(f"Top {args.top} by {order} time\n")
        print(markdown_table(top[order]))
    if args.png is not None:
        png = call_graph_png(paths, args.png)
        print(f"call graph: {png}" if png else "no call graph (see the warning above)")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main())
