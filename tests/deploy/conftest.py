"""A real Prometheus (Debian's) scraping a chat server and an auth service under traffic.

One per test session: both services start, two clients chat and a user logs in
every few hundred milliseconds in a background thread, and ``prometheus`` runs
``deploy/prometheus``'s rule files against them with a 1 s scrape and evaluation
interval, its storage in a temp dir, on a free port.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chat_server.messages import Ack, Message, Presence, Welcome
from chatlab.harness import (
    FAST_ARGON2,
    ROOT,
    AuthProcess,
    KeyPair,
    ServerProcess,
    ServiceProcess,
    free_port,
)
from tests.support import Client

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
DEPLOY = ROOT / "deploy"
RULE_FILES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
PASSWORD = "correct horse"

needs_prometheus = pytest.mark.skipif(
    shutil.which(PROMETHEUS) is None or shutil.which(PROMTOOL) is None,
    reason=f"no {PROMETHEUS}: CI and the setup script install Debian's prometheus",
)


def recording_rules() -> list[str]:
    """The name of every recording rule in deploy/prometheus/rules, in file order."""
    return [
        name
        for path in RULE_FILES
        for name in re.findall(r"^\s*- record:\s*(\S+)", path.read_text(), re.M)
    ]


class PrometheusProcess(ServiceProcess):
    """``prometheus`` with the deploy rule files, scraping ``targets`` every second."""

    module = ""

    def __init__(self, workdir: Path, targets: dict[str, str]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.env = {"PATH": "/usr/bin:/bin"}
        self.log_path = workdir / "prometheus.log"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in RULE_FILES],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in targets.items()
            ],
        }
        self.config_path = workdir / "prometheus.yml"  # JSON is YAML
        self.config_path.write_text(json.dumps(config, indent=2))

    def command(self) -> list[str]:
        return [
            PROMETHEUS,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]

    def ready(self) -> bool:
        with suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)
            return True
        return False

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data`` (the call must succeed)."""
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            answer = json.loads(reply.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        return list(self.api("query", query=expr)["result"])


@dataclass
class Observed:
    """The services under traffic and the Prometheus scraping them."""

    prometheus: PrometheusProcess
    chat: ServerProcess
    auth: AuthProcess
    metrics_port: int
    #: what stopped the traffic, if anything did
    traffic_failures: list[BaseException]


def _traffic(
    chat: ServerProcess, auth: AuthProcess, stop: threading.Event, failures: list[BaseException]
) -> None:
    """Two users chat in one room, and one logs in again now and then, until ``stop``;
    what stopped it early is put in ``failures``."""

    async def run() -> None:
        for name in ("alice", "bob"):
            auth.register(name, PASSWORD)
        alice = await Client.connect(chat, auth.token("alice", PASSWORD))
        bob = await Client.connect(chat, auth.token("bob", PASSWORD))
        await alice.expect(Welcome)
        await bob.expect(Welcome)
        await alice.join("room")
        await bob.join("room")
        n = 0
        while not stop.is_set():
            n += 1
            await alice.say("room", f"hello {n}", ref=f"r{n}")
            await alice.expect(Ack, skip=(Message, Presence))
            await bob.expect(Message, skip=(Presence,))
            if n % 10 == 0:
                await asyncio.to_thread(auth.token, "bob", PASSWORD)
            await asyncio.sleep(0.05)
        await alice.close()
        await bob.close()

    try:
        asyncio.run(run())
    except BaseException as exc:
        failures.append(exc)


@pytest.fixture(scope="session")
def observed(tmp_path_factory: pytest.TempPathFactory, keys: KeyPair) -> Iterator[Observed]:
    """Chat server + auth service under a little traffic, and Prometheus scraping both."""
    workdir = tmp_path_factory.mktemp("observed")
    for name in ("auth", "chat", "prometheus"):
        (workdir / name).mkdir()
    auth = AuthProcess(
        workdir / "auth",
        **FAST_ARGON2,
        LOGIN_RATE_PER_CLIENT_PER_MIN="0",
        REGISTER_RATE_PER_CLIENT_PER_MIN="0",
        LOGIN_RATE_PER_USER_PER_MIN="0",
        LOGIN_RATE_PER_USER_CLIENT_PER_MIN="0",
        EVENT_LOOP="asyncio",
    )
    metrics_port = free_port()
    chat = ServerProcess(
        workdir / "chat",
        keys,
        event_loop="asyncio",
        metrics_port=metrics_port,
        jwt_public_key=str(auth.public_path),
    )
    prometheus = PrometheusProcess(
        workdir / "prometheus",
        {"chat": f"127.0.0.1:{metrics_port}", "auth": f"127.0.0.1:{auth.port}"},
    )
    stop = threading.Event()
    failures: list[BaseException] = []
    traffic = threading.Thread(target=_traffic, args=(chat, auth, stop, failures), daemon=True)
    try:
        auth.start()
        chat.start()
        traffic.start()
        prometheus._start(30)
        yield Observed(prometheus, chat, auth, metrics_port, failures)
    finally:
        stop.set()
        traffic.join(10)
        prometheus.stop()
        chat.kill()
        auth.kill()
