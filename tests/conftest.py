"""Shared fixtures: a key pair, token minting, chat servers and Redis as real processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import KeyPair, RedisProcess, ServerProcess


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    """One Ed25519 key pair for the whole run; its public PEM is on disk."""
    return KeyPair(tmp_path_factory.mktemp("keys"))


@pytest.fixture
def start_server(tmp_path: Path, keys: KeyPair) -> Iterator[Callable[..., ServerProcess]]:
    """Start chat servers with settings given as keyword arguments; all are stopped after."""
    started: list[ServerProcess] = []

    def start(workdir: Path | None = None, **settings: Any) -> ServerProcess:
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
