"""``python -m bench.probe``: fixed-rate steps against one fresh server, looked at from outside.

The instrument behind docs/decisions/0021-the-knee.md and 0023: where the lab's ladder
says *whether* a rate holds, this says *what the server was doing* at each rate. One
fresh chat server (or a floor relay, ``--target relay``) pinned to ``--server-core``, the
lab's fast driver pinned to ``--driver-core`` at each of ``--rates`` (sends/s; a step of
``--step-s`` each, ``--drain-s`` between), and a sampler (beside the driver) every
``--sample-s`` reading:

- the server port's established sockets (``ss``): the bytes unread in their receive
  queues and unsent in their send queues, and how many sockets hold any;
- the process: CPU (user, system), RSS, voluntary context switches, and per thread its
  CPU ticks and read and write syscalls (``/proc/PID/task/TID/{stat,io}``);
- the chat server's ``/stats`` (the store's queue and commits, the commit and loop-lag
  histograms, GC pauses, the load shedder, the store's refusals).

Each step is then cut to its send phase: the driver's figures (delivered/s, fan-out
p50/p99/max, errors, the server's CPU µs per delivered frame from schedstat) beside the
sampler's (the main thread's user and system µs per frame, socket writes per delivered
frame and reads per send, receive and send queues, the store's queue, commit size, time
and rate, the loop's lag and ticks, RSS). ``--pyspy-step I`` records the server with
py-spy (raw stacks) over the middle of step I; ``--perf-step I`` counts its syscalls per
thread with ``perf stat`` (both need the tool, and root or ptrace rights).

Writes ``steps.json`` (the driver's), ``samples.json``, ``summary.json``, ``probe.png``
(the looks against time: CPU, the sockets' queues, the store's queue and the loop's lag,
each step shaded) and the logs into ``--out`` (``reports/<time>-probe``). It owns the machine
while it runs: run nothing else.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench.lab.capacity import fast_driver
from bench.lab.matrix import Load
from bench.lab.plots import new_figure, save_png
from bench.lab.target import RelayProcess
from bench.tail import start_chat
from chatlab.harness import ROOT, pin_this_thread
from chatlab.settings import parse_core_list

__all__ = ["main", "plot", "summarize"]

#: the syscalls ``--perf-step`` counts (tracepoints), per thread
PERF_SYSCALLS = (
    "write",
    "writev",
    "sendto",
    "sendmsg",
    "read",
    "readv",
    "recvfrom",
    "recvmsg",
    "pwrite64",
    "pread64",
    "epoll_wait",
    "epoll_pwait",
    "fdatasync",
    "fsync",
    "futex",
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# ---- sampling ----------------------------------------------------------------------------


def socket_queues(port: int) -> dict[str, int]:
    """The server port's established sockets: bytes in their receive and send queues, and
    how many sockets hold any."""
    out = subprocess.run(
        ["ss", "-tnH", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    recv = sent = recv_n = sent_n = sockets = 0
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        r, s = int(fields[0]), int(fields[1])
        recv, sent, sockets = recv + r, sent + s, sockets + 1
        recv_n, sent_n = recv_n + (r > 0), sent_n + (s > 0)
    return {"recv_q": recv, "send_q": sent, "recv_q_sockets": recv_n, "send_q_sockets": sent_n}


def _io(path: str) -> dict[str, int]:
    with open(path) as f:
        return {key: int(value) for key, value in (line.split(":") for line in f)}


def threads_of(pid: int) -> dict[str, dict[str, Any]]:
    """Per thread: its name, CPU ticks (user, system) and syscall counters."""
    threads: dict[str, dict[str, Any]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            io = _io(f"/proc/{pid}/task/{tid}/io")
        except OSError:  # the thread ended meanwhile
            continue
        threads[tid] = {"name": name, "utime": int(fields[11]), "stime": int(fields[12]), "io": io}
    return threads


def sample(proc: psutil.Process, port: int, stats_url: str | None, t: float) -> dict[str, Any]:
    """One look at the server (see the module's docstring); ``err`` when it failed."""
    record: dict[str, Any] = {"t": t}
    try:
        record |= socket_queues(port)
        cpu = proc.cpu_times()
        record |= {"cpu_user": cpu.user, "cpu_sys": cpu.system, "rss": proc.memory_info().rss}
        record["voluntary_switches"] = proc.num_ctx_switches().voluntary
        record["threads"] = threads_of(proc.pid)
        if stats_url:
            with urllib.request.urlopen(stats_url, timeout=2) as response:
                record["stats"] = json.loads(response.read())
    except Exception as exc:  # a failed look is kept as one, not raised
        record["err"] = repr(exc)
    return record


# ---- the summary -------------------------------------------------------------------------


def _nearest(samples: list[dict[str, Any]], t: float) -> dict[str, Any]:
    return min((s for s in samples if "err" not in s), key=lambda s: abs(s["t"] - t))


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _threads(first: dict[str, Any], last: dict[str, Any], frames: float, sends: float) -> dict:
    """The main thread's CPU and syscalls per frame or send, and the other threads' CPU."""
    before, after = first["threads"], last["threads"]
    main = min(after, key=int)
    span = last["t"] - first["t"]

    def delta(tid: str, key: str) -> float:
        return after[tid][key] - before.get(tid, {key: 0})[key]

    def io(tid: str, key: str) -> float:
        return after[tid]["io"][key] - (before[tid]["io"][key] if tid in before else 0)

    others = [tid for tid in after if tid != main]
    others_s = sum(delta(t, "utime") + delta(t, "stime") for t in others) / CLOCK_TICKS
    writes = io(main, "syscw")
    return {
        "main_user_us_per_frame": _ratio(delta(main, "utime") / CLOCK_TICKS * 1e6, frames),
        "main_sys_us_per_frame": _ratio(delta(main, "stime") / CLOCK_TICKS * 1e6, frames),
        "main_writes_per_frame": _ratio(writes, frames),
        "main_frames_per_write": _ratio(frames, writes),
        "main_reads_per_send": _ratio(io(main, "syscr"), sends),
        "others_cpu_percent": 100 * others_s / span if span else None,
        "others": {
            after[t]["name"]: round(
                100 * (delta(t, "utime") + delta(t, "stime")) / CLOCK_TICKS / span, 1
            )
            for t in others
            if span and delta(t, "utime") + delta(t, "stime") > 0
        },
    }


def _server(first: dict[str, Any], last: dict[str, Any], inside: list[dict[str, Any]]) -> dict:
    """The chat server's own figures over the window, from ``/stats``."""
    a, b = first["stats"], last["stats"]
    span = last["t"] - first["t"]
    batches = b["store"]["batches_committed"] - a["store"]["batches_committed"]
    messages = b["store"]["messages_committed"] - a["store"]["messages_committed"]
    commit, commit0 = b["tail"]["commit"], a["tail"]["commit"]
    lag, lag0 = b["tail"]["loop_lag"], a["tail"]["loop_lag"]
    commits = commit["count"] - commit0["count"]
    ticks = lag["count"] - lag0["count"]
    queues = [s["stats"]["store"]["queue_depth"] for s in inside if "stats" in s]
    refused = {
        reason: count - a["store"].get("refused", {}).get(reason, 0)
        for reason, count in b["store"].get("refused", {}).items()
    }
    return {
        "commits_per_s": batches / span if span else None,
        "commit_size": _ratio(messages, batches),
        "commit_ms": _ratio(1e3 * (commit["sum_s"] - commit0["sum_s"]), commits),
        "store_queue_max": max(queues) if queues else None,
        "store_queue_median": statistics.median(queues) if queues else None,
        "store_refused": {k: v for k, v in refused.items() if v},
        "loop_lag_ms": _ratio(1e3 * (lag["sum_s"] - lag0["sum_s"]), ticks),
        "loop_ticks_per_s": ticks / span if span else None,
        "shed": b["tail"].get("overload", {}).get("refused", 0)
        - a["tail"].get("overload", {}).get("refused", 0),
    }


def summarize(steps: list[dict[str, Any]], samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step: the driver's figures and the sampler's over its send phase."""
    looks = [s for s in samples if "err" not in s]
    rows = []
    for step in steps:
        start = step["started_s"]
        end = start + step["duration_s"]
        latency = step.get("latency_ms") or {}
        delivered = step["delivered"]
        row: dict[str, Any] = {
            "rate": step.get("offered_per_s"),
            "delivered_per_s": step["delivered_per_s"],
            "lost": step["expected"] - delivered,
            "errors": step["errors"],
            "p50_ms": latency.get("p50"),
            "p99_ms": latency.get("p99"),
            "max_ms": latency.get("max"),
            "cpu_us_per_frame": _ratio(step.get("server_cpu_s") or 0.0, delivered / 1e6)
            if step.get("server_cpu_s")
            else None,
            "cpu_percent": 100 * step["server_cpu_s"] / step["window_s"]
            if step.get("server_cpu_s") and step.get("window_s")
            else None,
        }
        if len(looks) >= 2:
            first, last = _nearest(looks, start), _nearest(looks, end)
            span = last["t"] - first["t"]
            inside = [s for s in looks if start <= s["t"] <= end]
            frames = step["delivered_per_s"] * span
            sends = step.get("sent_per_s", 0) * span
            if span > 0 and inside:
                cpu_s = last["cpu_user"] + last["cpu_sys"] - first["cpu_user"] - first["cpu_sys"]
                row |= {
                    # over the send phase (the driver's window adds the drain)
                    "cpu_percent": 100 * cpu_s / span,
                    "recv_q_max": max(s["recv_q"] for s in inside),
                    "recv_q_sockets_max": max(s["recv_q_sockets"] for s in inside),
                    "send_q_max": max(s["send_q"] for s in inside),
                    "rss_mib_max": max(s["rss"] for s in inside) / 2**20,
                    "voluntary_switches_per_s": (
                        last["voluntary_switches"] - first["voluntary_switches"]
                    )
                    / span,
                }
                row |= _threads(first, last, frames, sends)
                if "stats" in first and "stats" in last:
                    row |= _server(first, last, inside)
        rows.append(row)
    return rows


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: list[dict[str, Any]]) -> str:
    """The summary as a table, one line per step."""
    head = (
        f"{'sends/s':>8} {'deliv/s':>9} {'p50':>6} {'p99':>7} {'max':>7} {'cpu%':>5}"
        f" {'us/fr':>6} {'user':>5} {'sys':>5} {'fr/wr':>6} {'recvQ':>7} {'sendQ':>8}"
        f" {'storeQ':>6} {'commit':>6} {'ms':>6} {'lag ms':>6} {'ticks':>5} {'RSS':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{_cell(r['rate'], '8,.0f')} {_cell(r['delivered_per_s'], '9,.0f')}"
            f" {_cell(r['p50_ms'], '6.1f')} {_cell(r['p99_ms'], '7.1f')}"
            f" {_cell(r['max_ms'], '7.1f')} {_cell(r.get('cpu_percent'), '5.0f')}"
            f" {_cell(r.get('cpu_us_per_frame'), '6.2f')}"
            f" {_cell(r.get('main_user_us_per_frame'), '5.2f')}"
            f" {_cell(r.get('main_sys_us_per_frame'), '5.2f')}"
            f" {_cell(r.get('main_frames_per_write'), '6.1f')}"
            f" {_cell(r.get('recv_q_max'), '7,d')} {_cell(r.get('send_q_max'), '8,d')}"
            f" {_cell(r.get('store_queue_max'), '6,d')} {_cell(r.get('commit_size'), '6.1f')}"
            f" {_cell(r.get('commit_ms'), '6.3f')} {_cell(r.get('loop_lag_ms'), '6.2f')}"
            f" {_cell(r.get('loop_ticks_per_s'), '5.0f')} {_cell(r.get('rss_mib_max'), '5.0f')}"
        )
    lines.append(
        "p50/p99/max: fan-out ms; cpu%: of a core over the send phase; us/fr: the server's CPU µs"
        " per delivered frame over the driver's window (user and sys: its main thread's, from"
        " ticks: on a VM the split can be biased, docs/decisions/0023); fr/wr: frames per"
        " socket write; recvQ/sendQ: bytes at most in the sockets' queues; storeQ: sends"
        " waiting for their commit at most; commit: sends per commit and ms each; lag: the"
        " 10-ms ticker's mean lateness and ticks/s; RSS MiB"
    )
    return "\n".join(lines)


def plot(steps: list[dict[str, Any]], samples: list[dict[str, Any]], out_png: Path) -> Path:
    """The sampler's looks against time, each step's send phase shaded and labelled with its
    rate: the server's CPU (% of a core), the sockets' queues (KB unread and unsent), and,
    for the chat server, its store's queue and its loop's lag: where a backlog sits and
    when the loop's iterations grow."""
    looks = [s for s in samples if "err" not in s]
    chat = any("stats" in s for s in looks)
    fig, axes = new_figure(3 if chat else 2, row_height=2.6, sharex=True)
    t = [s["t"] for s in looks]
    cpu = [
        100 * (b["cpu_user"] + b["cpu_sys"] - a["cpu_user"] - a["cpu_sys"]) / (b["t"] - a["t"])
        for a, b in itertools.pairwise(looks)
    ]
    axes[0].plot(t[1:], cpu, color="tab:blue", linewidth=1)
    axes[0].set_ylabel("server CPU (% of a core)")
    axes[0].set_ylim(0, 110)
    axes[1].plot(t, [s["recv_q"] / 1e3 for s in looks], color="tab:orange", label="unread (recv-Q)")
    axes[1].plot(t, [s["send_q"] / 1e3 for s in looks], color="tab:green", label="unsent (send-Q)")
    axes[1].set_ylabel("socket queues (KB)")
    axes[1].legend(loc="upper left", fontsize=7)
    if chat:
        stats = [s for s in looks if "stats" in s]
        axes[2].plot(
            [s["t"] for s in stats],
            [s["stats"]["store"]["queue_depth"] for s in stats],
            color="tab:purple",
            label="sends waiting for their commit",
        )
        axes[2].set_ylabel("store queue")
        lag = axes[2].twinx()
        ticks = [
            (b["t"], 1e3 * (lb["sum_s"] - la["sum_s"]) / (lb["count"] - la["count"]))
            for a, b in itertools.pairwise(stats)
            if (la := a["stats"]["tail"]["loop_lag"])["count"]
            < (lb := b["stats"]["tail"]["loop_lag"])["count"]
        ]
        lag.plot([x for x, _ in ticks], [y for _, y in ticks], color="tab:red", linewidth=1)
        lag.set_ylabel("loop lag, mean (ms)", color="tab:red")
        axes[2].legend(loc="upper left", fontsize=7)
    for ax in axes:
        for step in steps:
            start = step["started_s"]
            ax.axvspan(start, start + step["duration_s"], color="tab:gray", alpha=0.08)
    for step in steps:
        axes[0].annotate(
            f"{step.get('offered_per_s') or 0:,.0f}/s",
            (step["started_s"], 104),
            fontsize=7,
        )
    axes[0].set_title("the server from outside, each step's send phase shaded", fontsize=9)
    axes[-1].set_xlabel("seconds from the start")
    return save_png(fig, out_png)


# ---- the run -----------------------------------------------------------------------------


def start(args: argparse.Namespace, workdir: Path) -> tuple[Any, str, int, str | None, Path | None]:
    """The server (or relay): it, its URL, its pid, its ``/stats`` URL, the driver's tokens."""
    if args.target == "relay":
        cores = parse_core_list(args.server_core) or []
        relay = RelayProcess(workdir, cores, transport=args.transport, mode=args.relay_mode)
        relay.start()
        return relay, relay.url, relay.proc.pid, None, None
    env = dict(pair.split("=", 1) for pair in args.env)
    defaults = {"serializer": "orjson", "event_loop": "uvloop", "ws_deflate": "off"}
    server, tokens, _ = start_chat(
        workdir,
        defaults | {"transport": args.transport} | {k.lower(): v for k, v in env.items()},
        server_core=args.server_core,
        connections=args.connections,
        room_size=args.room_size,
    )
    return server, server.url, server.proc.pid, server.http_url("/stats"), tokens


def attach(args: argparse.Namespace, pid: int, begins: float, out: Path) -> list[threading.Thread]:
    """Start py-spy or perf over the middle of their steps (``begins``: monotonic time the
    first step starts)."""
    period = args.step_s + args.drain_s
    duration = max(1, int(args.step_s) - 2)
    wanted = []
    if args.pyspy_step is not None:
        raw = out / f"pyspy-step{args.pyspy_step}.txt"
        command = ["py-spy", "record", "--pid", str(pid), "--rate", "250", "--format", "raw"]
        command += ["--nonblocking", "--threads", "--duration", str(duration), "-o", str(raw)]
        wanted.append((args.pyspy_step, command))
    if args.perf_step is not None:
        events = ",".join(f"syscalls:sys_enter_{name}" for name in PERF_SYSCALLS)
        text = out / f"perf-step{args.perf_step}.txt"
        command = ["perf", "stat", "--per-thread", "-x", ",", "-o", str(text), "-e", events]
        command += ["-p", str(pid), "--", "sleep", str(duration)]
        wanted.append((args.perf_step, command))
    tools = []
    for step, command in wanted:
        at = begins + step * period + (args.step_s - duration) / 2

        def run(at: float = at, command: list[str] = command) -> None:
            time.sleep(max(0.0, at - time.monotonic()))
            pinned = ["taskset", "-c", args.driver_core] if args.driver_core != "off" else []
            done = subprocess.run(pinned + command, capture_output=True, text=True, check=False)
            if done.returncode:
                print(f"probe: {command[0]} failed: {done.stderr[-500:]}", file=sys.stderr)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        tools.append(thread)
    return tools


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start, drive, sample; write the files; the summary rows."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    server, url, pid, stats_url, tokens = start(args, out)
    t0 = time.monotonic()
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    port = int(url.rsplit(":", 1)[1].split("/")[0])

    def sampler() -> None:
        pin_this_thread(parse_core_list(args.driver_core))  # beside the driver
        proc = psutil.Process(pid)
        while not stop.is_set():
            samples.append(sample(proc, port, stats_url, time.monotonic() - t0))
            stop.wait(args.sample_s)

    load = Load(
        connections=args.connections,
        room_size=args.room_size,
        rates=tuple(args.rates),
        step_s=args.step_s,
        warmup_s=args.warmup_s,
        drain_s=args.drain_s,
    )
    driver_args = fast_driver(
        load,
        target="chat" if args.target == "chat" else "relay",
        url=url,
        env={"SERIALIZER": "orjson"},
        cpu_affinity=args.driver_core,
        token_file=tokens,
        json_out=out / "steps.json",
        t0_monotonic=t0,
        server_pid=pid,
        server_cores=args.server_core,
    )
    command = [*driver_args.command(), "--log-level", "info"]
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    tools: list[threading.Thread] = []
    try:
        with (out / "driver.log").open("w") as log:
            driver = subprocess.Popen(command, stdout=log, stderr=subprocess.PIPE, text=True)
            assert driver.stderr is not None
            for line in driver.stderr:
                log.write(line)
                if not args.quiet:
                    sys.stderr.write(line)
                if not tools and "connections open" in line:
                    tools = attach(args, pid, time.monotonic() + args.warmup_s, out)
            status = driver.wait()
        for tool in tools:
            tool.join(timeout=args.step_s + 30)
    finally:
        stop.set()
        thread.join()
        server.stop()
    (out / "samples.json").write_text(json.dumps(samples))
    if status != 0:
        raise SystemExit(f"probe: the driver exited with {status}; see {out / 'driver.log'}")
    steps = json.loads((out / "steps.json").read_text())
    steps = steps["steps"] if isinstance(steps, dict) else steps
    rows = summarize(steps, samples)
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    if len([s for s in samples if "err" not in s]) >= 2:
        plot(steps, samples, out / "probe.png")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse, run, print the table; 0, or the driver's failure."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.probe",
        description="Fixed-rate steps against one fresh chat server or floor relay, sampled"
        " from outside every 0.25 s: sockets' queues, threads, the store, the loop.",
    )
    parser.add_argument("--target", choices=("chat", "relay"), default="chat")
    parser.add_argument("--transport", choices=("websockets", "picows"), default="websockets")
    parser.add_argument(
        "--relay-mode", default="coalesced", help="the relay's mode (default: coalesced)"
    )
    parser.add_argument(
        "--rates",
        type=lambda text: [float(r) for r in text.split(",")],
        default=[1000.0, 5000.0, 12000.0],
        help="sends/s, one step each (default: 1000,5000,12000; x room size delivered)",
    )
    parser.add_argument("--step-s", type=float, default=8.0, help="seconds per step (default: 8)")
    parser.add_argument("--drain-s", type=float, default=2.0, help="between steps (default: 2)")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="before the first (2)")
    parser.add_argument("--connections", type=int, default=2000, help="(default: 2000)")
    parser.add_argument("--room-size", type=int, default=10, help="(default: 10)")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a chat server setting (repeatable); orjson, uvloop, deflate off unless set",
    )
    parser.add_argument("--server-core", default="0", help="the server's core (default: 0)")
    parser.add_argument("--driver-core", default="1", help="the driver's core (default: 1)")
    parser.add_argument("--sample-s", type=float, default=0.25, help="(default: 0.25)")
    parser.add_argument("--pyspy-step", type=int, metavar="I", help="py-spy over step I")
    parser.add_argument("--perf-step", type=int, metavar="I", help="perf stat over step I")
    parser.add_argument("--out", type=Path, help="(default: reports/<time>-probe)")
    parser.add_argument("--quiet", action="store_true", help="no driver progress lines")
    args = parser.parse_args(argv)
    if any("=" not in pair for pair in args.env):
        parser.error("--env takes NAME=VALUE")
    if args.target == "relay" and args.env:
        parser.error("--env sets the chat server's settings: the relay has none")
    if args.out is None:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        args.out = ROOT / "reports" / f"{stamp}-probe"
    rows = run(args)
    print(table(rows))
    print(f"wrote {args.out}/summary.json, probe.png, steps.json, samples.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
