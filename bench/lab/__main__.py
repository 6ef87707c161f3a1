"""``python -m bench.lab``: run a configuration matrix, find capacity, write the report.

Commands:
  run --matrix NAME       run every configuration of a matrix (bench/matrices/NAME.toml),
                          --repeat times interleaved; write reports/<time>-NAME/report.md,
                          report.html, plots and results.json; print the summary table
  capacity --slo p99=100  climb the offered load on one configuration and on the bare relay
                          until the SLO breaks; the edge, the ratio, and a capacity plan
  ceiling                 the fast driver's own ceiling against a trivial relay, without and
                          with permessage-deflate
  list                    the built-in matrices
  report RESULTS_JSON     render a report again from a saved results.json
  scaling                 measure the scaling function's parts (the scaling matrix, argon2
                          logins per CPU-second, memory per connection) and check it
  plan --users N ...      chat processes, Redis primaries and auth replicas for a target,
                          each n+1, on a scaling run's figures (plan --help: every input)

A load measurement owns the machine: the server runs on the first usable core, the
drivers on the others; close other heavy programs first. Exit status: 0 when the run
finished (whatever it measured), 1 when a configuration failed, 2 for a bad argument,
130 after Ctrl-C (what was measured is still written).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from bench.lab.machine import (
    OTHERS_LIMIT_PERCENT,
    QUIET_SECONDS,
    QUIET_WAIT_S,
    STEAL_LIMIT_MS_PER_S,
)
from bench.lab.matrix import Config, Load, MatrixError, available, load_matrix
from bench.lab.results import HEADLINE_SLO_MS, REPORTS_DIR, Results, Step
from chatlab.settings import http_urls

CEILINGS_PATH = REPORTS_DIR / "ceilings.json"

log = logging.getLogger("bench.lab")


def _config_name(env: dict[str, str]) -> str:
    """A name like the matrices' (``orjson+uvloop+deflate``, ``+picows``) for ``--env`` toggles."""
    parts = [env.get("SERIALIZER", "orjson"), env.get("EVENT_LOOP", "uvloop")]
    if env.get("WS_DEFLATE") in ("on", "shared"):
        parts.append("deflate" if env["WS_DEFLATE"] == "on" else "deflate-shared")
    if env.get("TRANSPORT", "websockets") != "websockets":
        parts.append(env["TRANSPORT"])
    known = {"SERIALIZER", "EVENT_LOOP", "WS_DEFLATE", "TRANSPORT"}
    parts += [f"{k}={v}" for k, v in env.items() if k not in known]
    return "+".join(parts)


def _counts(text: str) -> tuple[int, ...]:
    """``200,2000`` → ``(200, 2000)`` (argparse type)."""
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number or a comma list") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: connection counts must be at least 1")
    return counts


def _saved_ceilings() -> dict[str, Step]:
    """The drivers' ceilings from the last ``python -m bench.lab ceiling``, if any."""
    try:
        data = json.loads(CEILINGS_PATH.read_text())
    except (OSError, ValueError):
        return {}
    return {k: Step.from_dict(v) for k, v in data.items()}


def _finish(results: Results, out_dir: Path, profiles_dir: Path | None = None) -> int:
    """Write the report, print the summary and the paths; the exit status."""
    try:
        from bench.lab.report import summary_table, write_report
    except ImportError as exc:  # pragma: no cover - the report module is part of the lab
        print(f"report module missing ({exc}); results in {out_dir / 'results.json'}")
        return 1
    md, html = write_report(results, out_dir, profiles_dir=profiles_dir)
    print()
    print(summary_table(results))
    print(f"\nreport: {md}\n        {html}\nresults: {out_dir / 'results.json'}")
    if results.interrupted:
        return 130
    return 1 if any(r.status == "failed" for r in results.runs) else 0


def cmd_list(_args: argparse.Namespace) -> int:
    """Print the built-in matrices."""
    for name in available():
        matrix = load_matrix(name)
        print(f"{name}: {matrix.description}")
        print(f"    repeat {matrix.repeat}, ~{matrix.estimate_s(matrix.repeat) / 60:.0f} min")
        for config in matrix.configs:
            toggles = " ".join(f"{k}={v}" for k, v in config.env.items()) or config.target
            print(f"    - {config.name}: {toggles}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run a matrix and write its report."""
    from bench.lab.progress import Progress
    from bench.lab.runner import matrix_to_run, report_dir, run_matrix, start_when_quiet

    matrix, skipped = matrix_to_run(args.matrix)
    repeat = args.repeat or matrix.repeat
    out_dir = report_dir(args.out, matrix.name)
    start_when_quiet(args.wait_quiet_s, quiet=args.quiet)
    progress = Progress(
        matrix.estimate_s(repeat),
        f"lab {matrix.name} x{repeat}",
        enabled=not args.quiet,
    )
    try:
        results = run_matrix(
            matrix,
            repeat,
            out_dir,
            progress,
            ceilings=_saved_ceilings(),
            auth_urls=args.auth_url,
        )
    finally:
        progress.close()
    if skipped:
        results.parts["skipped"] = skipped
        results.save(out_dir / "results.json")
    return _finish(results, out_dir)


def cmd_capacity(args: argparse.Namespace) -> int:
    """Climb each configuration and the relay at each connection count; knees and ratios."""
    from bench.lab.capacity import capacity_plan, climbing, knees, parse_slo
    from bench.lab.matrix import Matrix
    from bench.lab.progress import Progress
    from bench.lab.runner import report_dir, run_matrix

    slo = parse_slo(args.slo)
    env = dict(item.split("=", 1) for item in args.env)
    name = args.name or _config_name(env)
    counts = args.connections
    out_dir = report_dir(args.out, "capacity")
    configs: list[Config] = []
    for n in counts:
        suffix = f" @{n}" if len(counts) > 1 else ""
        load = climbing(
            Load(
                connections=n,
                room_size=args.room_size,
                step_s=args.step_s,
                warmup_s=1.0,
                locust_profile="",
            ),
            slo_ms=slo,
            start_rate=args.start_rate,
            factor=args.factor,
            max_rate=args.max_rate,
            resolution=args.resolution,
        )
        configs.append(Config(name=name + suffix, env=env, locust=False, load=load))
        if not args.no_relay:
            configs.append(Config(name="relay" + suffix, target="relay", load=load))
    first_load = configs[0].load
    assert first_load is not None
    matrix = Matrix(
        name="capacity",
        description="python -m bench.lab capacity",
        configs=tuple(configs),
        baseline=configs[0].name,
        aa_pair=None,
        load=first_load,
        repeat=args.repeat,
    )
    per_climb_s = 9 * (args.step_s + 3) + 10
    progress = Progress(
        len(configs) * args.repeat * per_climb_s, "capacity", enabled=not args.quiet
    )
    try:
        results = run_matrix(
            matrix,
            args.repeat,
            out_dir,
            progress,
            ceilings=_saved_ceilings(),
            auth_urls=args.auth_url,
            users=max(counts) // args.room_size,
        )
    finally:
        progress.close()
    capacity: dict[str, Any] = {"slo_ms": slo, "knees": knees(results)}
    if args.target_load:
        first = capacity["knees"].get(configs[0].name)
        if first:
            capacity["plan"] = capacity_plan(first["median_delivered_per_s"], args.target_load)
    results.capacity = capacity
    results.save(out_dir / "results.json")
    status = _finish(results, out_dir)
    print(f"\ncapacity at {args.slo} (median of {args.repeat} climb(s), min-max):")
    for name_, knee in capacity["knees"].items():
        at_least = "≥ " if knee["lower_bound"] else ""
        why = (
            " (driver-limited: the knee is beyond)"
            if knee["driver_limited"]
            else " (held up to --max-rate: the knee is beyond)"
            if knee["lower_bound"]
            else ""
        )
        print(
            f"  {name_}: {at_least}{knee['median_delivered_per_s']:,.0f} delivered/s "
            f"({knee['min_delivered_per_s']:,.0f}-{knee['max_delivered_per_s']:,.0f}){why}"
        )
    for n in counts:
        suffix = f" @{n}" if len(counts) > 1 else ""
        chat, relay = capacity["knees"].get(name + suffix), capacity["knees"].get("relay" + suffix)
        if chat and relay and relay["median_delivered_per_s"]:
            ratio = chat["median_delivered_per_s"] / relay["median_delivered_per_s"]
            bound = "≥ " if chat["lower_bound"] and not relay["lower_bound"] else ""
            bound = "~ " if chat["lower_bound"] and relay["lower_bound"] else bound
            print(f"  {n} connections: chat server / bare relay {bound}{ratio:.2f}")
    if "plan" in capacity:
        p = capacity["plan"]
        print(
            f"  plan for {p['target_delivered_per_s']:,.0f} delivered/s: {p['instances']} instances"
        )
    return status


#: ``ceiling --deflate``: which ceilings to measure, and the key each is saved under
CEILING_VARIANTS = {"off": ("fast",), "on": ("fast+deflate",), "both": ("fast", "fast+deflate")}


def cmd_ceiling(args: argparse.Namespace) -> int:
    """The fast driver's own ceilings (plain, and with permessage-deflate); saved for reports.

    Plain: against the picows relay, the cheapest server there is. With deflate: against
    the websockets relay accepting permessage-deflate as the chat server does (picows
    has none), both ways compressed; when that relay breaks first the figure is a lower
    bound on the driver's own ceiling, and it says so.
    """
    from dataclasses import asdict, replace

    from bench.lab.capacity import climbing, edge, parse_slo
    from bench.lab.matrix import Matrix
    from bench.lab.progress import Progress
    from bench.lab.runner import report_dir, run_matrix

    slo = parse_slo(args.slo)
    out_dir = report_dir(args.out, "ceiling")
    variants = CEILING_VARIANTS[args.deflate]
    progress = Progress(
        8 * (args.step_s + 4) * len(variants), "driver ceiling", enabled=not args.quiet
    )
    relays = {
        "fast": Config(name="picows relay", target="relay", env={"TRANSPORT": "picows"}),
        "fast+deflate": Config(
            name="websockets relay, deflate",
            target="relay",
            env={"TRANSPORT": "websockets", "WS_DEFLATE": "on"},
        ),
    }
    load = climbing(
        Load(connections=args.connections, step_s=args.step_s, warmup_s=1, locust_profile=""),
        slo_ms=slo,
        start_rate=args.start_rate,
        factor=args.factor,
        max_rate=args.max_rate,
    )
    configs = tuple(replace(relays[key], load=load) for key in variants)
    matrix = Matrix("ceiling", "the fast driver's ceiling", configs, configs[0].name, None, load)
    try:
        results = run_matrix(matrix, 1, out_dir, progress)
    finally:
        progress.close()
    runs = dict(zip(variants, results.runs, strict=False))
    ceilings = _saved_ceilings()
    status = 0
    for key, run in runs.items():
        found = edge(run, slo)
        held = [s for s in run.steps if s.holds(slo)]
        best = max(held, key=lambda s: s.delivered_per_s, default=None)
        if best is None:
            print(f"{key}: no step held {args.slo} against the {relays[key].name}: {run.error}")
            status = 1
            continue
        ceilings[key] = best
        broke = [s for s in run.steps if not s.holds(slo) and not s.superseded]
        driver_bound = any(s.generator_limited for s in broke)
        bound = "" if driver_bound or not broke else "≥ "
        why = (
            "the driver was the limit"
            if driver_bound
            else f"the {relays[key].name} broke first: the driver's own ceiling is higher"
            if broke
            else "held at the top rate"
        )
        print(
            f"{'fast driver' if key == 'fast' else 'fast driver with deflate'} ceiling at "
            f"{args.connections:,} connections: {bound}{found.capacity_delivered_per_s:,} "
            f"delivered/s at p99 {best.latency_ms['p99']:.1f} ms, driver CPU "
            f"{best.generator_cpu_percent or 0:.0f} % ({why})"
        )
    REPORTS_DIR.mkdir(exist_ok=True)
    CEILINGS_PATH.write_text(json.dumps({k: asdict(v) for k, v in ceilings.items()}, indent=1))
    print(f"saved to {CEILINGS_PATH}")
    return status


def cmd_report(args: argparse.Namespace) -> int:
    """Render a report again from results.json."""
    path = Path(args.results)
    results = Results.load(path)
    return _finish(results, Path(args.out) if args.out else path.parent, path.parent)


def _auth_urls(text: str) -> tuple[str, ...]:
    try:
        return http_urls(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


AUTH_URL_HELP = (
    "running auth service replicas to use, comma-separated (users registered there, chat "
    "servers on their JWK sets, Locust round robin over them) instead of starting one [none]"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.lab",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="\n\n".join((__doc__ or "").split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="warning", help="logging level [warning]")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a matrix and write the report")
    run.add_argument(
        "--matrix", default="demo", help=f"built-in ({', '.join(available())}) or a path [demo]"
    )
    run.add_argument(
        "--repeat", type=int, default=0, help="runs per configuration [the matrix's own]"
    )
    run.add_argument("--out", default="", help="report directory [reports/<time>-<matrix>]")
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.add_argument("--auth-url", type=_auth_urls, default=(), help=AUTH_URL_HELP)
    run.add_argument(
        "--wait-quiet-s",
        type=float,
        default=QUIET_WAIT_S,
        help="wait at most this long for a quiet machine before starting (other processes "
        f"under {OTHERS_LIMIT_PERCENT:g} %% of a core and steal under "
        f"{STEAL_LIMIT_MS_PER_S:g} ms/s for {QUIET_SECONDS} s), then start anyway; 0: "
        f"do not wait [{QUIET_WAIT_S:g}]",
    )
    run.set_defaults(func=cmd_run)

    cap = sub.add_parser("capacity", help="find the offered load where the SLO breaks")
    cap.add_argument(
        "--slo",
        default=",".join(f"{k}={v:g}" for k, v in HEADLINE_SLO_MS.items()),
        help="fan-out bounds in ms [p99=100]",
    )
    cap.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server toggle (repeatable) [SERIALIZER=orjson EVENT_LOOP=uvloop WS_DEFLATE=off]",
    )
    cap.add_argument("--name", default="", help="the configuration's name in the report")
    cap.add_argument(
        "--start-rate", type=float, default=1000, help="first offered rate, sends/s [1000]"
    )
    cap.add_argument("--factor", type=float, default=1.4, help="rate multiplier per step [1.4]")
    cap.add_argument(
        "--max-rate", type=float, default=30000, help="highest offered rate, sends/s [30000]"
    )
    cap.add_argument("--step-s", type=float, default=5, help="seconds per step [5]")
    cap.add_argument(
        "--connections",
        type=_counts,
        default=(200,),
        help="connections, or a comma list to sweep (e.g. 200,2000) [200]",
    )
    cap.add_argument(
        "--resolution",
        type=float,
        default=0.05,
        help="bisect until the first broken rate is within this of the last held [0.05]",
    )
    cap.add_argument(
        "--repeat", type=int, default=1, help="climbs per configuration, interleaved [1]"
    )
    cap.add_argument("--room-size", type=int, default=10, help="connections per room [10]")
    cap.add_argument(
        "--target-load",
        type=float,
        default=0,
        help="delivered messages/s to plan instances for (0: no plan) [0]",
    )
    cap.add_argument("--no-relay", action="store_true", help="do not climb the bare relay too")
    cap.add_argument("--out", default="", help="report directory [reports/<time>-capacity]")
    cap.add_argument("--quiet", action="store_true", help="no progress output")
    cap.add_argument("--auth-url", type=_auth_urls, default=(), help=AUTH_URL_HELP)
    cap.set_defaults(func=cmd_capacity)

    ceil = sub.add_parser(
        "ceiling", help="the fast driver's own ceiling, without and with permessage-deflate"
    )
    ceil.add_argument("--slo", default="p99=100", help="fan-out bounds in ms [p99=100]")
    ceil.add_argument("--start-rate", type=float, default=2000, help="first rate, sends/s [2000]")
    ceil.add_argument("--factor", type=float, default=1.4, help="rate multiplier per step [1.4]")
    ceil.add_argument("--max-rate", type=float, default=40000, help="highest rate [40000]")
    ceil.add_argument("--step-s", type=float, default=5, help="seconds per step [5]")
    ceil.add_argument("--connections", type=int, default=200, help="connections [200]")
    ceil.add_argument(
        "--deflate",
        choices=tuple(CEILING_VARIANTS),
        default="both",
        help="without permessage-deflate (picows relay), with it (websockets relay "
        "compressing), or both [both]",
    )
    ceil.add_argument("--out", default="", help="report directory [reports/<time>-ceiling]")
    ceil.add_argument("--quiet", action="store_true", help="no progress output")
    ceil.set_defaults(func=cmd_ceiling)

    lst = sub.add_parser("list", help="the built-in matrices")
    lst.set_defaults(func=cmd_list)

    rep = sub.add_parser("report", help="render a report again from results.json")
    rep.add_argument("results", help="path to a results.json")
    rep.add_argument("--out", default="", help="report directory [the results' own]")
    rep.set_defaults(func=cmd_report)

    from bench.lab.scaling_cli import add_commands, check_args

    add_commands(sub)

    args = parser.parse_args(argv)
    check_args(args)
    if args.command == "capacity":
        if not args.env:
            args.env = ["SERIALIZER=orjson", "EVENT_LOOP=uvloop", "WS_DEFLATE=off"]
        bad = [e for e in args.env if "=" not in e]
        if bad:
            parser.error(f"--env {bad[0]!r}: expected NAME=VALUE")
        if args.factor <= 1 or args.start_rate <= 0 or args.max_rate < args.start_rate:
            parser.error("--factor must be > 1 and 0 < --start-rate <= --max-rate")
        if not 0 < args.resolution < args.factor - 1:
            parser.error("--resolution must be > 0 and below --factor - 1")
        if args.repeat < 1:
            parser.error("--repeat must be 1 or more")
        if any(n % args.room_size for n in args.connections):
            parser.error("--connections must be multiples of --room-size")
        try:
            from bench.lab.results import parse_slo

            parse_slo(args.slo)
        except ValueError as exc:
            parser.error(f"--slo: {exc}")
    if args.command == "run":
        try:
            load_matrix(args.matrix)
        except MatrixError as exc:
            parser.error(str(exc))
        if args.repeat < 0:
            parser.error("--repeat must be 1 or more (0: the matrix's own)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the chosen command; its exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
