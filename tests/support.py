"""Test support: real websocket clients; keys and server processes come from chatlab.harness."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from chat_server.codecs import get_codec
from chat_server.messages import (
    Ack,
    ClientMessage,
    Error,
    HistoryRequest,
    Join,
    Leave,
    Send,
    ServerMessage,
)
from chatlab.harness import (
    AUDIENCE,
    ISSUER,
    ROOT,
    KeyPair,
    RedisClusterProcesses,
    RedisProcess,
    ServerProcess,
    free_port,
)

__all__ = [
    "AUDIENCE",
    "CHROMIUM",
    "ISSUER",
    "ROOT",
    "Client",
    "KeyPair",
    "RedisClusterProcesses",
    "RedisProcess",
    "ServerProcess",
    "chromium_dom",
    "free_port",
    "note_answer",
    "opens_chat",
    "running_relay",
    "stored_history",
    "wait_until",
]


CHROMIUM = "/usr/bin/chromium"


def chromium_dom(page: Path, profile: Path, width: int = 1280) -> str:
    """The DOM of a local HTML file after headless Chromium loaded it (Debian's chromium,
    a window ``width`` px wide, 5 s of virtual time for its scripts); AssertionError with
    Chromium's stderr if it failed."""
    dom = subprocess.run(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            f"--window-size={width},900",
            f"--user-data-dir={profile}",
            "--dump-dom",
            "--virtual-time-budget=5000",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


def note_answer(frame: Any, acked: dict[str, int], refused: dict[str, str]) -> None:
    """Record a send's answer by its ref: an ack's ``seq`` in ``acked``, an error's code in
    ``refused``; other frames are ignored."""
    if isinstance(frame, Ack):
        acked[frame.ref or ""] = frame.seq
    elif isinstance(frame, Error):
        refused[frame.ref or ""] = frame.code


class Client:
    """A real websocket client speaking the server's codec, with typed send and receive."""

    def __init__(self, conn: ClientConnection, serializer: str) -> None:
        self.conn = conn
        self.codec = get_codec(serializer)

    @classmethod
    async def connect(
        cls,
        server: ServerProcess,
        token: str,
        serializer: str | None = None,
        **kwargs: Any,
    ) -> Client:
        """Open a connection with the token in the Authorization header."""
        serializer = serializer or server.serializer
        kwargs.setdefault("compression", None)
        conn = await connect(
            server.url,
            additional_headers={"Authorization": f"Bearer {token}"},
            subprotocols=[get_codec(serializer).subprotocol],
            open_timeout=10,
            **kwargs,
        )
        return cls(conn, serializer)

    async def send(self, message: ClientMessage) -> None:
        """Send one typed message as a frame of the right type."""
        frame = self.codec.encode_client(message)
        await self.conn.send(frame, text=not self.codec.binary)

    async def send_raw(self, frame: bytes | str) -> None:
        """Send any frame, as it is (str: text frame, bytes: binary frame)."""
        await self.conn.send(frame)

    async def recv(self, timeout_s: float = 10) -> ServerMessage:
        """The next frame, decoded."""
        frame = await asyncio.wait_for(self.conn.recv(), timeout_s)
        return self.codec.decode_server(frame)

    async def expect(self, kind: type, timeout_s: float = 10, skip: tuple[type, ...] = ()) -> Any:
        """The next frame, which must be a ``kind``; frames of ``skip`` types are passed over."""
        while True:
            message = await self.recv(timeout_s)
            if isinstance(message, skip) and not isinstance(message, kind):
                continue
            assert isinstance(message, kind), f"expected {kind.__name__}, got {message!r}"
            return message

    async def join(self, room: str, since: int | None = None) -> Any:
        """Join and return the ``joined`` reply."""
        from chat_server.messages import Joined

        await self.send(Join(room=room, since=since))
        return await self.expect(Joined)

    async def say(self, room: str, body: str, ref: str | None = None) -> None:
        """Send a chat message (no wait)."""
        await self.send(Send(room=room, body=body, ref=ref))

    async def leave(self, room: str) -> None:
        """Leave a room."""
        await self.send(Leave(room=room))

    async def history(self, room: str, before: int | None = None, limit: int | None = None) -> Any:
        """Ask for a history page and return the reply."""
        from chat_server.messages import History

        await self.send(HistoryRequest(room=room, before=before, limit=limit))
        return await self.expect(History)

    async def close(self) -> None:
        """Close normally."""
        await self.conn.close()


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]], timeout_s: float = 10, what: str = ""
) -> None:
    """Return once ``condition()`` (a function or a coroutine function) is true; fail the
    test naming ``what`` if it is still false after ``timeout_s``. Polls every 0.1 s."""
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = condition()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what or condition}")
        await asyncio.sleep(0.1)


async def opens_chat(server: ServerProcess, token: str) -> bool:
    """True when ``token`` opens a chat connection (to its welcome); False when refused with 401."""
    from websockets.exceptions import InvalidStatus

    from chat_server.messages import Welcome

    try:
        client = await Client.connect(server, token)
    except InvalidStatus as refused:
        assert refused.response.status_code == 401, refused.response
        return False
    await client.expect(Welcome)
    await client.close()
    return True


async def stored_history(server: ServerProcess, token: str, room: str) -> list[Any]:
    """The room's whole stored history (``message`` frames, ascending), paged with ``before``."""
    from chat_server.messages import Welcome

    reader = await Client.connect(server, token)
    await reader.expect(Welcome)
    messages: list[Any] = []
    before = None
    while True:
        page = await reader.history(room, before=before, limit=500)
        if not page.messages:
            break
        messages[:0] = page.messages
        before = page.messages[0].seq
    await reader.close()
    return messages


@contextmanager
def running_relay(transport: str, deflate: str = "off", mode: str | None = None) -> Iterator[str]:
    """``python -m bench.relay --transport TRANSPORT [--mode MODE]`` on a free port, once
    /healthz answers; its websocket URL. Stopped (SIGTERM, which it must exit 0 on) after."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "bench.relay", "--port", str(port)),
            *("--transport", transport, "--deflate", deflate, "--log-level", "warning"),
            *(("--mode", mode) if mode else ()),
        ],
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    assert r.status == 200
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "no relay"
                time.sleep(0.05)
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
