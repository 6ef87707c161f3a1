"""Shared fixtures: a key pair, token minting, chat servers, Redis, a Redis Cluster and
PostgreSQL as real processes.

Chat servers start on the ``transport`` fixture's ``TRANSPORT``. Tests marked
``transports`` (the flows, bad input, resilience: whatever crosses the transport)
run once per transport; the others run on ``CHATLAB_TEST_TRANSPORT``
(default ``websockets``), so the whole suite can be run on picows too.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chat_server.settings import TRANSPORTS
from chatlab.postgres import PostgresProcess
from chatlab.throwaway_ca import ThrowawayCA, make_ca
from tests.support import KeyPair, RedisClusterProcesses, RedisProcess, ServerProcess

#: the transport of tests not marked ``transports``
DEFAULT_TRANSPORT = os.environ.get("CHATLAB_TEST_TRANSPORT", "websockets")


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``transports`` marker."""
    config.addinivalue_line(
        "markers", "transports: run once per TRANSPORT (servers from start_server use it)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``transport`` over every ``TRANSPORT`` for tests marked ``transports``."""
    if "transport" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "transports"
    ):
        metafunc.parametrize("transport", TRANSPORTS, indirect=True)


@pytest.fixture
def transport(request: pytest.FixtureRequest) -> str:
    """The ``TRANSPORT`` chat servers start on (each of them for tests marked ``transports``)."""
    return str(getattr(request, "param", DEFAULT_TRANSPORT))


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    """One Ed25519 key pair for the whole run; its public PEM is on disk."""
    return KeyPair(tmp_path_factory.mktemp("keys"))


@pytest.fixture
def start_server(
    tmp_path: Path, keys: KeyPair, transport: str
) -> Iterator[Callable[..., ServerProcess]]:
    """Start chat servers with settings given as keyword arguments; all are stopped after.

    ``TRANSPORT`` is the ``transport`` fixture's unless the settings name one.
    """
    started: list[ServerProcess] = []

    def start(workdir: Path | None = None, **settings: Any) -> ServerProcess:
        settings.setdefault("transport", transport)
        server = ServerProcess(workdir or tmp_path, keys, **settings)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def server(start_server: Callable[..., ServerProcess]) -> ServerProcess:
    """A chat server with the default settings (orjson) but the asyncio loop."""
    return start_server(event_loop="asyncio")


@pytest.fixture
def start_redis(tmp_path: Path) -> Iterator[Callable[..., RedisProcess]]:
    """Start private redis-servers (``appendonly=True`` to persist; ``port=`` to restart on
    the same one) with their files under ``tmp_path/redis``; all are killed after."""
    started: list[RedisProcess] = []
    workdir = tmp_path / "redis"
    workdir.mkdir(exist_ok=True)

    def start(appendonly: bool = False, port: int | None = None) -> RedisProcess:
        redis = RedisProcess(workdir, appendonly=appendonly, port=port)
        started.append(redis)
        return redis.start()

    yield start
    for redis in started:
        redis.kill()


@pytest.fixture
def redis_server(start_redis: Callable[..., RedisProcess]) -> RedisProcess:
    """A private redis-server on a free port, without persistence."""
    return start_redis()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresProcess]:
    """One PostgreSQL (Debian's) for the whole run, started when a test first asks for it."""
    server = PostgresProcess().start()
    yield server
    server.remove()


@pytest.fixture
def auth_db_url(postgres: PostgresProcess) -> str:
    """A fresh, empty database on the run's PostgreSQL: its URL, password included."""
    return postgres.create_database(f"test_{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    """A private Redis Cluster (three primaries, one replica each) for the whole module;
    killed after it. Tests that share it flush it first (:func:`fresh_cluster`)."""
    cluster = RedisClusterProcesses(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.kill()


@pytest.fixture
def fresh_cluster(redis_cluster: RedisClusterProcesses) -> RedisClusterProcesses:
    """The module's Redis Cluster, emptied (no history or presence of earlier tests)."""
    redis_cluster.wait_ok()
    redis_cluster.flush()
    return redis_cluster


@pytest.fixture(scope="session")
def ca(tmp_path_factory: pytest.TempPathFactory) -> ThrowawayCA:
    """A throwaway CA and a server certificate for 127.0.0.1 and localhost (TLS tests)."""
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="session")
def wrong_ca(tmp_path_factory: pytest.TempPathFactory) -> ThrowawayCA:
    """Another CA, which :func:`ca`'s server certificate does not chain to."""
    return make_ca(tmp_path_factory.mktemp("wrong-ca"), "another test CA")
