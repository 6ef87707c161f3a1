"""Auth service fixtures: the service as a real process with fast (but real) argon2."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chatlab.harness import FAST_ARGON2, AuthProcess

#: what the tests run with unless they say otherwise: cheap hashes, no per-client limits
TEST_SETTINGS = {
    **FAST_ARGON2,
    "LOGIN_RATE_PER_CLIENT_PER_MIN": "0",
    "REGISTER_RATE_PER_CLIENT_PER_MIN": "0",
    "EVENT_LOOP": "asyncio",
}


@pytest.fixture
def start_auth(tmp_path: Path) -> Iterator[Callable[..., AuthProcess]]:
    """Start auth services, settings as keyword arguments over TEST_SETTINGS; stopped after."""
    started: list[AuthProcess] = []

    def start(workdir: Path | None = None, **settings: Any) -> AuthProcess:
        merged = {**TEST_SETTINGS, **{k.upper(): str(v) for k, v in settings.items()}}
        service = AuthProcess(workdir or tmp_path, **merged)
        started.append(service)
        return service.start()

    yield start
    for service in started:
        service.stop()


@pytest.fixture(scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthProcess]:
    """One auth service shared by a module's tests (they use distinct usernames)."""
    service = AuthProcess(
        tmp_path_factory.mktemp("auth"), **TEST_SETTINGS, TOKEN_TTL_S="600"
    ).start()
    yield service
    service.stop()


@pytest.fixture
def username() -> str:
    """A username no other test uses."""
    return f"user_{uuid.uuid4().hex[:10]}"
