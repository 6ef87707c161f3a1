"""``python -m bench.lab scaling`` and ``python -m bench.lab plan``: measure the scaling
function's parts, and plan a deployment on them.

``scaling`` runs the ``scaling`` matrix (:mod:`bench.lab.parts` says what each
configuration gives), then, once per repeat, argon2 logins per CPU-second at the auth
service's configured cost, refreshes per CPU-second of a running auth service and the
chat server's memory per idle connection (:mod:`bench.memory`); it saves them in
``results.json`` and writes the report, whose scaling section holds the function, its
terms' sources and the ``WORKERS=2`` check.

``plan`` reads a saved run (``--from``, else the newest ``reports/*-scaling`` run) and
prints the plan (:mod:`bench.lab.plan`), each tier with its range over the parts'
intervals, also written as ``plan.md`` beside that run's report. The repository ships
one small real run (:data:`EXAMPLE_RUN`, its README says how it was made) so that a
fresh clone can plan before it measures; a plan on it says so, and is written only
where ``--out`` says. Exit status: 0 planned, 1 a tier's figures were not measured, 2 a
bad input or no measured figures at all (it says which command makes them).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from bench.lab.matrix import MatrixError, available, load_matrix
from bench.lab.plan import DEFAULT_PROCESS_MEMORY_GIB, DEFAULT_SHARE, Target, plan, plan_markdown
from bench.lab.results import REPORTS_DIR, Results, parse_slo
from chatlab.harness import ROOT

log = logging.getLogger("bench.lab")

SCALING_MATRIX = "scaling"
#: the command that measures the parts, as the plan names it when it has none
MEASURE_COMMAND = "python -m bench.lab scaling"
#: seconds of argon2 verifications per repeat
LOGINS_DURATION_S = 3.0
#: seconds of refreshes per repeat, and the clients spending their tokens meanwhile
REFRESH_DURATION_S = 3.0
REFRESH_CLIENTS = 4
#: idle connections per memory measurement: the lab's shape
MEMORY_CONNECTIONS = 2000
#: a small real scaling run shipped with the repository, for a plan before any
#: measurement of one's own (``bench/lab/examples/scaling/README.md``: how it was made)
EXAMPLE_RUN = ROOT / "bench" / "lab" / "examples" / "scaling" / "results.json"


def logins_per_cpu_s(
    duration_s: float, environ: Mapping[str, str] | None = None
) -> tuple[float, str]:
    """argon2 verifications per CPU-second of this process (every thread: argon2's lanes
    may run in several) at the auth service's configured cost (its ``.env`` and
    ``environ``, the environment by default); and that cost as text."""
    from auth_service.passwords import Argon2Params
    from auth_service.settings import Settings

    params = Argon2Params.from_settings(Settings.load(environ))
    hasher = params.hasher()
    password = "correct horse battery"
    hashed = hasher.hash(password)
    count = 0
    cpu_start, wall_end = time.process_time(), time.monotonic() + duration_s
    while time.monotonic() < wall_end or count == 0:
        hasher.verify(hashed, password)
        count += 1
    cpu = time.process_time() - cpu_start
    cost = f"argon2id t={params.time_cost} m={params.memory_cost_kib} KiB p={params.parallelism}"
    return count / cpu, cost


def refreshes_per_cpu_s(duration_s: float, clients: int = REFRESH_CLIENTS) -> float:
    """``POST /refresh`` answered per CPU-second of a running auth service (its process
    tree, every thread): ``clients`` threads, each with its own session, spend their refresh
    token and the next one for ``duration_s`` seconds, each call on a new connection (as
    urllib makes them). The whole request is in the figure (HTTP, the database's spend
    and insert, the token's signature); no argon2 (the sessions are made first, with cheap
    hashes, outside the window)."""
    import threading

    import psutil

    from bench.lab.machine import tree_cpu_s
    from bench.lab.target import LAB_AUTH
    from chatlab.harness import FAST_ARGON2, AuthProcess

    settings = {**LAB_AUTH, **FAST_ARGON2, "REFRESH_RATE_PER_CLIENT_PER_MIN": "0"}
    with tempfile.TemporaryDirectory(prefix="chatlab-scaling-refresh-") as tmp:
        auth = AuthProcess(Path(tmp), **settings).start(timeout_s=60)
        try:
            assert auth.register("refresher", "correct horse battery").status == 201
            tokens = []
            for _ in range(clients):
                reply = auth.login("refresher", "correct horse battery")
                tokens.append(str(reply.json()["refresh_token"]))
            assert auth.proc is not None
            root = psutil.Process(auth.proc.pid)
            done = [0] * clients
            stop = threading.Event()

            def spend(k: int) -> None:
                token = tokens[k]
                while not stop.is_set():
                    reply = auth.post("/refresh", {"refresh_token": token})
                    if reply.status != 200:
                        raise RuntimeError(f"refresh answered {reply!r}")
                    token = str(reply.json()["refresh_token"])
                    done[k] += 1

            threads = [threading.Thread(target=spend, args=(k,)) for k in range(clients)]
            cpu_start = tree_cpu_s(root)
            count_start = sum(done)
            for thread in threads:
                thread.start()
            time.sleep(duration_s)
            count, cpu = sum(done) - count_start, tree_cpu_s(root) - cpu_start
            stop.set()
            for thread in threads:
                thread.join(30)
        finally:
            auth.stop()
    if count == 0 or cpu <= 0:
        raise RuntimeError("no refresh answered while measuring")
    return count / cpu


def bytes_per_connection(connections: int) -> float:
    """A chat server's RSS per idle connection over ``connections`` (bench.memory, deflate off)."""
    from bench.memory import measure

    with tempfile.TemporaryDirectory(prefix="chatlab-scaling-mem-") as tmp:
        found = asyncio.run(measure("off", "idle", connections, "orjson", Path(tmp)))
    return float(found["bytes_per_connection"])


def cmd_scaling(args: argparse.Namespace) -> int:
    """Run the scaling matrix and the side measurements; write the report."""
    from bench.lab.progress import Progress
    from bench.lab.runner import matrix_to_run, report_dir, run_matrix, start_when_quiet

    matrix, skipped = matrix_to_run(args.matrix)
    repeat = args.repeat or matrix.repeat
    out_dir = report_dir(args.out, matrix.name)
    start_when_quiet(args.wait_quiet_s, quiet=args.quiet)
    side_s = repeat * (LOGINS_DURATION_S + REFRESH_DURATION_S + 20)
    progress = Progress(
        matrix.estimate_s(repeat) + side_s, f"lab {matrix.name} x{repeat}", enabled=not args.quiet
    )
    try:
        results = run_matrix(matrix, repeat, out_dir, progress, auth_urls=args.auth_url)
        results.parts["skipped"] = skipped
        if not results.interrupted:
            for k in range(repeat):
                progress.phase(f"argon2 logins per CPU-second #{k + 1}")
                rate, cost = logins_per_cpu_s(LOGINS_DURATION_S)
                results.parts.setdefault("logins_per_cpu_s", []).append(round(rate, 3))
                results.parts["argon2"] = cost
                progress.phase(f"refreshes per CPU-second #{k + 1}")
                refreshes = refreshes_per_cpu_s(REFRESH_DURATION_S)
                results.parts.setdefault("refreshes_per_cpu_s", []).append(round(refreshes, 1))
                results.parts["refresh_clients"] = REFRESH_CLIENTS
                progress.phase(f"memory per idle connection #{k + 1}")
                per = bytes_per_connection(MEMORY_CONNECTIONS)
                results.parts.setdefault("bytes_per_connection", []).append(round(per))
                results.parts["memory_connections"] = MEMORY_CONNECTIONS
    except KeyboardInterrupt:
        results.interrupted = True
    finally:
        progress.close()
    results.save(out_dir / "results.json")
    from bench.lab.report import summary_table, write_report

    md, html = write_report(results, out_dir)
    print()
    print(summary_table(results))
    print()
    print(scaling_summary(results))
    print(f"\nreport: {md}\n        {html}\nresults: {out_dir / 'results.json'}")
    print(f"plan on it: python -m bench.lab plan --from {out_dir / 'results.json'} --help")
    if results.interrupted:
        return 130
    return 1 if any(r.status == "failed" for r in results.runs) else 0


def scaling_summary(results: Results) -> str:
    """The parts and the check, for the terminal."""
    from bench.lab.parts import check_of, parts_of

    parts = parts_of(results)
    lines = ["the scaling function's parts:"]
    names = ("u1", "beta", "knee", "redis_commit_us", "redis_delivery_us")
    for name in (*names, "logins_per_cpu_s", "refreshes_per_cpu_s", "bytes_per_connection"):
        figure = getattr(parts, name)
        lines.append(f"  {name}: {figure.text() if figure else 'not measured'}")
    for name, figure in parts.notes.items():
        lines.append(f"  ({name}: {figure.text()})")
    check = check_of(results)
    lines.append(
        f"check: {check.sentence()}" if check else "check: not made (needs WORKERS=1, 2 and 4)"
    )
    return "\n".join(lines)


def newest_scaling_results(reports_dir: Path = REPORTS_DIR) -> Path | None:
    """The newest ``results.json`` of a scaling run under ``reports_dir`` (None: none)."""
    found = sorted(
        reports_dir.glob(f"*-{SCALING_MATRIX}/results.json"), key=lambda p: p.stat().st_mtime
    )
    return found[-1] if found else None


def _spread(text: str) -> float | None:
    if text == "random":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: 'random' or a number of processes") from None


def _slo(text: str) -> str:
    try:
        parse_slo(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan the target on the saved figures; print it and write plan.md beside them."""
    from bench.lab.parts import parts_of

    target = target_of(args)
    source = Path(args.from_) if args.from_ else newest_scaling_results(Path(args.reports_dir))
    if source is not None and source.is_dir():
        source = source / "results.json"
    if source is None or not source.exists():
        where = f"{source} does not exist" if source else f"no scaling run under {args.reports_dir}"
        print(
            f"plan: no measured figures ({where}). Measure them first, on a quiet machine:\n"
            f"  {MEASURE_COMMAND}\n"
            "or give a saved run: --from reports/<time>-scaling/results.json\n"
            "(the repository's example run, measured on another machine: "
            f"--from {EXAMPLE_RUN.relative_to(ROOT)})",
            file=sys.stderr,
        )
        return 2
    results = Results.load(source)
    found = plan(parts_of(results, target.slo), target)
    text = plan_markdown(found) + f"\nFigures from: {_figures_from(source, results)}\n"
    print(text)
    shipped = source.resolve() == EXAMPLE_RUN.resolve()
    if args.out or not shipped:
        out = Path(args.out) if args.out else source.parent / "plan.md"
        out.write_text(text, encoding="utf-8")
        print(f"written to {out}")
    if found.not_planned:
        print(f"to measure what is missing: {MEASURE_COMMAND}", file=sys.stderr)
        return 1
    return 0


def _figures_from(source: Path, results: Results) -> str:
    """Where the plan's figures come from; the shipped example run says it is one."""
    if source.resolve() != EXAMPLE_RUN.resolve():
        return str(source)
    facts = results.machine
    return (
        f"{source.relative_to(ROOT) if source.is_absolute() else source}, the shipped "
        f"example run ({results.started[:10]}, commit {facts.get('commit') or '?'}, "
        f"{facts.get('cores', '?')} cores of {facts.get('cpu_model') or 'an unnamed CPU'}): "
        f"another machine's figures; {MEASURE_COMMAND} measures this one's"
    )


def target_of(args: argparse.Namespace) -> Target:
    """The plan's target from the command line."""
    return Target(
        users=args.users,
        sends_per_user_per_min=args.sends_per_min,
        room_size=args.room_size,
        logins_per_s=args.logins_per_s,
        refreshes_per_s=args.refreshes_per_s,
        slo=args.slo,
        connections_per_user=args.connections_per_user,
        spread=args.room_spread,
        share=args.cpu_share,
        process_memory_gib=args.process_memory_gib,
        auth_cores_per_replica=args.auth_cores,
    )


PLAN_EPILOG = f"""\
How the numbers are found (bench/lab/scaling.py, bench/lab/plan.py):
  chat processes  the fewest N whose knee-based delivered/s, N x knee x u1 / u(s), holds
                  the target's (u(s): CPU per delivered frame in rooms spread over s
                  processes), and whose memory holds the connections; then N + 1
  Redis primaries sends/s x (CPU per commit + s x CPU per delivery) over --cpu-share of
                  a core each; each primary with one replica
  auth replicas   the larger of: logins/s over (--auth-cores x --cpu-share x argon2
                  logins per CPU-second), the hashing cores; and (logins + refreshes)/s
                  over (--cpu-share x refreshes per CPU-second), the event loop's one
                  core (a login's work besides its hash taken to cost a refresh's);
                  each printed; then + 1
Each tier is printed with its range: planned again at every combination of the ends of
its parts' intervals (each part's range over the run's repeats), naming the part whose
interval alone moves it most.
Every figure comes from a lab run ({MEASURE_COMMAND}); the plan names each one's run,
configuration and step. Example (the README's, on the run shipped with the repository):
  python -m bench.lab plan --users 1000000 --sends-per-min 2 --room-size 10 --logins-per-s 100 \
    --from {EXAMPLE_RUN.relative_to(ROOT)}
"""


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The ``scaling`` and ``plan`` subcommands."""
    from bench.lab.machine import QUIET_WAIT_S
    from bench.lab.results import HEADLINE_SLO_MS

    scaling = sub.add_parser(
        "scaling",
        help="measure the scaling function's parts (the scaling matrix, argon2, memory)",
        description="Run the scaling matrix (one process on memory and on one Redis, rooms "
        "spread over 2 and 4 processes, a Redis Cluster when this checkout has one), then "
        "argon2 logins and refreshes per CPU-second and memory per idle connection once "
        "per repeat; the "
        "report gives the scaling function, each term's source and the WORKERS=2 check. "
        "A load measurement: it owns the machine.",
    )
    scaling.add_argument(
        "--matrix", default=SCALING_MATRIX, help=f"built-in or a path [{SCALING_MATRIX}]"
    )
    scaling.add_argument(
        "--repeat", type=int, default=0, help="runs per configuration [the matrix's own]"
    )
    scaling.add_argument("--out", default="", help="report directory [reports/<time>-scaling]")
    scaling.add_argument("--quiet", action="store_true", help="no progress output")
    scaling.add_argument(
        "--wait-quiet-s",
        type=float,
        default=QUIET_WAIT_S,
        help=f"wait at most this long for a quiet machine first (0: do not) [{QUIET_WAIT_S:g}]",
    )
    scaling.set_defaults(func=cmd_scaling, auth_url=(), subparser=scaling)

    p = sub.add_parser(
        "plan",
        help="chat processes, Redis primaries and auth replicas for a target, each n+1",
        description="A capacity plan on figures the lab measured: how many chat processes, "
        "Redis primaries (each with a replica) and auth replicas a target needs, each "
        "with n+1, which measured figure each number comes from, and the assumptions.",
        epilog=PLAN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    need = p.add_argument_group("the target")
    need.add_argument("--users", type=int, required=True, help="connected users at the peak")
    need.add_argument(
        "--sends-per-min",
        type=float,
        required=True,
        help="messages each connected user sends per minute",
    )
    need.add_argument(
        "--room-size",
        type=int,
        required=True,
        help="members per room; each message reaches every member, the sender too",
    )
    need.add_argument(
        "--logins-per-s", type=float, required=True, help="logins per second at the peak"
    )
    need.add_argument(
        "--refreshes-per-s",
        type=float,
        default=0.0,
        help="refreshes per second at the peak (POST /refresh: no argon2, on each auth "
        "replica's event loop; a client refreshing every TOKEN_TTL_S x 0.8 seconds makes "
        "1 / (0.8 x TOKEN_TTL_S) a second) [0]",
    )
    need.add_argument(
        "--slo",
        type=_slo,
        default=",".join(f"{k}={v:g}" for k, v in HEADLINE_SLO_MS.items()),
        help="fan-out latency bounds the chat processes must hold, in ms (the knee is "
        "taken under it from the saved climb) [p99=100]",
    )
    how = p.add_argument_group("the deployment")
    how.add_argument(
        "--connections-per-user",
        type=float,
        default=1.0,
        help="connections each user holds (tabs, devices) [1]",
    )
    how.add_argument(
        "--room-spread",
        type=_spread,
        default=None,
        metavar="random|N",
        help="processes a room's members are on: 'random' (each connection lands on any "
        "process, as the supervisor's steering and a round-robin balancer do) or a number "
        "(1: every room on one process) [random]",
    )
    how.add_argument(
        "--cpu-share",
        type=float,
        default=DEFAULT_SHARE,
        help="share of one core a Redis primary and each auth core are planned to "
        f"(their figures are CPU per operation, not a knee) [{DEFAULT_SHARE:g}]",
    )
    how.add_argument(
        "--process-memory-gib",
        type=float,
        default=DEFAULT_PROCESS_MEMORY_GIB,
        help="memory a chat process may give its connections, GiB "
        f"[{DEFAULT_PROCESS_MEMORY_GIB:g}]",
    )
    how.add_argument(
        "--auth-cores", type=float, default=1.0, help="cores hashing in each auth replica [1]"
    )
    src = p.add_argument_group("the figures")
    src.add_argument(
        "--from",
        dest="from_",
        default="",
        metavar="RESULTS_JSON",
        help="a saved scaling run's results.json (or its directory) [the newest "
        "reports/*-scaling run]",
    )
    src.add_argument(
        "--reports-dir", default=str(REPORTS_DIR), help="where to look for runs [reports/]"
    )
    src.add_argument("--out", default="", help="write the plan here [plan.md beside the figures]")
    p.set_defaults(func=cmd_plan, subparser=p)


def check_args(args: argparse.Namespace) -> None:
    """Refuse a bad target or matrix with one line and exit 2 (argparse's way, with the
    subcommand's usage)."""
    parser: argparse.ArgumentParser | None = getattr(args, "subparser", None)
    if parser is None:
        return
    if args.command == "plan":
        from bench.lab.plan import target_errors

        errors = target_errors(target_of(args))
        if errors:
            parser.error("; ".join(errors))
    if args.command == "scaling":
        try:
            load_matrix(args.matrix)
        except MatrixError as exc:
            parser.error(f"{exc} (built in: {', '.join(available())})")
        if args.repeat < 0:
            parser.error("--repeat must be 1 or more (0: the matrix's own)")
