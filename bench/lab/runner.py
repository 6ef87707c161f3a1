"""Run a matrix: each configuration's server, its drivers, the samples, into one Results.

:func:`run_matrix` is the one repeat loop of the lab (``run``, ``capacity`` and ``ceiling``
all go through it) and :func:`new_results` its one Results builder. For each
configuration, repeated ``repeat`` times, interleaved (every configuration once, then
every configuration again), :meth:`Lab.run_config` starts its :class:`~bench.lab.target.
Target` (the chat server with its toggles, or the bare relay, pinned to the server's
core(s)), lets it settle, runs the fast driver's steps or climb
(:mod:`bench.lab.capacity`) and the Locust profile on the generator's core(s) while a
sampler records CPU% and RSS of server and generator every half second, scrapes the
server's own metrics, stops it cleanly, goes on. One auth service serves the whole lab
run (its users are registered once, with the auth service's real argon2 parameters).
Ctrl-C stops what runs and keeps what was measured. With ``--auth-url`` it starts no
auth service and uses the replicas named instead (users, the chat servers'
``JWT_JWKS_URL``, Locust).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.lab.capacity import fast_driver
from bench.lab.facts import machine_facts, split_cores, usable_cores
from bench.lab.locust_step import locust_step
from bench.lab.machine import busy_reasons, is_busy, others_load_over, wait_for_quiet
from bench.lab.matrix import Config, Load, Matrix, load_matrix, offers_deflate, runnable
from bench.lab.results import REPORTS_DIR, Results, Run, Step, edge, parse_slo
from bench.lab.sampler import Sampler
from bench.lab.scrape import scrape_metrics
from bench.lab.side import measure_side, side_skipped
from bench.lab.tailwatch import TailWatch
from bench.lab.target import LAB_AUTH, Target, pin
from chatlab.harness import ROOT, AuthProcess, KeyPair
from chatlab.throwaway_ca import ThrowawayCA, make_ca

log = logging.getLogger("bench.lab")

#: users registered for a lab run (drivers with more connections reuse them: one user
#: may hold several connections)
LAB_USER_PREFIX = "lab"
#: a process that exits in this long after SIGTERM is stopped cleanly
STOP_TIMEOUT_S = 20
#: a paired cost step's drain at most: its figure is CPU per frame over the send phase,
#: and a fixed load every server there holds delivers within milliseconds
PAIRED_DRAIN_S = 0.2


def run_matrix(
    matrix: Matrix,
    repeat: int,
    out_dir: Path,
    progress: Any = None,
    ceilings: dict[str, Step] | None = None,
    *,
    auth_urls: tuple[str, ...] = (),
    users: int = 0,
) -> Results:
    """Run every configuration ``repeat`` times (plus its ``extra_repeats``), interleaved:
    every configuration once, then every configuration again; the Results (also after
    Ctrl-C). ``users``: users to register at least (besides :func:`users_needed`).

    ``results.json`` is rewritten after every run, so an interrupted lab keeps its data.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    server_cores, generator_cores = split_cores(usable_cores())
    results = new_results(matrix, repeat, server_cores, generator_cores, ceilings)
    results_path = out_dir / "results.json"
    lab = Lab(out_dir, repeat, server_cores, generator_cores, progress=progress, results=results)
    lab.auth_urls = auth_urls
    if any(c.tls != "off" for c in matrix.configs):
        lab.ca = make_ca(out_dir / "tls", "chatlab lab CA")
    try:
        if any(c.target == "chat" for c in matrix.configs):
            if progress is not None:
                progress.phase("auth service: registering users")
            lab.start_auth(max(users, users_needed(matrix)))
        if matrix.paired():
            started = time.monotonic()
            results.paired = lab.run_paired(matrix)
            results.save(results_path)
            if progress is not None:
                for run in results.paired:
                    progress.done_run(run, time.monotonic() - started)
            if lab.interrupted:
                raise KeyboardInterrupt
        rounds = repeat + max(c.extra_repeats for c in matrix.configs)
        for k in range(rounds):
            for config in matrix.configs:
                if k >= repeat + config.extra_repeats:
                    continue
                started = time.monotonic()
                run = lab.run_config(config, matrix.load_of(config), k)
                results.runs.append(run)
                results.duration_s = round(time.monotonic() - lab.t0, 1)
                results.save(results_path)
                if progress is not None:
                    progress.done_run(run, time.monotonic() - started)
                if lab.interrupted:
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        results.interrupted = True
        log.warning("interrupted: stopping everything and writing what was measured")
    finally:
        lab.close()
        results.duration_s = round(time.monotonic() - lab.t0, 1)
        results.save(results_path)
    return results


def matrix_to_run(name_or_path: str) -> tuple[Matrix, dict[str, str]]:
    """The matrix, less the configurations this machine cannot run (each said on stderr,
    and returned with why)."""
    matrix, skipped = runnable(load_matrix(name_or_path))
    for name, reason in skipped.items():
        print(f"lab: skipping {name!r}: {reason}", file=sys.stderr)
    return matrix, skipped


def report_dir(given: str, label: str) -> Path:
    """``given``, or ``reports/<time>-<label>``."""
    if given:
        return Path(given)
    return REPORTS_DIR / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{label}"


def start_when_quiet(max_wait_s: float, *, quiet: bool = False) -> None:
    """Wait at most ``max_wait_s`` for a quiet machine (:func:`bench.lab.machine.
    wait_for_quiet`; 0: do not wait), saying so on stderr unless ``quiet``; start anyway,
    with a warning, on a busy one."""
    if max_wait_s <= 0:
        return
    say = (
        (lambda text: None)
        if quiet
        else (lambda text: print(f"lab: {text}", file=sys.stderr, flush=True))
    )
    before = wait_for_quiet(max_wait_s, say)
    if before.busy:
        log.warning("starting on a busy machine: %s", before.sentence())


def new_results(
    matrix: Matrix,
    repeat: int,
    server_cores: list[int],
    generator_cores: list[int],
    ceilings: dict[str, Step] | None = None,
) -> Results:
    """The empty Results of a run of ``matrix``: the command, the machine (and whether it
    was busy at the start), every configuration with its load."""
    facts = machine_facts()
    facts["server_cores"] = server_cores
    facts["generator_cores"] = generator_cores
    at_start = others_load_over(1.0)
    if at_start is not None:
        facts["busy_elsewhere_percent_at_start"] = round(at_start.others_percent, 1)
        if is_busy(at_start):
            log.warning(
                "%s: measurements will be noisy (a load measurement should own the machine)",
                "; ".join(busy_reasons(at_start)),
            )
    return Results(
        matrix=matrix.name,
        started=datetime.now().isoformat(timespec="seconds"),
        command=" ".join(shlex.quote(a) for a in ["python", "-m", "bench.lab", *sys.argv[1:]]),
        baseline=matrix.baseline,
        aa_pair=list(matrix.aa_pair or ()),
        repeat=repeat,
        machine=facts,
        configs={
            c.name: {
                "target": c.target,
                "env": c.env,
                "description": _describe(c),
                "profile": c.profile,
                "auth_mode": c.auth_mode,
                "same_as": c.same_as,
                "extra_repeats": c.extra_repeats,
                "load": matrix.load_of(c).__dict__,
            }
            for c in matrix.configs
        },
        ceilings=dict(ceilings or {}),
    )


def users_needed(matrix: Matrix) -> int:
    """Users to register: Locust's largest user count, and some for the fast driver."""
    most = 20
    for config in matrix.configs:
        load = matrix.load_of(config)
        if config.locust and load.locust_profile:
            most = max(most, *(s.users for s in _locust_stages(load)))
    return most


@dataclass
class Lab:
    """One lab run: its output directory, cores, auth service and the results so far."""

    out_dir: Path
    repeat: int
    server_cores: list[int]
    generator_cores: list[int]
    progress: Any = None  # a Progress, or None
    results: Results | None = None
    #: running auth replicas to use instead of starting one (their base URLs)
    auth_urls: tuple[str, ...] = ()
    auth: AuthProcess | None = None
    keys: KeyPair | None = None
    token_file: Path | None = None
    #: the throwaway certificate of configurations with TLS (in the server or the proxy)
    ca: ThrowawayCA | None = None
    t0: float = field(default_factory=time.monotonic)
    interrupted: bool = False
    _children: list[subprocess.Popen[Any]] = field(default_factory=list)
    _targets: list[Target] = field(default_factory=list)

    # ---- one configuration, once ---------------------------------------------------------

    def _target(self, config: Config, workdir: Path) -> Target:
        """``config``'s target in ``workdir``, with the lab's cores, keys, auth service and
        certificate, held so that a Ctrl-C stops it."""
        target = Target(
            config,
            workdir,
            self.server_cores,
            keys=self.keys,
            auth=self.auth,
            auth_urls=self.auth_urls,
            ca=self.ca,
        )
        self._targets.append(target)
        return target

    def run_config(self, config: Config, load: Load, repeat: int) -> Run:
        """Start, drive, sample and stop one configuration once; its Run (status says
        how). A climbing ``load`` fills the run's knee."""
        workdir, run, sampler = self.begin_run(config, repeat, f"r{repeat + 1}")
        target = self._target(config, workdir)
        watch: TailWatch | None = None
        try:
            self.phase(config, repeat, "starting")
            target.startup()
            sampler.watch("server", target.pid)
            if target.proxy_pid is not None:
                sampler.watch("proxy", target.proxy_pid)
            if target.redis is not None:
                sampler.watch("redis", target.redis.pids())
            if config.env.get("CPU_AFFINITY") == "off":
                run.server_cores = []
            time.sleep(load.settle_s)
            if target.metrics_port and config.target == "chat":
                watch = TailWatch(
                    scrape_metrics,
                    target.metrics_port,
                    target.stats_url,
                    sampler.t0,
                    self.generator_cores,
                    stats_context=target.stats_context,
                ).start()
            if config.fast:
                self.phase(config, repeat, _fast_phase(load))
                run.steps.extend(self.fast_step(config, load, target, workdir, sampler))
                if load.climb:
                    run.knee = edge(run, parse_slo(load.climb), load.room_size)
            if config.locust and config.target == "chat" and load.locust_profile:
                self.phase(config, repeat, "locust")
                run.steps.append(self.locust_run(config, load, target, workdir, sampler))
            if target.metrics_port:
                if int(config.env.get("WORKERS", "1")) > 1:
                    time.sleep(1.2)  # workers publish their counters every second
                with suppress(OSError):
                    run.metrics = scrape_metrics(target.metrics_port)
        except KeyboardInterrupt:
            run.status = "interrupted"
            run.error = "Ctrl-C: stopped here; what was measured before is kept"
            self.interrupted = True
        except Exception as exc:  # one failed configuration must not lose the others
            log.error("%s (repeat %d) failed: %s", config.name, repeat + 1, exc)
            run.status = "failed"
            run.error = str(exc)[-4000:]
        finally:
            for proc in list(self._children):
                self._stop_popen(proc)
            if watch is not None:
                run.metric_series, run.tail_events = watch.stop()
            target.shutdown(run)
            with suppress(ValueError):
                self._targets.remove(target)
            run.samples = sampler.stop()
            run.host = sampler.host
            prof_root = workdir / "profiles"
            run.profiles = [
                str(p.relative_to(self.out_dir)) for p in sorted(prof_root.rglob("*.prof"))
            ]
        if run.status == "ok" and (load.wire_messages or load.memory_connections):
            self.side(config, load, run, workdir)
        return run

    def run_paired(self, matrix: Matrix) -> list[Run]:
        """The paired cost phase (:mod:`bench.lab.pairs`): every configuration of
        :meth:`Matrix.paired` started at once on the server's core(s), then one driver
        takes their cost steps one at a time, A B B A, for the matrix's ``pairs``
        rounds; one Run per configuration (``repeat`` 0), its steps in round order."""
        configs = matrix.paired()
        workdir = self.out_dir / "runs" / "paired"
        workdir.mkdir(parents=True, exist_ok=True)
        load = matrix.load
        runs = {
            c.name: Run(
                config=c.name,
                repeat=0,
                target=c.target,
                env=dict(c.env),
                server_cores=self.server_cores,
                generator_cores=self.generator_cores,
                started_s=round(time.monotonic() - self.t0, 2),
                tls=c.tls,
            )
            for c in configs
        }
        targets: dict[str, Target] = {}
        out = workdir / "paired.json"
        try:
            for config in configs:
                if self.progress is not None:
                    self.progress.phase(f"paired cost steps: starting {config.name}")
                config_dir = workdir / config.slug()
                config_dir.mkdir(exist_ok=True)
                target = self._target(config, config_dir)
                targets[config.name] = target
                target.startup()
            time.sleep(load.settle_s)
            spec = {
                "targets": [
                    {
                        "name": c.name,
                        "target": c.target,
                        "url": targets[c.name].url,
                        "ca_file": targets[c.name].ca_file,
                        "serializer": c.env.get("SERIALIZER", "orjson"),
                        "deflate": offers_deflate(c.env),
                        "token_file": str(self.token_file) if c.target == "chat" else None,
                        "server_pid": targets[c.name].pid,
                        "rates": list((c.load or load).cost_rates),
                    }
                    for c in configs
                ],
                "connections": load.connections,
                "room_size": load.room_size,
                "body_chars": load.body_chars,
                "step_s": load.cost_step_s,
                "warmup_s": load.warmup_s,
                "drain_s": min(load.drain_s, PAIRED_DRAIN_S),
                "rounds": load.pairs,
                "cores": self.generator_cores,
                "server_cores": self.server_cores,
                "lab_pid": os.getpid(),
                "t0_monotonic": self.t0,
                "json_out": str(out),
            }
            spec_path = workdir / "spec.json"
            spec_path.write_text(json.dumps(spec, indent=1))
            if self.progress is not None:
                self.progress.phase(
                    f"paired cost steps: {len(configs)} servers, {load.pairs} rounds"
                )
            proc = self._spawn(
                [sys.executable, "-m", "bench.lab.driver.paired", str(spec_path)],
                workdir,
                "paired-driver.log",
            )
            status = self._wait(proc, matrix.paired_estimate_s() * 2 + 120)
            if status != 0 or not out.exists():
                tail = (workdir / "paired-driver.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"paired driver exited {status}:\n{tail}")
            for name, steps in json.loads(out.read_text()).items():
                runs[name].steps = [Step.from_dict(s) for s in steps]
        except KeyboardInterrupt:
            self.interrupted = True
            for run in runs.values():
                run.status, run.error = "interrupted", "Ctrl-C: stopped in the paired phase"
        except Exception as exc:  # the climbs still run; the costs are lost
            log.error("the paired cost phase failed: %s", exc)
            for run in runs.values():
                run.status, run.error = "failed", str(exc)[-4000:]
        finally:
            for proc in list(self._children):
                self._stop_popen(proc)
            for name, target in targets.items():
                target.shutdown(runs[name])
                with suppress(ValueError):
                    self._targets.remove(target)
        return list(runs.values())

    def begin_run(self, config: Config, repeat: int, label: str) -> tuple[Path, Run, Sampler]:
        """A run's directory (``runs/<config>-<label>``), its empty Run, a started Sampler."""
        workdir = self.out_dir / "runs" / f"{config.slug()}-{label}"
        workdir.mkdir(parents=True, exist_ok=True)
        run = Run(
            config=config.name,
            repeat=repeat,
            target=config.target,
            env=dict(config.env),
            server_cores=self.server_cores,
            generator_cores=self.generator_cores,
            started_s=round(time.monotonic() - self.t0, 2),
            tls=config.tls,
        )
        return workdir, run, Sampler(time.monotonic(), cores=self.generator_cores).start()

    def fast_step(
        self, config: Config, load: Load, target: Target, workdir: Path, sampler: Sampler
    ) -> list[Step]:
        """Run the fast driver's steps (or climb) against ``target``; its Steps."""
        out = workdir / "fast.json"
        chat = config.target == "chat"
        if chat:
            assert self.token_file is not None
        driver = fast_driver(
            load,
            target=config.target,
            url=target.url,
            env=config.env,
            cpu_affinity=",".join(map(str, self.generator_cores)) or "off",
            token_file=self.token_file if chat else None,
            json_out=out,
            t0_monotonic=sampler.t0,
            server_pid=target.pid,
            ca_file=target.ca_file,
            proxy_pid=target.proxy_pid,
            server_cores=",".join(map(str, self.server_cores))
            if config.env.get("CPU_AFFINITY", "server") == "server" and self.server_cores
            else "off",
        )
        proc = self._spawn(driver.command(), workdir, "fast-driver.log")
        sampler.watch("generator", proc.pid)
        status = self._wait(proc, load.fast_duration_s() + 120)
        sampler.watch("generator", None)
        if status != 0 or not out.exists():
            tail = (workdir / "fast-driver.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"fast driver exited {status}:\n{tail}")
        return [Step.from_dict(s) for s in json.loads(out.read_text())]

    def locust_run(
        self, config: Config, load: Load, target: Target, workdir: Path, sampler: Sampler
    ) -> Step:
        """Run the Locust profile against ``target``; its Step."""
        assert self.token_file is not None
        locust_dir = workdir / "locust"
        locust_dir.mkdir(exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(ROOT / "loadtest" / "chat.py"),
            "--headless",
            "--only-summary",
            "--loglevel",
            "WARNING",
            "-H",
            target.url,
            "--load-profile",
            load.locust_profile,
            "--room-size",
            str(load.room_size),
            "--serializer",
            config.env.get("SERIALIZER", "orjson"),
            "--user-prefix",
            LAB_USER_PREFIX,
            "--csv",
            str(locust_dir / "locust"),
            "--csv-full-history",
            "--delivery-report",
            str(locust_dir / "delivery.json"),
        ]
        if load.locust_stages:
            command += ["--stages", load.locust_stages]
        if target.ca_file:
            command += ["--ca-file", target.ca_file]
        if config.auth_mode == "login":
            auth_url = self.auth_url()
            if target.inline_auth_port is not None:
                auth_url = f"http://127.0.0.1:{target.inline_auth_port}"
            command += ["--auth-mode", "login", "--auth-url", auth_url]
        else:
            command += ["--auth-mode", "prelogin", "--token-file", str(self.token_file)]
        started_s = round(time.monotonic() - sampler.t0, 3)
        proc = self._spawn(command, locust_dir, "locust.log")
        # Locust does not pin itself: pin it (and its greenlets' one thread) right away
        pin(proc, self.generator_cores)
        sampler.watch("generator", proc.pid)
        self._wait(proc, load.locust_duration_s() + 120)
        sampler.watch("generator", None)
        if not (locust_dir / "delivery.json").exists():
            tail = (locust_dir / "locust.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"Locust wrote no delivery report:\n{tail}")
        active_s = sum(s.duration_s for s in _locust_stages(load) if not s.quiet)
        step = locust_step(locust_dir, active_s, load.room_size)
        step.started_s = started_s
        return step

    def side(self, config: Config, load: Load, run: Run, workdir: Path) -> None:
        """The side measurements (bench.lab.side) after ``run``'s server stopped, into it;
        one that fails is reported in the run, not fatal to it."""
        run.side_skipped = side_skipped(config)
        if run.side_skipped:
            return
        try:
            run.wire, run.memory = measure_side(
                config, load, workdir, lambda what: self.phase(config, run.repeat, what)
            )
        except KeyboardInterrupt:
            self.interrupted = True
        except Exception as exc:  # the drivers' figures stand without it
            log.error("%s: side measurement failed: %s", config.name, exc)
            run.side_skipped = f"failed: {exc}"[:2000]

    def phase(self, config: Config, repeat: int, phase: str) -> None:
        """Say on the progress line what ``config``'s repeat is doing now."""
        if self.progress is not None:
            self.progress.phase(f"{config.name} #{repeat + 1}: {phase}")

    # ---- the lab run's shared services ---------------------------------------------------

    def auth_url(self) -> str:
        """The auth service's URL, or the replicas' comma-separated (``--auth-url``)."""
        if self.auth_urls:
            return ",".join(self.auth_urls)
        assert self.auth is not None
        return self.auth.url()

    def start_auth(self, users: int) -> None:
        """Start the auth service (unless ``auth_urls`` names running replicas), register
        ``users`` users and log them all in."""
        workdir = self.out_dir / "auth"
        workdir.mkdir(parents=True, exist_ok=True)
        if not self.auth_urls:
            self.auth = AuthProcess(workdir, **LAB_AUTH).start(timeout_s=60)
            pin(self.auth.proc, self.generator_cores)
        self.keys = KeyPair(workdir)  # unused by the server: it reads the auth service's key
        self.token_file = workdir / "tokens.json"
        command = [
            sys.executable,
            "-m",
            "loadtest.seed",
            "--users",
            str(users),
            "--auth-url",
            self.auth_url(),
            "--user-prefix",
            LAB_USER_PREFIX,
            "--token-file",
            str(self.token_file),
        ]
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"seeding users failed:\n{done.stdout}{done.stderr}")

    def close(self) -> None:
        """Stop everything this lab started."""
        for proc in list(self._children):
            self._stop_popen(proc)
        for target in list(self._targets):
            target.close()
        if self.auth is not None:
            with suppress(Exception):
                self.auth.stop()

    # ---- the drivers' processes ----------------------------------------------------------

    def _spawn(self, command: list[str], workdir: Path, log_name: str) -> subprocess.Popen[Any]:
        """Start a driver in its own session (Ctrl-C reaches only the lab), output to a log."""
        log_file = (workdir / log_name).open("ab")
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self._children.append(proc)
        return proc

    def _wait(self, proc: subprocess.Popen[Any], timeout_s: float) -> int:
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s overran %.0f s; stopping it", proc.args[2:4], timeout_s)
            self._stop_popen(proc)
            return -1
        finally:
            with suppress(ValueError):
                self._children.remove(proc)

    def _stop_popen(self, proc: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
        if proc.poll() is None:
            with suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        with suppress(ValueError):
            self._children.remove(proc)


def _fast_phase(load: Load) -> str:
    """What the progress line says while the fast driver runs ``load``."""
    if load.climb:
        return f"fast driver climb from {load.rates[0]:,.0f} sent/s"
    return "fast driver"


def _locust_stages(load: Load) -> tuple[Any, ...]:
    from loadtest.profiles import PROFILES, parse_stages

    if load.locust_stages:
        return parse_stages(load.locust_stages)
    return PROFILES[load.locust_profile].stages


#: said of every WS_DEFLATE=on or shared configuration the fast driver runs against
FAST_DRIVER_DEFLATE = (
    "The fast driver offers permessage-deflate as browsers do, so its steps here are "
    "compressed both ways; its ceiling at this shape, with deflate, is measured in the run "
    "and drawn beside the knee in the capacity ladder."
)


def _describe(config: Config) -> str:
    """The configuration's description, plus how the drivers exercised it."""
    text = config.description
    if config.fast and offers_deflate(config.env):
        text = f"{text} {FAST_DRIVER_DEFLATE}".strip()
    return text
