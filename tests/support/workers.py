"""Several chat server workers on one Redis: start them, land a client on a chosen
worker (each learns its worker from the handshake's ``X-Chatlab-Worker`` header), and
read everything a client receives in the background."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from websockets.exceptions import ConnectionClosed

from chat_server.messages import Ack, Error, Welcome
from chatlab.harness import KeyPair, RedisClusterProcesses, RedisProcess, ServerProcess
from tests.support import NO_LIMITS, Client, wait_until

__all__ = ["WORKER_HEADER", "Inbox", "connect_to", "start_workers", "worker_replaced"]

WORKER_HEADER = "X-Chatlab-Worker"


def start_workers(
    start_server: Callable[..., ServerProcess],
    redis: RedisProcess | RedisClusterProcesses,
    **settings: Any,
) -> ServerProcess:
    """WORKERS=2 on BROKER=redis (REDIS_CLUSTER=on on a cluster), without rate limits."""
    if isinstance(redis, RedisClusterProcesses):
        settings["redis_cluster"] = "on"
    return start_server(
        workers=2, broker="redis", redis_url=redis.url, event_loop="uvloop", **NO_LIMITS, **settings
    )


async def worker_replaced(server: ServerProcess, dead: int, timeout_s: float = 30) -> list[int]:
    """The two workers' pids once the supervisor started one in ``dead``'s seat."""

    def replaced() -> list[int] | None:
        pids = server.worker_pids()
        return pids if len(pids) == 2 and dead not in pids else None

    return await wait_until(replaced, timeout_s, server.log)


async def connect_to(
    server: ServerProcess,
    keys: KeyPair,
    user: str,
    *,
    on: int | None = None,
    not_on: int | None = None,
) -> tuple[Client, int]:
    """Connect (again and again) until the connection lands on the wanted worker; its pid."""
    for _ in range(300):
        client = await Client.connect(server, keys.mint(user))
        pid = int(client.conn.response.headers[WORKER_HEADER])
        if (on is None or pid == on) and (not_on is None or pid != not_on):
            await client.expect(Welcome)
            return client, pid
        await client.close()
        await asyncio.sleep(0.05)  # a restarted or starting worker may not accept yet
    raise AssertionError(f"no connection of {user} landed on the wanted worker")


class Inbox:
    """Everything a client receives, read in the background, with a way to wait for a state."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.frames: list[Any] = []
        self.closed = False
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                self.frames.append(await self.client.recv(timeout_s=3600))
                self._changed.set()
        except ConnectionClosed:
            self.closed = True
            self._changed.set()

    async def wait_for(self, condition: Callable[[], bool], timeout_s: float = 30) -> None:
        """Return once ``condition()`` holds, looking again at each frame received (no
        polling); AssertionError with the last frames after ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                while not condition():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"timed out; last frames: {self.frames[-5:]}") from None

    def of(self, kind: type) -> list[Any]:
        """The frames of one kind, in arrival order."""
        return [frame for frame in self.frames if isinstance(frame, kind)]

    def answers(self) -> dict[str, Any]:
        """Each ``ref``'s ack or error."""
        return {f.ref: f for f in self.frames if isinstance(f, (Ack, Error)) and f.ref}
