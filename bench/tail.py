"""``python -m bench.tail``: the tail at a steady load, with the server's own view of it.

Each run starts a fresh chat server pinned to one core (tokens minted with a throwaway
key pair, ``RATE_LIMIT_PER_S`` raised as in the lab), has the lab's fast driver, pinned
to another core, open ``--connections`` in rooms of 10 and offer ``--rate`` sends/s for
``--duration-s``, and scrapes the server's ``/metrics`` every 0.5 s meanwhile. The
scrapes bracketing the steady window tell what happened *inside* it apart from the
connection ramp before and the idle time after: GC pauses per generation (how many,
how many over 10 ms), the event loop's lateness, commits, ``unavailable`` errors. It
prints one line per run (fan-out p99 and max from the driver, the server's figures
for the window; ``--histograms`` adds the window's GC pause, commit, loop-lag and
restart-hold histograms) and ``--json`` writes them. For every second with a delivery over 20 ms
it adds the server's CPU, how long its loop waited for its core (schedstat), how long
the host took that core from this VM (steal, ``/proc/stat``) and the history store's
holds of the commits of 10 ms or more that overlapped it. Runs ``--repeat`` times, alternating the
``--env`` variants if several are given (``--env GC_POLICY=default --env
GC_POLICY=tuned``: each value of a name is one variant), and ends with a summary per
variant: medians and ranges, and in how many runs the max stayed under ``--bound-ms``
(50) with no GC pause over 10 ms and no ``unavailable``; a run whose driver was the
limit too (generator-limited) is named with why, and not counted.

``--relay`` adds the bare websockets relay (``bench.relay``) as one more variant, run
the same way: how much of the tail the transport and the host make with no chat server
at all. By default it is the transport's floor relay (``--relay coalesced``: each
message framed once, one write per member per loop iteration, as the chat server
writes), the relay the lab compares the server with; ``--relay recv-broadcast`` runs the
relay as usually written (``async for message in conn: broadcast``), and both may be
given. A relay has no metrics: of it the runs know the driver's figures, its CPU
(psutil), its loop's wait for its core and the host's steal. ``--server-root PATH`` (repeatable)
runs the chat server's code from another checkout, each one a variant: before and after
a change, interleaved, with this harness (a server from before the metrics it reads gets
its CPU from psutil, and the summary says what was not measured).

``--of-capacity 0.7`` first measures each variant's capacity on a fresh server (the
fast driver climbs by 1.25 times a step from ``--capacity-start-rate`` with
``--capacity-step-s``-second steps, 20 by default, until p99 passes 100 ms) and runs
that variant at 0.7 of its knee instead of ``--rate``: "70 % of the capacity just
measured" in one command. A 5-s step's knee is a burst's, higher than a 20-s step's, and
a minute at 70 % of it is far past the tail that 70 % of a steady knee holds
(``docs/decisions/0012-the-instrument.md``).

A load measurement owns the machine: nothing else heavy may run meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.lab.capacity import climbing, fast_driver
from bench.lab.machine import steal_s
from bench.lab.matrix import Load
from bench.lab.results import Run, Step, edge
from bench.lab.target import RelayProcess
from bench.tail_window import (  # re-exported: the figures bench.tail reports
    CPU,
    GC_PAUSES,
    NO_STALLS,
    SCRAPE_EVERY_S,
    STEAL_NOTABLE_MS,
    STOLEN,
    TAIL_BOUND_S,
    WAITED,
    WINDOW_HISTOGRAMS,
    core_wait_s,
    held_commits,
    scrape,
    second_figures,
    stalls,
    window_figures,
    window_histogram,
)
from chatlab.harness import KeyPair, ServerProcess, free_port, pin_this_thread
from chatlab.settings import parse_core_list

#: the ``--env`` name a ``--server-root`` arrives as: the chat server's code for a variant
SERVER_ROOT = "server_root"
#: what ``--of-capacity``'s climb holds: the lab's headline SLO
CAPACITY_SLO_MS = {"p99": 100.0}
#: the ``--relay`` modes (``bench.relay_base.MODES`` on websockets): the transport's floor
#: (each message framed once, one write per member per loop iteration; the default, what
#: the lab compares the chat server with) and the relay as it is usually written
RELAY_MODES = ("coalesced", "recv-broadcast")


def relay_variant(mode: str) -> dict[str, str]:
    """The ``--relay MODE`` variant: the bare websockets relay (``bench.relay``) in ``mode``."""
    return {"target": "relay", "mode": mode}


def is_relay(env: dict[str, str]) -> bool:
    """Whether the variant ``env`` is a bare relay, not a chat server."""
    return env.get("target") == "relay"


#: the ``--relay`` variant without a mode: the websockets floor relay
RELAY = relay_variant("coalesced")


@dataclass(frozen=True)
class Target:
    """What the driver loads: ``chat`` or ``relay``, its URL, the chat server's tokens."""

    kind: str
    url: str
    token_file: Path | None = None


def start_server(
    args: argparse.Namespace, env: dict[str, str], workdir: Path
) -> tuple[ServerProcess | RelayProcess, Target, int | None]:
    """A fresh chat server pinned to ``--server-core`` with ``env`` (or, for :data:`RELAY`,
    the bare websockets relay: uvloop, deflate off); it, what the driver loads, and its
    metrics port (None: the relay has none)."""
    if is_relay(env):
        cores = parse_core_list(args.server_core) or []
        relay = RelayProcess(workdir, cores, mode=env.get("mode")).start()
        return relay, Target("relay", relay.url), None
    root = env.get(SERVER_ROOT)
    env = {k: v for k, v in env.items() if k != SERVER_ROOT}
    server, tokens, metrics_port = start_chat(
        workdir, env, server_core=args.server_core, connections=args.connections, root=root
    )
    return server, Target("chat", server.url, tokens), metrics_port


def start_chat(
    workdir: Path,
    env: dict[str, str],
    *,
    server_core: str,
    connections: int,
    room_size: int = 10,
    root: str | None = None,
) -> tuple[ServerProcess, Path, int]:
    """A fresh chat server for the lab's driver: pinned to ``server_core``, with ``env``
    (settings by name), a metrics port, rate limits raised and room for ``connections``;
    it, a file of tokens for the driver (one user per room of ``room_size``) and its
    metrics port.
    ``root``: its code from another checkout (an older commit, to compare)."""
    keys = KeyPair(workdir)
    tokens = workdir / "tokens.json"
    metrics_port = free_port()
    users = max(1, connections // room_size)
    tokens.write_text(json.dumps({f"load{i}": keys.mint(f"load{i}", 3600) for i in range(users)}))
    server = ServerProcess(
        workdir,
        keys,
        cpu_affinity=server_core,
        metrics_port=metrics_port,
        rate_limit_per_s=100000,
        rate_limit_burst=100000,
        max_connections=connections + 100,
        log_level="warning",
        **env,
    )
    if root is not None:
        server.env["PYTHONPATH"] = str(Path(root).resolve())
    server.start(timeout_s=30)
    return server, tokens, metrics_port


def env_rate(args: argparse.Namespace, env: dict[str, str]) -> float:
    """The send rate of ``env``'s runs: ``--of-capacity`` times its knee, else ``--rate``."""
    return float(args.rate_of.get(tuple(sorted(env.items())), args.rate))


def knee(steps: list[dict[str, Any]], slo: dict[str, float]) -> tuple[float | None, bool]:
    """The climb's knee by the lab's one definition (:func:`bench.lab.results.edge`: the
    step that held ``slo`` with the most delivered/s, superseded steps left out), as the
    offered rate (sends/s) of that step (None when no step held), and whether it is a
    real edge (False: nothing above it broke, or the driver explains the break, so the
    knee lies higher)."""
    run = Run(config="climb", repeat=0, target="", env={}, steps=[Step.from_dict(s) for s in steps])
    found = edge(run, slo)
    return found.capacity_offered_per_s, not found.lower_bound


def measure_capacity(
    args: argparse.Namespace, env: dict[str, str], workdir: Path
) -> tuple[float, bool]:
    """Climb a fresh server with the fast driver (``--capacity-step-s`` steps, rates times
    1.25 from ``--capacity-start-rate``, p99 under 100 ms): its knee in sends/s, and
    whether a step above it broke (see :func:`knee`)."""
    server, target, _ = start_server(args, env, workdir)
    out = workdir / "climb.json"
    load = climbing(
        Load(connections=args.connections, step_s=args.capacity_step_s, drain_s=2),
        slo_ms=CAPACITY_SLO_MS,
        start_rate=args.capacity_start_rate,
        factor=1.25,
        max_rate=args.capacity_max_rate,
    )
    try:
        status = drive(
            args, env, target, load, json_out=out, log_path=workdir / "climb.log", timeout_s=3600
        )
    finally:
        server.stop()
    if status != 0 or not out.exists():
        raise RuntimeError(f"the climb's driver exited {status}: see {workdir / 'climb.log'}")
    rate, bracketed = knee(json.loads(out.read_text()), CAPACITY_SLO_MS)
    if rate is None:
        raise RuntimeError(f"no step of the climb held p99 < 100 ms: see {workdir / 'climb.log'}")
    return rate, bracketed


def drive(
    args: argparse.Namespace,
    env: dict[str, str],
    target: Target,
    load: Load,
    *,
    json_out: Path,
    log_path: Path,
    timeout_s: float,
    t0_monotonic: float | None = None,
    continuous: bool = False,
) -> int:
    """Run the lab's fast driver with ``load`` against ``target`` on ``--driver-core``,
    its output in ``log_path``; its exit status. ``continuous``: the driver's
    ``--continuous`` (a delivery counts to the step it arrives in)."""
    command = fast_driver(
        load,
        target=target.kind,
        url=target.url,
        env=env,
        cpu_affinity=args.driver_core,
        token_file=target.token_file,
        json_out=json_out,
        t0_monotonic=t0_monotonic,
        continuous=continuous,
    ).command()
    with log_path.open("w") as log:
        return subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
        ).returncode


@dataclass
class TailRun:
    """One steady run: the driver's figures, and the server's for the window. Of the relay
    (no metrics, no /stats) only its CPU, its wait for its core and the host's steal are
    known: ``server_metrics`` is False and its server counts are 0."""

    env: dict[str, str]
    rate: float  # sends/s offered
    # False for the relay, or a server from before these metrics: its GC, loop, commit
    # and error figures are not known (0)
    server_metrics: bool
    sent_per_s: float
    delivered_per_s: float
    p99_ms: float
    max_ms: float
    errors: int
    generator_limited: bool
    # why the driver's figures measure the driver too (bench.lab.driver's tests)
    generator_notes: list[str]
    generator_cpu_percent: float | None
    max_send_lag_ms: float
    generator_gc_runs: int
    window_start_monotonic: float
    window_s: float
    cpu_percent: float
    cpu_us_per_frame: float
    # what the server counted inside the window (:func:`window_figures`): GC pauses per
    # generation, late loop ticks, commits, unavailable errors, CPU seconds
    server: dict[str, float]
    late_ticks_ms: list[float]
    late_ticks_at: list[float]
    late_tick_causes: dict[str, int]
    checkpointer: dict[str, Any]  # since the server started (SQLite store only)
    # the seconds of the window whose slowest delivery passed the tail bound
    slow_seconds: list[dict[str, Any]]
    histograms: dict[str, dict[str, int]]
    window_core_wait_ms_per_s: float | None = None
    window_core_steal_ms_per_s: float | None = None
    repeat: int = 0

    def to_json(self) -> dict[str, Any]:
        """The run as ``--json`` writes it: one flat object, the server's counts beside
        the rest (absent optional figures left out)."""
        data = {k: v for k, v in asdict(self).items() if k != "server" and v is not None}
        return {**data, **self.server}


def one_run(args: argparse.Namespace, env: dict[str, str], workdir: Path) -> TailRun:
    """One server, one steady step; the driver's figures and the server's for the window.
    Of the relay (no metrics, no /stats) only its CPU, its wait for its core and the
    host's steal are known."""
    server, target, metrics_port = start_server(args, env, workdir)
    scrapes: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()

    assert server.proc is not None
    chat = isinstance(server, ServerProcess)
    loops = (server.worker_pids() if chat else []) or [server.proc.pid]
    process = psutil.Process(server.proc.pid)
    server_cores = set(parse_core_list(args.server_core) or ())

    def scrape_loop() -> None:
        # the harness's own work runs beside the driver, not on the server's core
        pin_this_thread(parse_core_list(args.driver_core))
        while not stop.is_set():
            with contextlib.suppress(OSError, psutil.Error):  # not up yet, or gone
                samples = scrape(metrics_port) if metrics_port else {}
                if CPU not in samples:  # the relay, or a server from before the collector
                    times = process.cpu_times()
                    samples[CPU] = times.user + times.system
                waited = core_wait_s(loops)
                if waited is not None:
                    samples[WAITED] = waited
                stolen = steal_s(server_cores)
                if stolen is not None:
                    samples[STOLEN] = stolen
                scrapes.append((time.monotonic(), samples))
            stop.wait(SCRAPE_EVERY_S)

    scraper = threading.Thread(target=scrape_loop, daemon=True)
    out = workdir / "driver.json"
    t0 = time.monotonic()
    try:
        scraper.start()
        steady = Load(
            connections=args.connections,
            rates=(env_rate(args, env),),
            step_s=args.duration_s,
            warmup_s=2,
            drain_s=1,
        )
        status = drive(
            args,
            env,
            target,
            steady,
            json_out=out,
            log_path=workdir / "driver.log",
            timeout_s=args.duration_s + 180,
            t0_monotonic=t0,
        )
        if status != 0 or not out.exists():
            raise RuntimeError(f"fast driver exited {status}: see {workdir / 'driver.log'}")
        # a server from before /stats had its tail (--server-root) has none
        tail = server.stats().get("tail") if chat else None
    finally:
        stop.set()
        scraper.join()
        server.stop()
    step = json.loads(out.read_text())[-1]
    start = t0 + step["started_s"]
    end = start + step["duration_s"]
    # the same window on the wall clock, for the events /stats remembers with their time
    wall_start = time.time() - (time.monotonic() - start)
    # the last scrape before the window and the first after it: a superset of the window
    before = max((s for s in scrapes if s[0] <= start), key=lambda s: s[0], default=None)
    after = min((s for s in scrapes if s[0] >= end), key=lambda s: s[0], default=None)
    if before is None or after is None:
        raise RuntimeError("no scrape brackets the steady window")
    window_s = after[0] - before[0]
    figures = window_figures(before[1], after[1])
    # the scrapes bracket the window by up to SCRAPE_EVERY_S each side: a close estimate
    cpu_percent = 100 * figures["cpu_s"] / window_s
    server_side = second_figures(scrapes, before[0], after[0])
    ticks = stalls(tail, wall_start, wall_start + step["duration_s"]) if tail else NO_STALLS
    return TailRun(
        env=env,
        rate=env_rate(args, env),
        server_metrics=GC_PAUSES in after[1],
        sent_per_s=step["sent_per_s"],
        delivered_per_s=step["delivered_per_s"],
        p99_ms=step["latency_ms"]["p99"],
        max_ms=step["latency_ms"]["max"],
        errors=step["errors"],
        generator_limited=step["generator_limited"],
        generator_notes=step.get("generator_notes", []),
        generator_cpu_percent=step["generator_cpu_percent"],
        max_send_lag_ms=step["max_send_lag_ms"],
        generator_gc_runs=step.get("generator_gc_runs", 0),
        window_start_monotonic=round(start, 4),
        window_s=round(window_s, 2),
        cpu_percent=cpu_percent,
        cpu_us_per_frame=1e6 * figures["cpu_s"] / window_s / step["delivered_per_s"],
        server=figures,
        late_ticks_ms=ticks["late_ticks_ms"],
        late_ticks_at=ticks["late_ticks_at"],
        late_tick_causes=ticks["late_tick_causes"],
        checkpointer=tail.get("checkpointer", {}) if tail else {},
        slow_seconds=[
            {
                "t_s": round(p["t_s"] - step["started_s"], 1),
                "max_ms": p["max_ms"],
                **second_figures(scrapes, t0 + p["t_s"] - 1, t0 + p["t_s"]),
                **(held_commits(tail, wall_start + p["t_s"] - step["started_s"]) if tail else {}),
            }
            for p in step["timeline"]
            if p.get("max_ms") and p["max_ms"] > TAIL_BOUND_S * 1e3 * 2
        ],
        histograms={
            key: window_histogram(before[1], after[1], family, labels)
            for key, (family, labels) in WINDOW_HISTOGRAMS.items()
        },
        # the scrapes bracket the window by up to SCRAPE_EVERY_S each side: close estimates
        window_core_wait_ms_per_s=server_side.get("core_wait_ms_per_s"),
        window_core_steal_ms_per_s=server_side.get("core_steal_ms_per_s"),
    )


def variant_name(env: dict[str, str]) -> str:
    """``GC_POLICY=tuned``: a variant as its settings, or ``defaults``."""
    if is_relay(env):
        return f"websockets relay ({env.get('mode', 'recv-broadcast')})"
    return " ".join(f"{n.upper()}={v}" for n, v in env.items()) or "defaults"


def _median_range(values: list[float], fmt: str) -> str:
    """``12.3 (10.1-15.0)``: the median of ``values`` and their range (one value alone)."""
    ordered = sorted(values)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    if n == 1:
        return format(median, fmt)
    return f"{median:{fmt}} ({ordered[0]:{fmt}}-{ordered[-1]:{fmt}})"


def summary(runs: list[TailRun], bound_ms: float) -> list[str]:
    """The end of a session, one paragraph per variant: the medians and ranges of its
    runs, and whether the tail bound held in each.

    A run "holds" when its fan-out max is under ``bound_ms``, its server paused for no
    GC over 10 ms and sent no ``unavailable``. A run whose driver was marked
    generator-limited measured the driver too: it is named, with why, and not counted
    either way.
    """
    lines: list[str] = []
    by_name: dict[str, list[TailRun]] = {}
    for run in runs:
        by_name.setdefault(variant_name(run.env), []).append(run)
    for name, group in by_name.items():
        rates = "/".join(f"{r:g}" for r in sorted({run.rate for run in group}))
        lines.append(
            f"{name}: {len(group)} run(s) at {rates} sends/s: p99"
            f" {_median_range([r.p99_ms for r in group], '.1f')} ms, max"
            f" {_median_range([r.max_ms for r in group], '.1f')} ms, server"
            f" {_median_range([r.cpu_us_per_frame for r in group], '.2f')} µs of CPU per"
            " delivered frame (medians, range in brackets)"
        )
        counted = [r for r in group if not r.generator_limited]
        held = []
        failed = []
        for run in counted:
            why = []
            if run.max_ms >= bound_ms:
                why.append(f"max {run.max_ms:.1f} ms")
            gc_over = sum(run.server.get(f"gc{g}_over_10ms", 0) for g in "012")
            if gc_over:
                why.append(f"{gc_over:.0f} GC pause(s) over 10 ms")
            if run.server.get("unavailable"):
                why.append(f"{run.server['unavailable']:.0f} unavailable")
            (failed if why else held).append((run, why))
        measured = all(r.server_metrics for r in group)
        verdict = (
            f"    max under {bound_ms:g} ms"
            + (
                ", no GC pause over 10 ms and no unavailable"
                if measured
                else " (its GC pauses and errors are not measured)"
            )
            + f": held in {len(held)} of the {len(counted)} run(s) the driver kept pace with"
        )
        if failed:
            verdict += "; not in " + ", ".join(
                f"run {run.repeat} ({', '.join(why)}{_stolen(run)})" for run, why in failed
            )
        lines.append(verdict)
        over = [p for run in group for p in run.slow_seconds if p["max_ms"] >= bound_ms]
        if over:
            stole = [p.get("core_steal_ms_per_s", 0) >= STEAL_NOTABLE_MS for p in over]
            held = [bool(p.get("holds_ms")) for p in over]
            neither = sum(not (s or h) for s, h in zip(stole, held, strict=True))
            lines.append(
                f"    seconds with a delivery of {bound_ms:g} ms or more: {len(over)} in"
                f" {len(group)} run(s); the host stole {STEAL_NOTABLE_MS:g} ms or more of"
                f" the server's core in {sum(stole)}, the commits were held 10 ms or more"
                f" in {sum(held)}, neither in {neither}"
            )
        for run in group:
            if run.generator_limited:
                notes = "; ".join(run.generator_notes) or "generator-limited"
                lines.append(
                    f"    run {run.repeat} not counted: the driver was the limit too"
                    f" ({notes}){_stolen(run)}; its max was {run.max_ms:.1f} ms"
                )
    return lines


def _stolen(run: TailRun) -> str:
    steal = run.window_core_steal_ms_per_s
    return "" if steal is None else f", the host stole {steal:.0f} ms/s of the server's core"


def looked(figures: dict[str, Any]) -> str:
    """`` (cpu 81 %, waited 3.2 ms)``: what the server did around a second (or the window),
    from :func:`second_figures`; empty when it has neither."""
    parts = []
    if "cpu_percent" in figures:
        parts.append(f"cpu {figures['cpu_percent']:.0f} %")
    if "core_wait_ms_per_s" in figures:
        parts.append(f"waited {figures['core_wait_ms_per_s']:.1f} ms")
    if figures.get("core_steal_ms_per_s"):
        parts.append(f"host stole {figures['core_steal_ms_per_s']:.0f} ms")
    if figures.get("holds_ms"):
        parts.append(f"commits held {'/'.join(f'{h:g}' for h in figures['holds_ms'])} ms")
    return f" ({', '.join(parts)})" if parts else ""


def parse_variants(pairs: list[str]) -> list[dict[str, str]]:
    """``NAME=VALUE`` items: each value of a name is one variant (others shared)."""
    shared: dict[str, str] = {}
    varied: dict[str, list[str]] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"bad --env {pair!r}: NAME=VALUE")
        varied.setdefault(name.lower(), []).append(value)
    variants: list[dict[str, str]] = [{}]
    for name, values in varied.items():
        if len(values) == 1:
            shared[name] = values[0]
            continue
        variants = [{**v, name: value} for v in variants for value in values]
    return [{**shared, **v} for v in variants]


def main(argv: list[str] | None = None) -> int:
    """Run the steady steps and print one line per run."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.tail", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rate", type=float, default=14000, help="sends/s [14000]")
    parser.add_argument("--connections", type=int, default=2000, help="in rooms of 10 [2000]")
    parser.add_argument("--duration-s", type=float, default=60, help="steady window [60]")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each variant [3]")
    parser.add_argument(
        "--env", action="append", default=[], help="server setting NAME=VALUE (repeatable)"
    )
    parser.add_argument("--server-core", default="0", help="the server's core [0]")
    parser.add_argument("--driver-core", default="1", help="the driver's core [1]")
    parser.add_argument(
        "--histograms",
        action="store_true",
        help="also print each run's GC pause, commit, loop-lag and WAL restart-hold histograms"
        " for the window",
    )
    parser.add_argument(
        "--of-capacity",
        type=float,
        metavar="FRACTION",
        help="first climb each variant to its knee (p99 < 100 ms) on a fresh server and run"
        " at FRACTION of it instead of --rate (e.g. 0.7)",
    )
    parser.add_argument(
        "--capacity-step-s",
        type=float,
        default=20,
        help="seconds per climb step: long enough to be steady [20]",
    )
    parser.add_argument(
        "--capacity-start-rate", type=float, default=10000, help="the climb's first rate [10000]"
    )
    parser.add_argument(
        "--capacity-max-rate", type=float, default=40000, help="the climb's top rate [40000]"
    )
    parser.add_argument(
        "--bound-ms",
        type=float,
        default=50,
        help="the summary says in how many runs the fan-out max stayed under this [50]",
    )
    parser.add_argument(
        "--relay",
        action="append",
        nargs="?",
        const="coalesced",
        choices=RELAY_MODES,
        default=[],
        metavar="MODE",
        help="also run the bare websockets relay (bench.relay: uvloop, deflate off) as a"
        " variant, at --rate or at --of-capacity of its own knee: the same tail on the"
        " transport alone, on the same host. MODE coalesced (without MODE): the transport's"
        " floor, each message framed once and one write per member per loop iteration, as"
        " the chat server writes; recv-broadcast: the relay as usually written. Repeatable",
    )
    parser.add_argument(
        "--server-root",
        action="append",
        default=[],
        metavar="PATH",
        help="run the chat server's code from this checkout (repeatable: each is a variant,"
        " . for this one; e.g. a git worktree of the commit before a change)",
    )
    parser.add_argument("--json", type=Path, help="also write the runs here")
    args = parser.parse_args(argv)
    if args.of_capacity is not None and not 0 < args.of_capacity <= 1:
        parser.error("--of-capacity must be in (0, 1]")
    args.rate_of = {}
    try:
        variants = parse_variants(
            args.env + [f"{SERVER_ROOT}={Path(root).resolve()}" for root in args.server_root]
        )
    except ValueError as exc:
        parser.error(str(exc))
    for mode in dict.fromkeys(args.relay):
        variants.append(relay_variant(mode))
    runs = []
    header = (
        f"{'settings':<28}{'p99 ms':>8}{'max ms':>8}{'gc0/1/2':>10}{'>10ms':>7}"
        f"{'late>10ms':>10}{'commits':>9}{'>10ms':>7}{'unavail':>8}{'cpu %':>7}{'us/frame':>9}"
    )
    if args.of_capacity is not None:
        for env in variants:
            name = variant_name(env)
            print(f"climbing {name} ({args.capacity_step_s:g}-s steps)...", file=sys.stderr)
            with tempfile.TemporaryDirectory(prefix="chatlab-tail-climb-") as tmp:
                capacity, bracketed = measure_capacity(args, env, Path(tmp))
            rate = round(args.of_capacity * capacity)
            args.rate_of[tuple(sorted(env.items()))] = rate
            at_least = "" if bracketed else "≥ "
            print(
                f"capacity of {name}: {at_least}{capacity:g} sends/s ({10 * capacity:,.0f}"
                f" delivered/s in rooms of 10); its runs at {args.of_capacity:g} of it:"
                f" {rate:g} sends/s"
                + ("" if bracketed else " (no step above the knee broke: it lies higher)"),
                file=sys.stderr,
            )
    rates = sorted({env_rate(args, env) for env in variants})
    print(
        f"steady {args.duration_s:g} s at {'/'.join(f'{r:g}' for r in rates)} sends/s,"
        f" {args.connections} connections",
        file=sys.stderr,
    )
    print(header)
    for k in range(args.repeat):
        for env in variants:
            with tempfile.TemporaryDirectory(prefix="chatlab-tail-") as tmp:
                run = one_run(args, env, Path(tmp))
            run.repeat = k + 1
            runs.append(run)
            name = variant_name(env)
            counts = run.server
            pauses = "/".join(f"{counts[f'gc{g}_pauses']:.0f}" for g in "012")
            over = sum(counts[f"gc{g}_over_10ms"] for g in "012")
            inside = (
                f"{pauses:>10}{over:>7.0f}{counts['loop_late_over_10ms']:>10.0f}"
                f"{counts['commits']:>9.0f}{counts['commits_over_10ms']:>7.0f}"
                f"{counts['unavailable']:>8.0f}"
                if run.server_metrics
                else f"{'-':>10}{'-':>7}{'-':>10}{'-':>9}{'-':>7}{'-':>8}"
            )
            print(
                f"{name:<28}{run.p99_ms:>8.1f}{run.max_ms:>8.1f}{inside}"
                f"{run.cpu_percent:>7.1f}{run.cpu_us_per_frame:>9.2f}"
                + ("  generator-limited" if run.generator_limited else ""),
                flush=True,
            )
            slow = ", ".join(
                f"{p['t_s']:g}: {p['max_ms']:.1f}{looked(p)}" for p in run.slow_seconds
            )
            print(
                f"    driver: cpu {run.generator_cpu_percent or 0:.0f}%, max send lag"
                f" {run.max_send_lag_ms:.1f} ms, its GC ran {run.generator_gc_runs}"
                " times; seconds with a delivery over"
                f" {2 * TAIL_BOUND_S * 1e3:g} ms (s into the window: max ms, and the server"
                f" around it): {slow or 'none'}"
            )
            server_notes = []
            if run.window_core_wait_ms_per_s is not None:
                server_notes.append(
                    "its loop waited for its core"
                    f" {run.window_core_wait_ms_per_s:.1f} ms a second over the window"
                )
            if run.window_core_steal_ms_per_s is not None:
                server_notes.append(
                    "the host stole its core"
                    f" {run.window_core_steal_ms_per_s:.1f} ms a second over the window"
                )
            checkpointer = run.checkpointer
            if checkpointer:
                server_notes.append(
                    f"{checkpointer['checkpoints']} checkpoints since start,"
                    f" {checkpointer['catch_ups']} of them raised to normal priority"
                    " (starved)"
                )
            if "wal_restarts" in checkpointer:
                server_notes.append(
                    f"the WAL restarted {checkpointer['wal_restarts']} times in"
                    f" {checkpointer['restart_holds']} holds of the commits (longest"
                    f" {1e3 * checkpointer['restart_hold_max_s']:.1f} ms), its file at most"
                    f" {checkpointer['wal_file_bytes_max'] / 2**20:.1f} MiB"
                )
            if server_notes:
                print(f"    server: {'; '.join(server_notes)}")
            if run.late_ticks_ms:
                causes = ", ".join(f"{k} {v}" for k, v in sorted(run.late_tick_causes.items()))
                print(f"    late ticks (ms): {run.late_ticks_ms}; coincided with: {causes}")
            if args.histograms:
                for key, histogram in run.histograms.items():
                    cells = ", ".join(f"{b[3:]}: {n}" for b, n in histogram.items()) or "none"
                    print(f"    {key} (s, bucket upper bound: count): {cells}")
    print()
    for line in summary(runs, args.bound_ms):
        print(line)
    if args.json:
        args.json.write_text(json.dumps([run.to_json() for run in runs], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
