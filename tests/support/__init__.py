"""Test support: real websocket clients; keys and server processes come from chatlab.harness."""

from __future__ import annotations

import asyncio
import base64
import inspect
import os
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from bench.lab.target import RelayProcess
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
from chatlab.haproxy import HAProxyProcess
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
    "NO_LIMITS",
    "ROOT",
    "Client",
    "InProcessConnection",
    "KeyPair",
    "RedisClusterProcesses",
    "RedisProcess",
    "ServerProcess",
    "chromium_dom",
    "free_port",
    "masked_frame",
    "note_answer",
    "opens_chat",
    "raw_close_code",
    "raw_frame",
    "raw_upgrade",
    "running_relay",
    "say_acked",
    "served",
    "settled",
    "stored_history",
    "wait_until",
]


CHROMIUM = "/usr/bin/chromium"
#: chat server settings that take rate limits out of a test's way
NO_LIMITS = {"rate_limit_per_s": 100000, "rate_limit_burst": 100000}


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


async def wait_until(
    condition: Callable[[], Any | Awaitable[Any]],
    timeout_s: float = 30,
    what: str | Callable[[], Any] = "",
    interval_s: float = 0.05,
) -> Any:
    """Return ``condition()``'s first true value (a function or a coroutine function),
    polling; AssertionError naming ``what`` after ``timeout_s`` (a guard against hanging,
    not a timing assertion: give it room). ``what`` may be a function, called at the
    timeout for the state to show (a log, the values seen). A sync test runs it with
    ``asyncio.run``."""
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = condition()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return outcome
        if time.monotonic() > deadline:
            shown = what() if callable(what) else what
            raise AssertionError(f"not within {timeout_s:g} s: {shown or condition}")
        await asyncio.sleep(interval_s)


def note_answer(frame: Any, acked: dict[str, int], refused: dict[str, str]) -> None:
    """Record a send's answer by its ref: an ack's ``seq`` in ``acked``, an error's code in
    ``refused``; other frames are ignored."""
    if isinstance(frame, Ack):
        acked[frame.ref or ""] = frame.seq
    elif isinstance(frame, Error):
        refused[frame.ref or ""] = frame.code


class InProcessConnection:
    """One connection to a :class:`~chat_server.service.ChatService` run in the test's own
    process (no socket): what the service sends it lands decoded in ``frames``."""

    def __init__(self, service: Any, user: str, codec: str = "orjson") -> None:
        self.codec = get_codec(codec)
        self.frames: list[ServerMessage] = []
        self.closed: tuple[int, str] | None = None
        self.session = service.open(user, self._send, self._paced, self._close)
        self.service = service

    def _send(self, frame: bytes) -> None:
        self.frames.append(self.codec.decode_server(frame.decode()))

    async def _paced(self, frame: bytes) -> None:
        self._send(frame)

    def _close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def send(self, message: ClientMessage) -> None:
        """Hand the service one frame from this connection, as the transport would."""
        self.service.on_frame(self.session, self.codec.encode_client(message).decode())

    def of(self, kind: type) -> list[Any]:
        """The frames of ``kind`` received so far, in order."""
        return [frame for frame in self.frames if isinstance(frame, kind)]


async def settled(service: Any) -> None:
    """Let an in-process service's store commit what it holds and the loop run what the
    commit scheduled (its acks and deliveries)."""
    await service.store.flush()
    for _ in range(5):
        await asyncio.sleep(0)


class Client:
    """A real websocket client speaking the server's codec, with typed send and receive."""

    def __init__(self, conn: ClientConnection, serializer: str) -> None:
        self.conn = conn
        self.codec = get_codec(serializer)

    @classmethod
    async def connect(
        cls,
        server: ServerProcess | HAProxyProcess,
        token: str,
        serializer: str | None = None,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> Client:
        """Open a connection with the token in the Authorization header (and ``headers``;
        through a front door, which has no serializer of its own: orjson, the chat server's
        default, unless ``serializer`` names another)."""
        serializer = serializer or getattr(server, "serializer", "orjson")
        kwargs.setdefault("compression", None)
        if server.tls:
            kwargs.setdefault("ssl", server.client_ssl)
        conn = await connect(
            server.url,
            additional_headers={"Authorization": f"Bearer {token}", **(headers or {})},
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


async def say_acked(
    server: ServerProcess | HAProxyProcess, token: str, room: str, bodies: list[str]
) -> None:
    """The user of ``token`` joins ``room`` and says each of ``bodies``, each acked."""
    from chat_server.messages import Message, Presence, Welcome

    client = await Client.connect(server, token)
    await client.expect(Welcome)
    await client.join(room)
    for body in bodies:
        await client.say(room, body, ref=body)
        await client.expect(Ack, skip=(Message, Presence))
    await client.close()


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
    """``python -m bench.relay --transport TRANSPORT [--mode MODE]`` (the lab's launcher,
    :class:`bench.lab.target.RelayProcess`) on a free port, once /healthz answers (a relay
    that exits or never answers fails the test with its log); its websocket URL. Stopped
    after with SIGTERM, which it must exit 0 on."""
    with tempfile.TemporaryDirectory(prefix="relay-") as workdir:
        relay = RelayProcess(Path(workdir), transport=transport, deflate=deflate == "on", mode=mode)
        relay.start()
        try:
            yield relay.url
        finally:
            assert relay.stop() == 0, relay.log()


def masked_frame(payload: bytes, opcode: int, fin: bool = True, rsv1: bool = False) -> bytes:
    """One client frame (masked, as a client must) carrying ``payload``, as it goes on the
    wire; ``fin`` False leaves its message open, ``rsv1`` marks a compressed message."""
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        length = bytes([0x80 | size])
    elif size < 65536:
        length = bytes([0x80 | 126]) + struct.pack("!H", size)
    else:
        length = bytes([0x80 | 127]) + struct.pack("!Q", size)
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    key = (mask * (size // 4 + 1))[:size]
    masked = (int.from_bytes(payload) ^ int.from_bytes(key)).to_bytes(size)
    return bytes([first]) + length + mask + masked


async def raw_upgrade(
    server: ServerProcess,
    token: str,
    *,
    extensions: str | None = None,
    buffer_bytes: int | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A websocket opened on a raw socket, for a client that must misbehave: the 101 read,
    nothing after it. ``buffer_bytes`` bounds the socket's kernel buffers both ways
    (SO_RCVBUF, SO_SNDBUF, set before connecting); ``extensions`` is offered as
    ``Sec-WebSocket-Extensions``; ``headers`` are sent besides."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    codec = get_codec(server.serializer)
    request = (
        "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
        f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {codec.subprotocol}\r\n"
        + (f"Sec-WebSocket-Extensions: {extensions}\r\n" if extensions else "")
        + "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        + f"Authorization: Bearer {token}\r\n\r\n"
    )
    writer.write(request.encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


async def raw_frame(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    """The next server frame of a raw websocket: its opcode, its RSV1 bit (compressed) and
    its payload as sent."""
    first, second = await reader.readexactly(2)
    size = second & 0x7F
    if size == 126:
        (size,) = struct.unpack("!H", await reader.readexactly(2))
    elif size == 127:
        (size,) = struct.unpack("!Q", await reader.readexactly(8))
    return first & 0x0F, bool(first & 0x40), await reader.readexactly(size)


async def raw_close_code(reader: asyncio.StreamReader, timeout_s: float = 20) -> int | None:
    """Read a raw websocket's server frames until its close frame: that frame's code (None:
    a close without one, or the connection ended without a close frame)."""

    async def read() -> int | None:
        while True:
            try:
                opcode, _, payload = await raw_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return None
            if opcode == 0x8:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None

    return await asyncio.wait_for(read(), timeout_s)


#: how many sends the load shedder may refuse an honest client before it is not served
SHED_RETRIES = 5


async def served(
    server: ServerProcess, token: str, room: str = "honest", headers: dict[str, str] | None = None
) -> None:
    """An honest client is served in full: it connects (sending ``headers`` besides), joins
    ``room``, sends, and gets its message and its ack (AssertionError or a timeout
    otherwise). As the contract tells a client to, it sends again (the same ``ref``) a
    send the load shedder refused while the loop was behind (``OVERLOAD_LAG_MS``; on a
    shared test host, other processes can hold the loop that long), a few times at most;
    any other error fails it."""
    from chat_server.messages import Error, Message, Welcome
    from chat_server.overload import REFUSAL

    ref = f"honest-{os.urandom(4).hex()}"  # a new message each time, never a repeat
    client = await Client.connect(server, token, headers=headers)
    try:
        await client.expect(Welcome)
        await client.join(room)
        seen: list[Any] = []
        for _ in range(SHED_RETRIES):
            await client.say(room, "still served", ref=ref)
            seen = [await client.expect((Message, Ack, Error), skip=(object,))]
            if isinstance(seen[0], Error):
                if seen[0].detail != REFUSAL:
                    break  # not served: the assertion below says with what
                await asyncio.sleep(0.1)
                continue
            seen.append(await client.expect((Message, Ack), skip=(object,)))
            break
        kinds = {type(frame) for frame in seen}
        assert kinds == {Message, Ack}, seen
        assert all(frame.ref == ref for frame in seen), seen
    finally:
        await client.close()


async def closed_by_server(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the server sends on the non-blocking raw ``sock`` until it closes the
    connection (a reset counts as closed), within ``timeout_s``."""
    loop = asyncio.get_running_loop()
    received = b""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                chunk = await loop.sock_recv(sock, 4096)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk
