"""Shared fixtures: a key pair, token minting, and chat servers as real processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import KeyPair, ServerProcess


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
