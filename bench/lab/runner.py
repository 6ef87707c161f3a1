"""Run a matrix: each configuration's server, its drivers, the samples, into one Results.

For each configuration, repeated ``repeat`` times, interleaved (every configuration once,
then every configuration again): start the chat server with its toggles (or the bare
relay) pinned to the server's core(s), let it settle, run the fast driver's steps and
the Locust profile on the generator's core(s) while a sampler records CPU% and RSS of
server and generator every half second, scrape the server's own metrics, stop it
cleanly, go on. One auth service serves the whole lab run (its users are registered
once, with the auth service's real argon2 parameters). Ctrl-C stops what runs and
keeps what was measured. With ``--auth-url`` it starts no auth service and uses the
replicas named instead (users, the chat servers' ``JWT_JWKS_URL``, Locust).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from bench.lab.driver.config import DriverArgs
from bench.lab.locust_step import locust_step
from bench.lab.machine import busy_reasons, is_busy, others_load_over
from bench.lab.matrix import Config, Load, Matrix, offers_deflate
from bench.lab.results import Results, Run, Step, edge, parse_slo
from bench.lab.sampler import Sampler
from bench.lab.side import measure_side, side_skipped
from bench.lab.tailwatch import TailWatch
from chatlab.harness import (
    ROOT,
    AuthProcess,
    KeyPair,
    RedisClusterProcesses,
    RedisProcess,
    ServerProcess,
    ServiceProcess,
    free_port,
)

log = logging.getLogger("bench.lab")

#: the auth service of a lab run: real argon2 (its defaults), long tokens, no per-address
#: limits (every simulated user comes from 127.0.0.1)
LAB_AUTH = {
    "TOKEN_TTL_S": "86400",
    "LOGIN_RATE_PER_CLIENT_PER_MIN": "0",
    "REGISTER_RATE_PER_CLIENT_PER_MIN": "0",
    "LOGIN_RATE_PER_USER_PER_MIN": "0",
    "LOGIN_RATE_PER_USER_CLIENT_PER_MIN": "0",
    "LOG_LEVEL": "warning",
}
#: chat server settings every lab run shares: the per-connection rate limit is raised
#: so that the driver's offered load is measured, not refused (it is a flood guard,
#: not a toggle under test); everything else stays at its default
LAB_SERVER = {
    "RATE_LIMIT_PER_S": "100000",
    "RATE_LIMIT_BURST": "100000",
    "LOG_LEVEL": "warning",
}
#: users registered for a lab run (drivers with more connections reuse them: one user
#: may hold several connections)
LAB_USER_PREFIX = "lab"
#: a process that exits in this long after SIGTERM is stopped cleanly
STOP_TIMEOUT_S = 20


def usable_cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def split_cores(cores: list[int]) -> tuple[list[int], list[int]]:
    """Server and generator cores: the first core for the server, the rest for the generator.

    On one core both share it (the report says so).
    """
    if len(cores) < 2:
        return cores, cores
    return cores[:1], cores[1:]


def machine_facts() -> dict[str, Any]:
    """What the report states about the machine and the software."""
    model = ""
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = {}
    for package in ("websockets", "uvloop", "orjson", "protobuf", "msgspec", "picows", "locust"):
        with suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return {
        "commit": git_commit(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "cpu_model": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def git_commit() -> str:
    """The checkout's commit (short), with ``+changes`` when its files differ from it;
    "" outside a git checkout."""

    def git(*args: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
            )
        except OSError:
            return None

    head = git("rev-parse", "--short", "HEAD")
    if head is None or head.returncode != 0:
        return ""
    dirty = git("status", "--porcelain", "--untracked-files=no")
    changed = dirty is not None and bool(dirty.stdout.strip())
    return head.stdout.strip() + ("+changes" if changed else "")


class RelayProcess(ServiceProcess):
    """``python -m bench.relay`` pinned to ``cores``: on ``transport``, in ``mode`` (None:
    the transport's default, see ``bench.relay_base.MODES``)."""

    module = "bench.relay"

    def __init__(
        self,
        workdir: Path,
        cores: list[int],
        transport: str = "websockets",
        deflate: bool = False,
        mode: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.deflate = deflate
        self.port = free_port()
        self.cores = cores
        self.transport = transport
        self.mode = mode
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log_path = workdir / f"relay-{self.port}.log"
        self.proc = None

    def command(self) -> list[str]:
        """The relay's command line."""
        cores = ",".join(map(str, self.cores)) or "off"
        return [
            sys.executable,
            "-m",
            self.module,
            "--port",
            str(self.port),
            "--cpu-affinity",
            cores,
            "--event-loop",
            "uvloop",
            "--transport",
            self.transport,
            "--deflate",
            "on" if self.deflate else "off",
            *(("--mode", self.mode) if self.mode else ()),
            "--log-level",
            "warning",
        ]

    @property
    def url(self) -> str:
        """The websocket URL (a room is added per connection)."""
        return f"ws://127.0.0.1:{self.port}/ws"

    def start(self, timeout_s: float = 20) -> RelayProcess:
        """Start and wait until /healthz answers."""
        self._start(timeout_s)
        return self


def scrape_metrics(port: int, buckets: bool = False) -> dict[str, float]:
    """The server's Prometheus metrics as ``name{labels}: value`` (bucket lines left out
    unless ``buckets``)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    flat: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created") or (
                sample.name.endswith("_bucket") and not buckets
            ):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            flat[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return flat


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
    t0: float = field(default_factory=time.monotonic)
    interrupted: bool = False
    #: the current configuration's, with BROKER=redis (a cluster with REDIS_CLUSTER=on)
    redis: RedisProcess | RedisClusterProcesses | None = None
    _children: list[subprocess.Popen[Any]] = field(default_factory=list)
    _current: list[ServiceProcess | RedisClusterProcesses] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- the lab run's shared services ---------------------------------------------

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
            self._pin(self.auth.proc, self.generator_cores)
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
        for service in list(self._current):
            with suppress(Exception):
                service.stop()
        if self.auth is not None:
            with suppress(Exception):
                self.auth.stop()

    # ---- helpers ---------------------------------------------------------------------

    @staticmethod
    def _pin(proc: subprocess.Popen[Any] | None, cores: list[int]) -> None:
        """Pin a running process and its children to ``cores``."""
        if proc is None or not cores:
            return
        with suppress(psutil.Error):
            root = psutil.Process(proc.pid)
            for p in [root, *root.children(recursive=True)]:
                with suppress(psutil.Error):
                    p.cpu_affinity(cores)

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

    # ---- one configuration -------------------------------------------------------------

    def start_target(self, config: Config, workdir: Path) -> tuple[ServiceProcess, int]:
        """Start the configuration's server (or relay); it and its metrics port (0: none)."""
        if config.target == "relay":
            transport = config.env.get("TRANSPORT", "websockets")
            deflate = config.env.get("WS_DEFLATE") == "on"
            mode = config.env.get("RELAY_MODE")
            relay = RelayProcess(workdir, self.server_cores, transport, deflate, mode).start()
            self._current.append(relay)
            return relay, 0
        assert self.keys is not None
        env = dict(LAB_SERVER)
        cores = self.server_cores
        for key, value in config.env.items():
            env[key] = value
        if env.get("CPU_AFFINITY", "server") == "server":
            env["CPU_AFFINITY"] = ",".join(map(str, cores)) or "off"
        metrics_port = free_port()
        env["METRICS_PORT"] = str(metrics_port)
        if self.auth is not None:
            env["JWT_PUBLIC_KEY"] = str(self.auth.public_path)
        else:
            env["JWT_JWKS_URL"] = ",".join(f"{u}/.well-known/jwks.json" for u in self.auth_urls)
        if config.profile:
            env["PROFILE"] = "cprofile"
            env["PROFILE_DIR"] = str(workdir / "profiles")
            env.setdefault("PROFILE_INTERVAL_S", "5")
        if env.get("REGRESSION") == "auth_inline":
            if self.auth is None:
                raise RuntimeError(
                    "REGRESSION=auth_inline reads the lab's own auth service's files: "
                    "run it without --auth-url"
                )
            env.update(
                {
                    "AUTH_DB": str(self.auth.db_path),
                    "JWT_PRIVATE_KEY": str(self.auth.private_path),
                    "JWT_KEYRING": str(self.auth.keyring_path),
                    "AUTH_INLINE_PORT": str(free_port()),
                    **{k: v for k, v in LAB_AUTH.items() if k != "LOG_LEVEL"},
                }
            )
        if env.get("BROKER") == "redis":
            # Redis' default AOF policy (everysec): an acked message survives a crash of
            # the server or of Redis, as SQLite's synchronous=normal survives the server's
            if env.get("REDIS_CLUSTER") == "on":
                self.redis = RedisClusterProcesses(workdir, appendonly=True).start()
            else:
                self.redis = RedisProcess(workdir, appendonly=True, fsync="everysec").start()
            for proc in self.redis.procs():
                self._pin(proc, self._cores_of(env))
            self._current.append(self.redis)
            env["REDIS_URL"] = self.redis.url
        server = ServerProcess(workdir, self.keys, **env).start(timeout_s=30)
        self._current.append(server)
        return server, metrics_port

    def stop_target(self, server: ServiceProcess, run: Run) -> None:
        """Stop the server (SIGTERM: a clean drain) and its Redis; a failure goes into ``run``."""
        try:
            status = server.stop()
            if status not in (0, None) and run.status == "ok":
                run.status = "failed"
                run.error = f"server exited {status}:\n{server.log()[-2000:]}"
        except subprocess.TimeoutExpired:
            run.error += "\nthe server did not stop within 20 s after SIGTERM"
        with suppress(ValueError):
            self._current.remove(server)
        if self.redis is not None:
            with suppress(Exception):
                self.redis.stop()
            with suppress(ValueError):
                self._current.remove(self.redis)
            self.redis = None

    def _cores_of(self, env: dict[str, str]) -> list[int]:
        """The cores a server setting pins to (all usable ones for ``off``)."""
        from chatlab.settings import parse_core_list

        return list(parse_core_list(env.get("CPU_AFFINITY", "off")) or usable_cores())

    def fast_step(
        self,
        config: Config,
        load: Load,
        url: str,
        workdir: Path,
        sampler: Sampler,
        *,
        server_pid: int | None = None,
    ) -> list[Step]:
        """Run the fast driver's steps against ``url``; its Steps."""
        out = workdir / "fast.json"
        chat = config.target == "chat"
        if chat:
            assert self.token_file is not None
        driver = DriverArgs(
            target=config.target,
            url=url,
            connections=load.connections,
            room_size=load.room_size,
            rates=load.rates,
            step_s=load.step_s,
            warmup_s=load.warmup_s,
            drain_s=load.drain_s,
            cpu_affinity=",".join(map(str, self.generator_cores)) or "off",
            serializer=config.env.get("SERIALIZER", "orjson"),
            token_file=self.token_file if chat else None,
            json_out=out,
            t0_monotonic=sampler.t0,
            # as browsers do: deflate is measured with deflate
            deflate=offers_deflate(config.env),
            climb=load.climb,
            factor=load.factor if load.climb else None,
            resolution=load.resolution if load.climb else None,
            max_rate=load.max_rate if load.climb and load.max_rate > 0 else None,
            cost_rates=load.cost_rates,
            cost_step_s=load.cost_step_s if load.cost_rates else None,
            sustain_s=load.sustain_s if load.climb and load.sustain_s else None,
            # every step's window reads the server's CPU and what else ran
            server_pid=server_pid,
            lab_pid=os.getpid(),
        )
        command = driver.command()
        proc = self._spawn(command, workdir, "fast-driver.log")
        sampler.watch("generator", proc.pid)
        status = self._wait(proc, load.fast_duration_s() + 120)
        sampler.watch("generator", None)
        if status != 0 or not out.exists():
            tail = (workdir / "fast-driver.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"fast driver exited {status}:\n{tail}")
        return [Step.from_dict(s) for s in json.loads(out.read_text())]

    def locust_run(
        self, config: Config, load: Load, url: str, workdir: Path, sampler: Sampler
    ) -> Step:
        """Run the Locust profile against ``url``; its Step."""
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
            url,
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
        if config.auth_mode == "login":
            auth_url = self.auth_url()
            inline = next((s for s in self._current if isinstance(s, ServerProcess)), None)
            if inline is not None and "AUTH_INLINE_PORT" in inline.env:
                auth_url = f"http://127.0.0.1:{inline.env['AUTH_INLINE_PORT']}"
            command += ["--auth-mode", "login", "--auth-url", auth_url]
        else:
            command += ["--auth-mode", "prelogin", "--token-file", str(self.token_file)]
        started_s = round(time.monotonic() - sampler.t0, 3)
        proc = self._spawn(command, locust_dir, "locust.log")
        # Locust does not pin itself: pin it (and its greenlets' one thread) right away
        self._pin(proc, self.generator_cores)
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
        )
        return workdir, run, Sampler(time.monotonic(), cores=self.generator_cores).start()

    def run_config(self, matrix: Matrix, config: Config, repeat: int) -> Run:
        """Start, drive, sample and stop one configuration once; its Run (status says how)."""
        load = matrix.load_of(config)
        workdir, run, sampler = self.begin_run(config, repeat, f"r{repeat + 1}")
        server: ServiceProcess | None = None
        watch: TailWatch | None = None
        try:
            self._phase(config, repeat, "starting")
            server, metrics_port = self.start_target(config, workdir)
            assert server.proc is not None
            sampler.watch("server", server.proc.pid)
            if self.redis is not None:
                sampler.watch("redis", self.redis.pids())
            if config.env.get("CPU_AFFINITY") == "off":
                run.server_cores = []
            time.sleep(load.settle_s)
            url = server.url  # type: ignore[attr-defined]
            if metrics_port and config.target == "chat":
                stats_url = f"http://127.0.0.1:{server.port}/stats"  # type: ignore[attr-defined]
                watch = TailWatch(
                    scrape_metrics, metrics_port, stats_url, sampler.t0, self.generator_cores
                ).start()
            if config.fast:
                self._phase(config, repeat, "fast driver climb" if load.climb else "fast driver")
                run.steps.extend(
                    self.fast_step(config, load, url, workdir, sampler, server_pid=server.proc.pid)
                )
                if load.climb:
                    run.knee = {**edge(run, parse_slo(load.climb)), "room_size": load.room_size}
            if config.locust and config.target == "chat" and load.locust_profile:
                self._phase(config, repeat, "locust")
                run.steps.append(self.locust_run(config, load, url, workdir, sampler))
            if metrics_port:
                if int(config.env.get("WORKERS", "1")) > 1:
                    time.sleep(1.2)  # workers publish their counters every second
                with suppress(OSError):
                    run.metrics = scrape_metrics(metrics_port)
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
            if server is not None:
                self.stop_target(server, run)
            run.samples = sampler.stop()
            run.host = sampler.host
            prof_root = workdir / "profiles"
            run.profiles = [
                str(p.relative_to(self.out_dir)) for p in sorted(prof_root.rglob("*.prof"))
            ]
        if run.status == "ok" and (load.wire_messages or load.memory_connections):
            self.side(config, load, run, workdir)
        return run

    def side(self, config: Config, load: Load, run: Run, workdir: Path) -> None:
        """The side measurements (bench.lab.side) after ``run``'s server stopped, into it;
        one that fails is reported in the run, not fatal to it."""
        run.side_skipped = side_skipped(config)
        if run.side_skipped:
            return
        try:
            run.wire, run.memory = measure_side(
                config, load, workdir, lambda what: self._phase(config, run.repeat, what)
            )
        except KeyboardInterrupt:
            self.interrupted = True
        except Exception as exc:  # the drivers' figures stand without it
            log.error("%s: side measurement failed: %s", config.name, exc)
            run.side_skipped = f"failed: {exc}"[:2000]

    def _phase(self, config: Config, repeat: int, phase: str) -> None:
        if self.progress is not None:
            self.progress.phase(f"{config.name} #{repeat + 1}: {phase}")


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


def users_needed(matrix: Matrix) -> int:
    """Users to register: Locust's largest user count, and some for the fast driver."""
    most = 20
    for config in matrix.configs:
        load = matrix.load_of(config)
        if config.locust and load.locust_profile:
            most = max(most, *(s.users for s in _locust_stages(load)))
    return most


def run_matrix(
    matrix: Matrix,
    repeat: int,
    out_dir: Path,
    progress: Any = None,
    ceilings: dict[str, Step] | None = None,
    *,
    auth_urls: tuple[str, ...] = (),
) -> Results:
    """Run every configuration ``repeat`` times, interleaved; the Results (also when Ctrl-C).

    ``results.json`` is rewritten after every run, so an interrupted lab keeps its data.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    server_cores, generator_cores = split_cores(usable_cores())
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
    results = Results(
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
    results_path = out_dir / "results.json"
    lab = Lab(out_dir, repeat, server_cores, generator_cores, progress=progress, results=results)
    lab.auth_urls = auth_urls
    try:
        if any(c.target == "chat" for c in matrix.configs):
            if progress is not None:
                progress.phase("auth service: registering users")
            lab.start_auth(users_needed(matrix))
        rounds = repeat + max(c.extra_repeats for c in matrix.configs)
        for k in range(rounds):
            for config in matrix.configs:
                if k >= repeat + config.extra_repeats:
                    continue
                started = time.monotonic()
                run = lab.run_config(matrix, config, k)
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
