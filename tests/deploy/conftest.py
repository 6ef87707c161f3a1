"""A real Prometheus (Debian's) scraping a chat server and an auth service under traffic.

One per test session: both services start, two clients chat and a user logs in
every few hundred milliseconds in a background thread, and ``prometheus`` runs
``deploy/prometheus``'s rule files against them with a 1 s scrape and evaluation
interval, its storage in a temp dir, on a free port.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from chat_server.messages import Ack, Message, Presence, Welcome
from chatlab.harness import (
    FAST_ARGON2,
    AuthProcess,
    KeyPair,
    ServerProcess,
    free_port,
)
from tests.support import Client
from tests.support.prometheus import (
    PASSWORD,
    Observed,
    PrometheusProcess,
)


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
            await asyncio.sleep(0.05)  # the traffic's pace
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
