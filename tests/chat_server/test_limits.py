"""Past the open-files limit the server answers 503 instead of vanishing, on each transport."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus

from chat_server.limits import OPEN_FILES_RESERVE, usable_connections
from chat_server.messages import Welcome
from tests.support import Client, KeyPair, ServerProcess

#: connections the limited server admits
ADMITTED = 4


class LimitedServer(ServerProcess):
    """A chat server started under ``prlimit --nofile=N:N`` (soft and hard limit N)."""

    def __init__(self, workdir: Path, keys: KeyPair, open_files: int, **settings: object) -> None:
        super().__init__(workdir, keys, **settings)
        self.open_files = open_files

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={self.open_files}:{self.open_files}", *super().command()]


def test_the_smaller_limit_rules():
    assert usable_connections(10_000, 4096).connections == 4096 - OPEN_FILES_RESERVE
    assert "open-files" in usable_connections(10_000, 4096).ruled_by
    assert usable_connections(100, 4096).connections == 100
    assert "MAX_CONNECTIONS" in usable_connections(100, 4096).ruled_by
    assert usable_connections(100, 10).connections == 1


@pytest.mark.transports
async def test_past_the_open_files_limit_handshakes_get_503(
    tmp_path: Path, keys: KeyPair, transport: str
):
    server = LimitedServer(
        tmp_path, keys, OPEN_FILES_RESERVE + ADMITTED, transport=transport, event_loop="asyncio"
    )
    server.start()
    try:
        assert "open-files limit" in server.log()  # the log says which limit rules
        clients = [await Client.connect(server, keys.mint(f"user{i}")) for i in range(ADMITTED)]
        for client in clients:
            await client.expect(Welcome)
        for i in range(20):
            with pytest.raises(InvalidStatus) as refused:
                await Client.connect(server, keys.mint(f"late{i}"))
            assert refused.value.response.status_code == 503
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/stats", timeout=5) as r:
            assert json.loads(r.read())["connections"] == ADMITTED
        await clients[0].close()
        for _ in range(100):  # the place freed goes to the next client
            try:
                again = await Client.connect(server, keys.mint("again"))
                break
            except InvalidStatus:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("a freed place was not given to a new connection")
        await again.expect(Welcome)
    finally:
        server.kill()
