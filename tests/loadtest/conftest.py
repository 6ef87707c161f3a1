"""Fixtures for the load test's tests: an auth service open to a crowd on one address,
and a relay (how Locust is run is in :mod:`tests.support.locust`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chatlab.harness import AuthProcess
from tests.support import running_relay
from tests.support.locust import LOAD_TEST_AUTH


@pytest.fixture
def load_test_auth(tmp_path: Path) -> Iterator[AuthProcess]:
    """A running auth service for a crowd of load-test users on one address (fast argon2,
    no per-client rate limits); stopped after."""
    workdir = tmp_path / "auth"
    workdir.mkdir()
    service = AuthProcess(workdir, **LOAD_TEST_AUTH).start()
    yield service
    service.stop()


@pytest.fixture
def relay_url() -> Iterator[str]:
    """A running ``python -m bench.relay`` on a free port; its websocket URL."""
    with running_relay("websockets") as url:
        yield url
