"""Past the open-files limit the server answers 503 instead of vanishing, on each transport
and each loop, also to a flood of connects that would otherwise exhaust its descriptors."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidMessage, InvalidStatus

from chat_server.limits import (
    SPARE_DESCRIPTORS,
    may_accept,
    open_files_reserve,
    open_files_wanted,
    usable_connections,
)
from chat_server.messages import Welcome
from tests.support import Client, KeyPair, ServerProcess, wait_until

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
    assert usable_connections(10_000, 4096).connections == 4096 - 512
    assert "open-files" in usable_connections(10_000, 4096).ruled_by
    assert usable_connections(100, 4096).connections == 100
    assert "MAX_CONNECTIONS" in usable_connections(100, 4096).ruled_by
    assert usable_connections(100, 10).connections == 1


def test_the_reserve_scales_with_the_limit():
    assert open_files_reserve(256) == 64  # the least: the process' own few and answers
    assert open_files_reserve(1024) == 128
    assert open_files_reserve(80_000) == 10_000  # an eighth
    for connections in (1, 4, 192, 1000, 10_000):
        wanted = open_files_wanted(connections)
        assert usable_connections(10**9, wanted).connections == connections
        assert usable_connections(10**9, wanted - 1).connections < connections or wanted == 65


def test_the_accept_loop_keeps_spare_descriptors():
    assert may_accept(256 - SPARE_DESCRIPTORS - 1, 256)
    assert not may_accept(256 - SPARE_DESCRIPTORS, 256)
    assert not may_accept(300, 256)


@pytest.mark.transports
async def test_past_the_open_files_limit_handshakes_get_503(
    tmp_path: Path, keys: KeyPair, transport: str
):
    server = LimitedServer(
        tmp_path, keys, open_files_wanted(ADMITTED), transport=transport, event_loop="asyncio"
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

        async def admitted() -> Client | None:  # the place freed goes to the next client
            try:
                return await Client.connect(server, keys.mint("again"))
            except InvalidStatus:
                return None

        again = await wait_until(admitted, 10, "a freed place given to a new connection")
        await again.expect(Welcome)
    finally:
        server.kill()


#: the flood: more connects at once than the server has descriptors
FLOOD_OPEN_FILES = 256
FLOOD_CONNECTS = 400
#: each connect has this long to be answered
ANSWER_WITHIN_S = 30


async def _upgrade(url: str, token: str) -> tuple[int | str, ClientConnection | None]:
    """A real websocket client's handshake: the status it got (101 holds the connection
    open), or what happened instead of an answer."""
    try:
        conn = await connect(
            url,
            additional_headers={"Authorization": f"Bearer {token}"},
            open_timeout=ANSWER_WITHIN_S,
            ping_interval=None,
            compression=None,
        )
    except InvalidStatus as refused:
        return refused.response.status_code, None
    except InvalidMessage as exc:  # EOFError: closed with no bytes at all
        return f"no HTTP answer ({exc.__cause__!r})", None
    except TimeoutError:
        return f"no answer within {ANSWER_WITHIN_S} s", None
    except OSError as exc:
        return f"connection failed: {exc!r}", None
    return 101, conn


async def _healthz(port: int) -> str:
    """``GET /healthz``'s status line, or what went wrong instead."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: chat\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    except (OSError, TimeoutError) as exc:
        return repr(exc)
    return answer.split(b"\r\n", 1)[0].decode("latin-1")


@pytest.mark.transports
@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_a_flood_of_connects_past_the_open_files_limit_gets_101_or_503(
    tmp_path: Path, keys: KeyPair, transport: str, event_loop: str
):
    server = LimitedServer(
        tmp_path, keys, FLOOD_OPEN_FILES, transport=transport, event_loop=event_loop
    )
    server.start()
    admitted = usable_connections(10_000, FLOOD_OPEN_FILES).connections
    tokens = [keys.mint(f"flood{i}") for i in range(FLOOD_CONNECTS)]
    health: list[str] = []
    flooding = True

    async def probe() -> None:
        while flooding or not health:
            health.append(await _healthz(server.port))
            await asyncio.sleep(0.1)  # a probe's pace through the flood

    prober = asyncio.create_task(probe())
    try:
        outcomes = await asyncio.gather(*(_upgrade(server.url, token) for token in tokens))
        flooding = False
        await prober
        answers = Counter(status for status, _ in outcomes)
        assert answers == {101: admitted, 503: FLOOD_CONNECTS - admitted}, answers
        assert set(health) == {"HTTP/1.1 200 OK"}, Counter(health)
        for _, conn in outcomes:
            if conn is not None:
                await conn.close()
        log = server.log()
        assert "Traceback" not in log, log[-3000:]
        assert "out of system resource" not in log
    finally:
        prober.cancel()
        server.kill()
