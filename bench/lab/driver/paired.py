"""``python -m bench.lab.driver.paired SPEC.json``: the paired cost steps of several
servers that share one core, one offered load at a time.

Every server named in the spec is already running, pinned to the same core(s). The
driver opens each one's connections (one :class:`~bench.lab.driver.run.Driver` per
server, all on one event loop), warms each up, then takes ``rounds`` rounds: in each, at
each cost rate, one step per server that has the rate, the servers forward in even
rounds and backward in odd ones (:func:`bench.lab.pairs.pair_order`: A B, B A, ...).
While one server is driven the others are idle; each step's window reads the idle
ones' CPU apart (``Step.idle_cpu_s``), what else ran on the server's cores and their steal.

The spec (JSON): ``targets`` (each ``name``, ``target``, ``url``, ``ca_file``,
``serializer``, ``deflate``, ``token_file``, ``server_pid``, ``rates``; a wss:// ``url``
is verified with ``ca_file``, PEM CA certificates, one TLS context for all its
connections as :class:`~bench.lab.driver.run.Driver` makes), ``connections``, ``room_size``,
``step_s``, ``warmup_s``, ``drain_s``, ``rounds``, ``cores`` and ``server_cores`` (core
lists), ``lab_pid``, ``t0_monotonic`` and ``json_out``, where it writes
``{name: [Step, ...]}`` after every step. Exit status 0, or 1 when a server's
connections could not be opened.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.lab.driver.clock import WakeTimer
from bench.lab.driver.config import DriverConfig, load_tokens
from bench.lab.driver.connections import SetupError
from bench.lab.driver.run import EXIT_CONNECT_FAILED, EXIT_OK, Driver
from bench.lab.driver.step import StepRecorder
from bench.lab.pairs import pair_order
from bench.lab.results import Step
from chat_server.runtime import pin_cpus, raise_open_files_limit
from chatlab.loops import loop_factory

log = logging.getLogger("bench.lab.driver")


def configs_of(spec: dict[str, Any]) -> dict[str, DriverConfig]:
    """One driver configuration per target of ``spec``, by name; each reads the other
    targets' servers as its idle neighbours."""
    pids = {t["name"]: int(t["server_pid"]) for t in spec["targets"]}
    configs = {}
    for target in spec["targets"]:
        tokens = load_tokens(Path(target["token_file"])) if target.get("token_file") else ()
        configs[target["name"]] = DriverConfig(
            target=target["target"],
            url=target["url"],
            ca_file=target.get("ca_file") or "",
            serializer=target.get("serializer", "orjson"),
            tokens=tokens,
            connections=int(spec["connections"]),
            room_size=int(spec["room_size"]),
            room_prefix="lab",
            rates=tuple(float(r) for r in target["rates"]),
            step_s=float(spec["step_s"]),
            warmup_s=float(spec["warmup_s"]),
            drain_s=float(spec["drain_s"]),
            body_chars=int(spec.get("body_chars", 0)) or _min_body(),
            json_out=None,
            cores=tuple(spec["cores"]) or None,
            event_loop="uvloop",
            connect_timeout_s=10.0,
            t0_monotonic=spec.get("t0_monotonic"),
            deflate=bool(target.get("deflate")),
            cost_rates=tuple(float(r) for r in target["rates"]),
            cost_step_s=float(spec["step_s"]),
            server_pid=pids[target["name"]],
            lab_pid=spec.get("lab_pid"),
            server_cores=tuple(spec["server_cores"]) or None,
            neighbour_pids=tuple(p for n, p in pids.items() if n != target["name"]),
        )
    return configs


def _min_body() -> int:
    from bench.lab.driver.frames import MIN_BODY_CHARS

    return MIN_BODY_CHARS


async def run_paired(spec: dict[str, Any]) -> int:
    """Open every target's connections, warm each up, take the rounds; the exit status."""
    configs = configs_of(spec)
    drivers = {name: Driver(config) for name, config in configs.items()}
    steps: dict[str, list[Step]] = {name: [] for name in drivers}
    out = Path(spec["json_out"])
    opened: list[Driver] = []
    try:
        for name, driver in drivers.items():
            driver.timer = WakeTimer()
            opened.append(driver)
            try:
                await driver.connect_all()
            except SetupError as exc:
                print(f"driver: {name}: could not open the connections: {exc}", file=sys.stderr)
                return EXIT_CONNECT_FAILED
        gc.collect()
        gc.freeze()
        rates = sorted({rate for config in configs.values() for rate in config.cost_rates})
        # a warm-up round, unrecorded: every server at each of its rates, in the first
        # round's order (a server's first seconds under load cost more per frame, and
        # by more than the pairs' own scatter: measured, round 0 read 10-30 % high)
        for driver in drivers.values():
            config = driver.config
            for rate in rates:
                if rate in config.cost_rates and config.warmup_s > 0:
                    warmup = StepRecorder(
                        "warmup", rate, max(config.warmup_s, config.cost_step_s), config.connections
                    )
                    driver.current = warmup
                    await driver.run_step(rate, warmup, drain_s=0, recorded=False)
        for k, name in pair_order(list(drivers), int(spec["rounds"])):
            driver = drivers[name]
            for rate in rates:
                if rate not in driver.config.cost_rates:
                    continue
                recorder = StepRecorder(
                    f"cost {rate:g}/s", rate, driver.config.cost_step_s, driver.config.connections
                )
                recorder.cost = True
                recorder.pair_round = k
                await driver.recorded_step(rate, recorder, steps[name])
                _write(out, steps)
    finally:
        for driver in opened:
            driver.current = None
            await driver.close_all()
            driver.timer.close()
    return EXIT_OK


def _write(path: Path, steps: dict[str, list[Step]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({k: [asdict(s) for s in v] for k, v in steps.items()}))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """Run the paired steps the spec file names; the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.lab.driver.paired SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    logging.getLogger("picows").setLevel(logging.WARNING)
    logging.getLogger("aiofastnet").setLevel(logging.ERROR)
    pin_cpus(tuple(spec["cores"]) or None)
    raise_open_files_limit(int(spec["connections"]) * len(spec["targets"]))
    with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
        return runner.run(run_paired(spec))


if __name__ == "__main__":
    sys.exit(main())
