"""The test harness' own promises, where a test run depends on them: a Redis it starts on
ports it chose itself gets up even when one of them was taken in the meantime."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from chatlab.harness import RedisProcess, free_port


def _hold(port: int) -> socket.socket:
    """Listen on ``port`` (as another process that took it would)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "cluster-node"])
def test_a_port_taken_after_it_was_chosen_is_chosen_again(tmp_path: Path, cluster: bool):
    redis = RedisProcess(tmp_path, cluster_port=free_port() if cluster else None)
    chosen = redis.port
    with _hold(chosen):
        redis.start()
        try:
            assert redis.port != chosen
            assert redis.call("ping").strip() == "PONG"
        finally:
            redis.stop()


def test_a_port_given_is_kept_and_its_being_taken_is_an_error(tmp_path: Path):
    with _hold(0) as held:
        port = held.getsockname()[1]
        redis = RedisProcess(tmp_path, port=port)
        with pytest.raises(RuntimeError, match="Address already in use"):
            redis.start()
        assert redis.port == port
