"""Run chatlab for real, outside the server: keys, tokens and a chat server subprocess.

Shared by the tests, the demo and the benchmarks, so that all three start the
server exactly as a user does (``python -m chat_server`` with its settings in
the environment) and mint tokens as the auth service does (EdDSA, with ``kid``).
:class:`RedisProcess` runs a private ``redis-server`` for ``BROKER=redis``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import Any

import jwt
import psutil
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from chatlab.keys import key_id
from chatlab.tls import client_context

ROOT = Path(__file__).resolve().parent.parent
ISSUER = "chatlab-auth"
AUDIENCE = "chatlab-chat"


def pin_this_thread(cores: Iterable[int] | None) -> None:
    """Pin the calling thread, and only it, to ``cores`` (Linux's ``sched_setaffinity(0)``
    is per thread); None or none leaves it free.

    A measurement's own work (scrapes, samples) runs this way on the generator's core,
    so that it never takes the server's: the apparatus has no business there
    (``docs/decisions/0012-the-instrument.md``).
    """
    if cores:
        os.sched_setaffinity(0, set(cores))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class KeyPair:
    """An Ed25519 key pair on disk (public PEM) that mints tokens like the auth service."""

    def __init__(self, directory: Path) -> None:
        self.private_key = ed25519.Ed25519PrivateKey.generate()
        self.public_path = directory / "jwt_public.pem"
        self.public_path.write_bytes(
            self.private_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def mint(self, sub: str | None, ttl_s: float = 600, **claims: Any) -> str:
        """A signed EdDSA token for ``sub``; ``claims`` override or add claims (None drops one)."""
        now = int(time.time())
        payload: dict[str, Any] = {
            "sub": sub,
            "iss": ISSUER,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + int(ttl_s),
            "jti": uuid.uuid4().hex,
        }
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, self.private_key, algorithm="EdDSA", headers={"kid": self.kid})

    @property
    def kid(self) -> str | None:
        """The key's ``kid``, as the auth service names it (the chat server checks it)."""
        return key_id(self.private_key.public_key())


class ServiceProcess:
    """A service (``python -m MODULE``) as a subprocess in its own working directory.

    Subclasses set ``module``, ``env``, ``port`` and ``log_path``; :meth:`start`
    waits for its ``/healthz`` (or whatever :meth:`ready` checks); every stop is
    bounded in time. With ``TLS_CERT_FILE`` in its settings it is spoken to over
    https (and wss), verified against ``ca_file``.
    """

    module = ""
    workdir: Path
    env: dict[str, str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    #: the CA file that verifies the service's certificate (with TLS_CERT_FILE set)
    ca_file: str = ""

    @property
    def tls(self) -> bool:
        """True when the service serves TLS (``TLS_CERT_FILE`` set)."""
        return bool(self.env.get("TLS_CERT_FILE"))

    @property
    def client_ssl(self) -> ssl.SSLContext | None:
        """The context a client verifies the service with (None without TLS)."""
        return client_context(self.ca_file) if self.tls else None

    def http_url(self, path: str = "") -> str:
        """``http(s)://127.0.0.1:PORT`` and ``path``."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def command(self) -> list[str]:
        """The command line that starts the service."""
        return [sys.executable, "-m", self.module]

    def ready(self) -> bool:
        """True once the service answers (``GET /healthz`` on its port)."""
        with suppress(OSError):
            urllib.request.urlopen(self.http_url("/healthz"), timeout=1, context=self.client_ssl)
            return True
        return False

    def _start(self, timeout_s: float) -> None:
        """Start the process and wait until :meth:`ready`."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.command(),
            cwd=self.workdir,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        name = self.module or self.command()[0]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited {self.proc.returncode}:\n{self.log()}")
            if self.ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not get ready:\n{self.log()}")

    def log(self) -> str:
        """Everything the process printed."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        """Send a signal to the process."""
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 20) -> int:
        """Wait for the process to exit; its status."""
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL, and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int | None:
        """SIGTERM and wait (SIGKILL if it hangs); the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
            raise


class ServerProcess(ServiceProcess):
    """``python -m chat_server`` as a subprocess on a free port, in its own working directory."""

    module = "chat_server"

    def __init__(
        self, workdir: Path, keys: KeyPair, *, ca_file: str | Path = "", **settings: Any
    ) -> None:
        self.workdir = workdir
        self.ca_file = str(ca_file)
        self.port = free_port()
        self.settings = {k.upper(): str(v) for k, v in settings.items()}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("CHAT_", "JWT_", "TLS_"))},
            "CHAT_HOST": "127.0.0.1",
            "CHAT_PORT": str(self.port),
            "CHAT_DB": str(workdir / "chat.sqlite3"),
            "JWT_PUBLIC_KEY": str(keys.public_path),
            "PING_INTERVAL_S": "20",
            "CLOSE_TIMEOUT_S": "2",
            # no proxy checks /healthz here: a stop closes the listener at once
            "DRAIN_NOTICE_S": "0",
            # every client of the tests and the lab comes from 127.0.0.1
            "MAX_CONNECTIONS_PER_ADDRESS": "0",
            # /stats and X-Chatlab-Worker: what the tests and the lab read
            "EXPOSE_INTERNALS": "on",
            "PYTHONPATH": str(ROOT),
            **self.settings,
        }
        self.log_path = workdir / f"server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.serializer = self.env.get("SERIALIZER", "orjson")

    @property
    def url(self) -> str:
        """The websocket URL."""
        return f"{'wss' if self.tls else 'ws'}://127.0.0.1:{self.port}/ws"

    def start(self, timeout_s: float = 20) -> ServerProcess:
        """Start and wait until /healthz answers."""
        self._start(timeout_s)
        return self

    def kill(self) -> None:
        """SIGKILL the server and, with ``WORKERS`` > 1, its workers; wait."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with suppress(psutil.NoSuchProcess):
            workers = psutil.Process(self.proc.pid).children()
            super().kill()
            for worker in workers:
                with suppress(psutil.NoSuchProcess):
                    worker.kill()
            psutil.wait_procs(workers, timeout=10)

    def worker_pids(self) -> list[int]:
        """The pids of the supervisor's worker processes (empty with ``WORKERS=1``)."""
        assert self.proc is not None
        return [child.pid for child in psutil.Process(self.proc.pid).children()]

    def stats(self) -> dict[str, Any]:
        """The server's /stats counters."""
        with urllib.request.urlopen(
            self.http_url("/stats"), timeout=5, context=self.client_ssl
        ) as resp:
            return json.loads(resp.read())


# ---- Redis -------------------------------------------------------------------------------


class RedisProcess(ServiceProcess):
    """A private ``redis-server`` on a free port, its files in ``workdir``.

    ``appendonly=True`` keeps an AOF fsynced on every write (``appendfsync
    always``, or ``fsync="everysec"``: Redis' default AOF policy), so the data
    survives :meth:`stop` and :meth:`kill` and a restart on the same port and
    directory; otherwise nothing is persisted.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        appendonly: bool = False,
        port: int | None = None,
        fsync: str = "always",
        cluster_port: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.appendonly = appendonly
        self.fsync = fsync
        #: with a cluster bus port: a cluster node (its bus on this port, not port + 10000)
        self.cluster_port = cluster_port
        self.env = dict(os.environ)
        self.log_path = workdir / f"redis-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # ports it chose itself may be chosen again, until it has run once on them
        self._ports_movable = port is None

    @property
    def url(self) -> str:
        """The ``REDIS_URL`` of this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        """``redis-server`` with everything on the command line (no config file)."""
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        persistence = (
            ["--appendonly", "yes", "--appendfsync", self.fsync, "--save", ""]
            if self.appendonly
            else ["--appendonly", "no", "--save", ""]
        )
        cluster = (
            [
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                str(self.cluster_port),
                "--cluster-config-file",
                f"nodes-{self.port}.conf",
                "--cluster-node-timeout",
                str(CLUSTER_NODE_TIMEOUT_MS),
                # each room lives in one slot and nothing spans two: the rooms of the
                # shards that are up keep working while one shard fails over
                "--cluster-require-full-coverage",
                "no",
                # a replica syncs at once (not 5 s later, waiting for others to share an RDB)
                "--repl-diskless-sync-delay",
                "0",
            ]
            if self.cluster_port
            else []
        )
        return [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--daemonize",
            "no",
            "--maxmemory-policy",
            "noeviction",
            *persistence,
            *cluster,
        ]

    def ready(self) -> bool:
        """True once the server answers PING (and is done loading its AOF)."""
        with suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
        return False

    def start(self, timeout_s: float = 20) -> RedisProcess:
        """Start and wait until it answers PING.

        On its first start, a port it chose itself that something took in the meantime
        (:func:`free_port` only says it was free a moment ago; a client's outgoing
        connection may take it) is chosen again, twice at most. Later starts keep their
        ports: a restarted node is the same node.
        """
        retries = 2
        while True:
            try:
                self._start(timeout_s)
            except RuntimeError as exc:
                taken = "Address already in use" in str(exc)
                if not (taken and self._ports_movable and retries):
                    raise
                retries -= 1
                self.port = free_port()
                self.cluster_port = self.cluster_port and free_port()
                self.log_path = self.workdir / f"redis-{self.port}.log"
                continue
            self._ports_movable = False
            return self

    def call(self, *args: str) -> str:
        """``redis-cli`` against this server; its output (raises if it fails)."""
        return redis_cli("-p", str(self.port), *args)

    def procs(self) -> list[subprocess.Popen[bytes]]:
        """The running process (to pin)."""
        return [self.proc] if self.proc is not None else []

    def pids(self) -> tuple[int, ...]:
        """The process' pid (to sample)."""
        return tuple(proc.pid for proc in self.procs())


#: a cluster node that does not answer this long is failed over (Redis' default is 15 s)
CLUSTER_NODE_TIMEOUT_MS = 2000


def redis_cli(*args: str, timeout_s: float = 60) -> str:
    """Run ``redis-cli`` against 127.0.0.1; its output (raises if it fails)."""
    binary = shutil.which("redis-cli") or "/usr/bin/redis-cli"
    done = subprocess.run(
        [binary, "-h", "127.0.0.1", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0 or done.stdout.startswith(("ERR", "[ERR]")):
        raise RuntimeError(f"redis-cli {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


class RedisClusterProcesses:
    """A private Redis Cluster: ``primaries`` primaries with one replica each, every node a
    :class:`RedisProcess` on free ports (its cluster bus on a free port of its own), made
    one cluster by ``redis-cli --cluster create``."""

    def __init__(self, workdir: Path, *, primaries: int = 3, appendonly: bool = False) -> None:
        self.workdir = workdir
        #: nodes stopped by :meth:`freeze` (not asked anything until thawed)
        self.frozen: set[RedisProcess] = set()
        # with appendonly: Redis' default AOF policy (everysec), as the lab runs one Redis
        self.nodes = []
        for i in range(primaries * 2):
            node_dir = workdir / f"node-{i}"  # each node's AOF directory is its own
            node_dir.mkdir(parents=True, exist_ok=True)
            self.nodes.append(
                RedisProcess(
                    node_dir, appendonly=appendonly, fsync="everysec", cluster_port=free_port()
                )
            )

    @property
    def url(self) -> str:
        """The ``REDIS_URL`` for ``REDIS_CLUSTER=on``: every node, as seeds."""
        return ",".join(node.url for node in self.nodes)

    def start(self, timeout_s: float = 60) -> RedisClusterProcesses:
        """Start every node, create the cluster, wait until every node says it is ok."""
        for node in self.nodes:
            node.start()
        redis_cli(
            "--cluster",
            "create",
            *(f"127.0.0.1:{node.port}" for node in self.nodes),
            "--cluster-replicas",
            "1",
            "--cluster-yes",
        )
        self.wait_ok(timeout_s)
        return self

    def wait_ok(self, timeout_s: float = 60) -> None:
        """Wait until every live node reports ``cluster_state:ok`` and agrees on the slots,
        and every replica's link to its primary is up (a replica that never synced would
        not fail over)."""
        deadline = time.monotonic() + timeout_s
        states: set[str] = set()
        shards: set[str] = set()
        while True:
            try:
                live = self.live()
                states = {node.call("cluster", "info").split()[0] for node in live}
                shards = {_slot_owners(node.call("cluster", "slots")) for node in live}
                synced = all(
                    "master_link_status:up" in info
                    for info in (node.call("info", "replication") for node in live)
                    if "role:slave" in info
                )
                if states == {"cluster_state:ok"} and len(shards) == 1 and synced:
                    return
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Redis Cluster did not become ok: {states} {shards}")
            time.sleep(0.1)

    def live(self) -> list[RedisProcess]:
        """The nodes running and not frozen."""
        return [
            node
            for node in self.nodes
            if node.proc and node.proc.poll() is None and node not in self.frozen
        ]

    def primary_of(self, slot: int) -> RedisProcess:
        """The node serving ``slot`` now (as the first live node sees it)."""
        node = self.live()[0].call("cluster", "nodes")
        for line in node.splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2].replace("fail?", ""):
                continue
            for part in fields[8:]:
                start, _, end = part.partition("-")
                if start.isdigit() and int(start) <= slot <= int(end or start):
                    port = int(fields[1].split(":")[1].split("@")[0])
                    return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no primary serves slot {slot}")

    def wait_promoted(self, slot: int, old: RedisProcess, timeout_s: float = 30) -> RedisProcess:
        """Wait until a node other than ``old`` serves ``slot`` (its replica was promoted)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with suppress(RuntimeError, subprocess.TimeoutExpired, StopIteration):
                primary = self.primary_of(slot)
                if primary is not old:
                    return primary
            time.sleep(0.1)
        raise RuntimeError(f"slot {slot} was not failed over in {timeout_s} s")

    def wait_replicated(self, primary: RedisProcess, timeout_s: float = 60) -> None:
        """Wait until ``primary`` has a replica online again (an old node rejoined)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with suppress(RuntimeError, subprocess.TimeoutExpired):
                info = primary.call("info", "replication")
                if "state=online" in info:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"no replica of {primary.port} came online in {timeout_s} s")

    def replica_of(self, primary: RedisProcess) -> RedisProcess:
        """A node replicating ``primary`` now (as ``primary`` tells)."""
        info = primary.call("info", "replication")
        for line in info.splitlines():
            if line.startswith("slave") and "port=" in line:
                port = int(line.split("port=")[1].split(",")[0])
                return next(node for node in self.nodes if node.port == port)
        raise RuntimeError(f"{primary.port} has no replica")

    def freeze(self, node: RedisProcess) -> None:
        """SIGSTOP ``node``: alive, holding its sockets, answering nothing."""
        node.signal(signal.SIGSTOP)
        self.frozen.add(node)

    def thaw(self, node: RedisProcess) -> None:
        """SIGCONT a frozen ``node``."""
        node.signal(signal.SIGCONT)
        self.frozen.discard(node)

    def node_id(self, node: RedisProcess) -> str:
        """The cluster's ID of ``node``."""
        return node.call("cluster", "myid").strip()

    def primaries(self) -> list[RedisProcess]:
        """The live nodes that are primaries now."""
        return [node for node in self.live() if node.call("role").startswith("master")]

    def flush(self) -> None:
        """Delete every key on every primary (their replicas follow)."""
        for node in self.primaries():
            node.call("flushall")

    def move_slot(self, slot: int, target: RedisProcess) -> None:
        """Migrate ``slot`` and its keys to the primary ``target`` as ``redis-cli --cluster
        reshard`` does for each slot: IMPORTING, MIGRATING, MIGRATE its keys in batches,
        then SETSLOT NODE on the target, the source and every other primary."""
        import redis  # noqa: PLC0415 (only the tests and the lab move slots)

        source = self.primary_of(slot)
        if source is target:
            return
        source_id, target_id = self.node_id(source), self.node_id(target)
        with (
            redis.Redis(host="127.0.0.1", port=source.port) as src,
            redis.Redis(host="127.0.0.1", port=target.port) as dst,
        ):
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10):
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for node in self.primaries():
            if node not in (source, target):
                node.call("cluster", "setslot", str(slot), "node", target_id)
        self.wait_ok()

    def procs(self) -> list[subprocess.Popen[bytes]]:
        """Every node's running process (to pin)."""
        return [proc for node in self.nodes for proc in node.procs()]

    def pids(self) -> tuple[int, ...]:
        """Every node's pid (to sample, summed)."""
        return tuple(proc.pid for proc in self.procs())

    def stop(self) -> None:
        """SIGTERM every node, and wait."""
        for node in self.nodes:
            node.stop()

    def kill(self) -> None:
        """SIGKILL every node."""
        for node in self.nodes:
            node.kill()
        self.frozen.clear()


def _slot_owners(cluster_slots: str) -> str:
    """``CLUSTER SLOTS`` output as redis-cli prints it, reduced to something comparable."""
    return " ".join(sorted(cluster_slots.split()))


# ---- the auth service ----------------------------------------------------------------

#: argon2 parameters that keep real hashes to milliseconds (tests); real use keeps the defaults
FAST_ARGON2 = {"ARGON2_TIME_COST": "1", "ARGON2_MEMORY_COST_KIB": "8192", "ARGON2_PARALLELISM": "1"}
_AUTH_PREFIXES = (
    "AUTH_",
    "JWT_",
    "ARGON2_",
    "HASH_",
    "LOGIN_",
    "REGISTER_",
    "TOKEN_",
    "TLS_",
    "REFRESH_",
)


class HttpReply:
    """A finished HTTP exchange: status, headers and the body (decoded as JSON when it is)."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"HttpReply({self.status}, {self.body[:200]!r})"


def http_request(
    method: str,
    url: str,
    payload: Any = None,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 30,
    context: ssl.SSLContext | None = None,
) -> HttpReply:
    """One HTTP request (``payload`` sent as JSON, or ``body`` as it is); any status returns.
    An https ``url`` is verified with ``context`` (None: the system's CAs)."""
    if payload is not None:
        body = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    if body is not None and "Content-Type" not in request.headers:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as resp:
            return HttpReply(
                resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
            )
    except urllib.error.HTTPError as exc:
        with exc:
            return HttpReply(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())


class AuthProcess(ServiceProcess):
    """``python -m auth_service`` as a subprocess on a free port; keys and users in ``workdir``.

    Its settings come from the keyword arguments (environment names, any case) over
    paths inside ``workdir``; the caller's own auth settings are not passed on.
    """

    module = "auth_service"

    def __init__(self, workdir: Path, *, ca_file: str | Path = "", **settings: Any) -> None:
        self.workdir = workdir
        self.ca_file = str(ca_file)
        self.port = free_port()
        keys = workdir / "keys"
        self.private_path = keys / "jwt_private.pem"
        self.public_path = keys / "jwt_public.pem"
        self.keyring_path = keys / "jwt_keyring.json"
        self.db_path = workdir / "auth.sqlite3"
        self.settings = {k.upper(): str(v) for k, v in settings.items()}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(_AUTH_PREFIXES)},
            "AUTH_HOST": "127.0.0.1",
            "AUTH_PORT": str(self.port),
            "AUTH_DB": str(self.db_path),
            "JWT_PRIVATE_KEY": str(self.private_path),
            "JWT_PUBLIC_KEY": str(self.public_path),
            "JWT_KEYRING": str(self.keyring_path),
            "PYTHONPATH": str(ROOT),
            **self.settings,
        }
        self.log_path = workdir / f"auth-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, path: str = "") -> str:
        """The service's URL for ``path``."""
        return self.http_url(path)

    def start(self, timeout_s: float = 30) -> AuthProcess:
        """Start and wait until /healthz answers."""
        self._start(timeout_s)
        return self

    def run(self, *args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``python -m auth_service ARGS`` to completion with the same settings."""
        return subprocess.run(
            [sys.executable, "-m", "auth_service", *args],
            check=False,
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def post(self, path: str, payload: Any = None, **kwargs: Any) -> HttpReply:
        """POST ``payload`` as JSON (or ``body=`` bytes) to ``path``."""
        kwargs.setdefault("context", self.client_ssl)
        return http_request("POST", self.url(path), payload, **kwargs)

    def get(self, path: str) -> HttpReply:
        """GET ``path``."""
        return http_request("GET", self.url(path), context=self.client_ssl)

    def register(self, username: str, password: str) -> HttpReply:
        """POST /register."""
        return self.post("/register", {"username": username, "password": password})

    def login(self, username: str, password: str) -> HttpReply:
        """POST /login."""
        return self.post("/login", {"username": username, "password": password})

    def token(self, username: str, password: str) -> str:
        """Log in (which must succeed) and return the access token."""
        reply = self.login(username, password)
        if reply.status != 200:
            raise RuntimeError(f"login of {username!r} failed: {reply!r}")
        return str(reply.json()["access_token"])

    def jwks(self) -> dict[str, Any]:
        """The JWK set."""
        return dict(self.get("/.well-known/jwks.json").json())
