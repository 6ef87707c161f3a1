"""Auth service fixtures: the service as a real process with fast (but real) argon2.

Tests that depend on where users and keys live take ``store_env`` (or ``shared_auth``,
one service a module's tests share) and run twice: on SQLite and on PostgreSQL
(``AUTH_DB_URL``, a fresh database on the run's one PostgreSQL).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chatlab.harness import AuthProcess
from tests.support.auth import TEST_SETTINGS


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


@pytest.fixture
def start_replicas(
    start_auth: Callable[..., AuthProcess], tmp_path: Path
) -> Callable[..., list[AuthProcess]]:
    """Start ``count`` auth services with the same settings (one ``AUTH_DB_URL``: replicas),
    each in its own directory with its own key files; stopped after."""

    def start(count: int, **settings: Any) -> list[AuthProcess]:
        replicas = []
        for _ in range(count):
            workdir = tmp_path / f"replica-{uuid.uuid4().hex[:8]}"
            workdir.mkdir()
            replicas.append(start_auth(workdir, **settings))
        return replicas

    return start


#: where users and keys live: the default SQLite and key files, or PostgreSQL
STORES = ("sqlite", "postgresql")


def _store_env(request: pytest.FixtureRequest, store: str) -> dict[str, str]:
    if store == "sqlite":
        return {}
    postgres = request.getfixturevalue("postgres")
    return {"AUTH_DB_URL": postgres.create_database(f"test_{uuid.uuid4().hex[:12]}")}


@pytest.fixture(params=STORES)
def store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The settings of each store in turn: none (SQLite), then ``AUTH_DB_URL`` (PostgreSQL)."""
    return _store_env(request, request.param)


@pytest.fixture(scope="module", params=STORES)
def module_store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The settings of each store in turn, for the services a module's tests share: none
    (SQLite), then ``AUTH_DB_URL`` (a fresh PostgreSQL database for the module)."""
    return _store_env(request, request.param)


@pytest.fixture(scope="module", params=STORES)
def shared_auth(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AuthProcess]:
    """One auth service shared by a module's tests (they use distinct usernames), on each
    store in turn."""
    service = AuthProcess(
        tmp_path_factory.mktemp("auth"),
        **TEST_SETTINGS,
        TOKEN_TTL_S="600",
        **_store_env(request, request.param),
    ).start()
    yield service
    service.stop()


@pytest.fixture
def username() -> str:
    """A username no other test uses."""
    return f"user_{uuid.uuid4().hex[:10]}"
