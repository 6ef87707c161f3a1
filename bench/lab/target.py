"""What a lab run measures: one configuration's chat server (or bare relay) and its Redis,
started and stopped as one object, and the one launcher of ``python -m bench.relay``.

:class:`Target` is read as uvicorn's ``Server`` is: :meth:`Target.startup` starts what the
configuration needs (its Redis, then the server pinned to the server's cores, or the
relay) and waits until it answers; :meth:`Target.shutdown` stops it (SIGTERM: a clean
drain) and says in the run how it went.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from bench.lab.facts import usable_cores
from bench.lab.matrix import Config
from bench.lab.results import Run
from chatlab.haproxy import HAProxyProcess
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
from chatlab.settings import parse_core_list
from chatlab.throwaway_ca import ThrowawayCA

#: the auth service of a lab run: real argon2 (its defaults), long tokens, no per-address
#: limits (every simulated user comes from 127.0.0.1)
#: connections the lab's proxy accepts (a run opens a few thousand; each is also one to
#: the server, so the descriptors it asks for are twice this and some)
PROXY_MAX_CONNECTIONS = 8000

LAB_AUTH = {
    "TOKEN_TTL_S": "86400",
    "LOGIN_RATE_PER_CLIENT_PER_MIN": "0",
    "REGISTER_RATE_PER_CLIENT_PER_MIN": "0",
    "REFRESH_RATE_PER_CLIENT_PER_MIN": "0",
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


class RelayProcess(ServiceProcess):
    """``python -m bench.relay`` on a free port, pinned to ``cores`` (none: not pinned):
    on ``transport``, in ``mode`` (None: the transport's default, see
    ``bench.relay_base.MODES``). :meth:`start` returns once its ``/healthz`` answers, and
    raises, with its log, when it exits or does not answer first."""

    module = "bench.relay"

    def __init__(
        self,
        workdir: Path,
        cores: list[int] | None = None,
        transport: str = "websockets",
        deflate: bool = False,
        mode: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.deflate = deflate
        self.port = free_port()
        self.cores = cores or []
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


def pin(proc: subprocess.Popen[Any] | None, cores: list[int]) -> None:
    """Pin a running process and its children to ``cores`` (none: leave it)."""
    if proc is None or not cores:
        return
    with suppress(psutil.Error):
        root = psutil.Process(proc.pid)
        for p in [root, *root.children(recursive=True)]:
            with suppress(psutil.Error):
                p.cpu_affinity(cores)


class Target:
    """One configuration's server (or relay) and the Redis it needs, for one run; with
    ``tls`` the server serves TLS with ``ca``'s certificate (``server``), or HAProxy in
    front of it does (``proxy``: the drivers speak to the proxy, which runs on the
    server's cores)."""

    def __init__(
        self,
        config: Config,
        workdir: Path,
        cores: list[int],
        *,
        keys: KeyPair | None = None,
        auth: AuthProcess | None = None,
        auth_urls: tuple[str, ...] = (),
        ca: ThrowawayCA | None = None,
    ) -> None:
        if config.tls != "off" and ca is None:
            raise ValueError(f"{config.name}: tls {config.tls} needs a certificate (ca)")
        self.ca = ca
        self.config = config
        self.workdir = workdir
        self.cores = cores
        self.keys = keys
        self.auth = auth
        self.auth_urls = auth_urls
        self.server: ServerProcess | RelayProcess | None = None
        #: the configuration's, with BROKER=redis (a cluster with REDIS_CLUSTER=on)
        self.redis: RedisProcess | RedisClusterProcesses | None = None
        self.metrics_port = 0  # 0: none (the relay)
        self.proxy: HAProxyProcess | None = None  # tls = "proxy"

    # ---- startup and shutdown ----------------------------------------------------------

    def startup(self) -> Target:
        """Start the relay, or the chat server (its Redis first); return once it answers.
        What started is held before it answers, so that :meth:`close` stops it whatever
        failed."""
        if self.config.target == "relay":
            self.server = self._relay()
            self.server.start()
        else:
            env = self.server_env()
            if env.get("BROKER") == "redis":
                env["REDIS_URL"] = self._start_redis(env).url
            assert self.keys is not None
            ca_file = self.ca.ca_file if self.ca is not None else ""
            self.server = ServerProcess(self.workdir, self.keys, ca_file=ca_file, **env)
            self.server.start(timeout_s=30)
            if self.config.tls == "proxy":
                assert self.ca is not None
                self.proxy = self._proxy(self.server.port)
                self.proxy.start()
                pin(self.proxy.proc, self.cores)
        return self

    def _proxy(self, server_port: int) -> HAProxyProcess:
        """The deployment's front door (:mod:`chatlab.front_door`, what ``deploy/haproxy``
        holds) in front of this server, TLS terminated there with the lab's certificate and
        a plain hop: what "behind the proxy" measures is the configuration a deployment
        runs. One thread (pinned beside the server by the caller), room for a run's
        connections; its auth backend is the lab's auth service, which its ``/healthz``
        asks for."""
        assert self.ca is not None
        if self.auth is not None:
            auth = f"127.0.0.1:{self.auth.port}"
        elif self.auth_urls:
            auth = urlsplit(self.auth_urls[0]).netloc
        else:
            raise ValueError(f"{self.config.name}: tls proxy needs an auth service behind it")
        return HAProxyProcess(
            self.workdir,
            [f"127.0.0.1:{server_port}"],
            [auth],
            cert_file=self.ca.cert_file,
            key_file=self.ca.key_file,
            ca_file=self.ca.ca_file,
            threads=1,
            max_connections=PROXY_MAX_CONNECTIONS,
            stats_socket="",  # no runtime API: a run's directory can be past a socket's path
        )

    def shutdown(self, run: Run) -> None:
        """Stop the proxy, the server (SIGTERM: a clean drain), then its Redis; a failure
        goes into ``run``."""
        if self.proxy is not None:
            with suppress(Exception):
                self.proxy.stop()
        if self.server is not None:
            try:
                status = self.server.stop()
                if status not in (0, None) and run.status == "ok":
                    run.status = "failed"
                    run.error = f"server exited {status}:\n{self.server.log()[-2000:]}"
            except subprocess.TimeoutExpired:
                run.error += "\nthe server did not stop within 20 s after SIGTERM"
        self.close()

    def close(self) -> None:
        """Stop whatever still runs, without a verdict (Ctrl-C, or a start that failed)."""
        for service in (self.proxy, self.server, self.redis):
            if service is not None:
                with suppress(Exception):
                    service.stop()
        self.server = self.redis = self.proxy = None

    # ---- what the drivers and samplers need --------------------------------------------

    @property
    def url(self) -> str:
        """The websocket URL the drivers load (the proxy's, where there is one)."""
        if self.proxy is not None:
            return self.proxy.url
        assert self.server is not None
        return self.server.url

    @property
    def ca_file(self) -> str:
        """The CA file the drivers verify :attr:`url` with ("": plain ws://)."""
        return str(self.ca.ca_file) if self.ca is not None and self.config.tls != "off" else ""

    @property
    def proxy_pid(self) -> int | None:
        """HAProxy's process id (None: no proxy)."""
        return self.proxy.proc.pid if self.proxy is not None and self.proxy.proc else None

    @property
    def pid(self) -> int:
        """The server's (or relay's) process id."""
        assert self.server is not None and self.server.proc is not None
        return self.server.proc.pid

    @property
    def stats_url(self) -> str:
        """The chat server's ``/stats`` (https:// with TLS in the server: read it with
        :attr:`stats_context`)."""
        assert self.server is not None
        return self.server.http_url("/stats")

    @property
    def stats_context(self) -> ssl.SSLContext | None:
        """What verifies :attr:`stats_url` (None: plain http)."""
        assert self.server is not None
        return self.server.client_ssl

    @property
    def inline_auth_port(self) -> int | None:
        """The port of the login the server answers itself (``REGRESSION=auth_inline``)."""
        if isinstance(self.server, ServerProcess) and "AUTH_INLINE_PORT" in self.server.env:
            return int(self.server.env["AUTH_INLINE_PORT"])
        return None

    # ---- helpers -----------------------------------------------------------------------

    def _relay(self) -> RelayProcess:
        env = self.config.env
        return RelayProcess(
            self.workdir,
            self.cores,
            env.get("TRANSPORT", "websockets"),
            env.get("WS_DEFLATE") == "on",
            env.get("RELAY_MODE"),
        )

    def server_env(self) -> dict[str, str]:
        """The chat server's settings: the lab's, the configuration's toggles, its TLS, its cores,
        a metrics port, the auth service's key (or JWK sets), profiling and a regression's
        needs."""
        env = {**LAB_SERVER, **self.config.env}
        if self.config.tls == "server":
            assert self.ca is not None
            env["TLS_CERT_FILE"] = str(self.ca.cert_file)
            env["TLS_KEY_FILE"] = str(self.ca.key_file)
        if env.get("CPU_AFFINITY", "server") == "server":
            env["CPU_AFFINITY"] = ",".join(map(str, self.cores)) or "off"
        self.metrics_port = free_port()
        env["METRICS_PORT"] = str(self.metrics_port)
        if self.auth is not None:
            env["JWT_PUBLIC_KEY"] = str(self.auth.public_path)
        else:
            env["JWT_JWKS_URL"] = ",".join(f"{u}/.well-known/jwks.json" for u in self.auth_urls)
        if self.config.profile:
            env["PROFILE"] = "cprofile"
            env["PROFILE_DIR"] = str(self.workdir / "profiles")
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
        return env

    def _start_redis(self, env: dict[str, str]) -> RedisProcess | RedisClusterProcesses:
        """The configuration's Redis, pinned with the server (all usable cores for
        ``CPU_AFFINITY=off``). Redis' default AOF policy (everysec): an acked message
        survives a crash of the server or of Redis, as SQLite's synchronous=normal
        survives the server's."""
        redis: RedisProcess | RedisClusterProcesses
        if env.get("REDIS_CLUSTER") == "on":
            redis = RedisClusterProcesses(self.workdir, appendonly=True)
        else:
            redis = RedisProcess(self.workdir, appendonly=True, fsync="everysec")
        self.redis = redis
        redis.start()
        cores = list(parse_core_list(env.get("CPU_AFFINITY", "off")) or usable_cores())
        for proc in redis.procs():
            pin(proc, cores)
        return redis
