"""Sockets that let go, on each transport: a slow consumer's kernel send buffer is bounded by
``SOCKET_SEND_BUFFER_BYTES``, and once dropped after ``CLOSE_TIMEOUT_S`` its socket is reset
and gone (``ss``), not left in FIN-WAIT-1 holding the bytes it could not send."""

from __future__ import annotations

import asyncio
import re
import subprocess

import pytest

from chat_server.messages import Send, Welcome
from tests.support import Client, KeyPair, ServerProcess, wait_until

pytestmark = pytest.mark.transports

SEND_BUFFER_BYTES = 32768


def _server_side(server: ServerProcess, client_port: int) -> str:
    """``ss`` lines (with socket memory) of the server's end of the client's connection."""
    result = subprocess.run(
        ["ss", "-tanmH", f"( sport = :{server.port} and dport = :{client_port} )"],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


async def test_a_dropped_slow_consumer_is_reset_and_its_socket_gone(start_server, keys: KeyPair):
    server = start_server(
        event_loop="asyncio",
        max_outbound_bytes=64 * 1024,
        socket_send_buffer_bytes=SEND_BUFFER_BYTES,
        rate_limit_per_s=100000,
        rate_limit_burst=100000,
        close_timeout_s=2,  # a wait: the socket is looked at at once, then until it is gone
    )
    stuck = await Client.connect(server, keys.mint("stuck"), max_queue=1)
    await stuck.expect(Welcome)
    await stuck.join("slow")
    stuck.conn.transport.pause_reading()  # type: ignore[union-attr]
    client_port = stuck.conn.transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
    talker = await Client.connect(server, keys.mint("talker"))
    await talker.expect(Welcome)
    await talker.join("slow")
    frames = [0]  # what the talker has read
    reading = asyncio.ensure_future(_read_all(talker, frames))  # the talker keeps up
    body = "x" * 3000

    async def given_up() -> bool:
        # ten messages at a time (30 kB, under the talker's own bound), each round read back
        # (its ack and its copy) before the next: on a loaded machine a talker that sent a
        # hundred at once fell behind its own copies and was the one closed with 1013
        wanted = frames[0] + 2 * 10
        for _ in range(10):
            await talker.send(Send(room="slow", body=body))
        await wait_until(lambda: frames[0] >= wanted, 10, "the talker read its own round")
        return server.stats()["slow_consumer_closes"] > 0

    await wait_until(given_up, 30, "the stuck reader closed with 1013")
    # closed with 1013 and waiting for its closing handshake: the kernel holds at most the
    # bounded send buffer for it (Linux doubles SO_SNDBUF)
    line = _server_side(server, client_port)
    assert line, "the connection is gone before CLOSE_TIMEOUT_S"
    send_buffer = int(re.search(r"tb(\d+)", line).group(1))  # type: ignore[union-attr]
    assert send_buffer <= 2 * SEND_BUFFER_BYTES, line
    # dropped after CLOSE_TIMEOUT_S with a reset: no FIN-WAIT-1 socket holding its bytes
    await wait_until(
        lambda: not _server_side(server, client_port),
        10,
        lambda: (
            f"the dropped connection's socket is still there:\n{_server_side(server, client_port)}"
        ),
    )
    reading.cancel()


async def _read_all(client: Client, frames: list[int]) -> None:
    while True:
        await client.conn.recv()
        frames[0] += 1
