"""Test support: a real chat server process, real websocket clients, real keys and tokens."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from websockets.asyncio.client import ClientConnection, connect

from chat_server.codecs import get_codec
from chat_server.messages import (
    ClientMessage,
    HistoryRequest,
    Join,
    Leave,
    Send,
    ServerMessage,
)

ROOT = Path(__file__).resolve().parent.parent
ISSUER = "chatlab-auth"
AUDIENCE = "chatlab-chat"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class KeyPair:
    """An Ed25519 key pair on disk (public PEM) that mints tokens like the auth service."""

    def __init__(self, directory: Path) -> None:
        self.private_key = ed25519.Ed25519PrivateKey.generate()
        self.public_path = directory / "jwt_public.pem"
        self.public_path.write_bytes(
            self.private_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def mint(self, sub: str | None, ttl_s: float = 600, **claims: Any) -> str:
        """A signed EdDSA token for ``sub``; ``claims`` override or add claims (None drops one)."""
        now = int(time.time())
        payload: dict[str, Any] = {
            "sub": sub,
            "iss": ISSUER,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + int(ttl_s),
            "jti": uuid.uuid4().hex,
        }
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, self.private_key, algorithm="EdDSA", headers={"kid": "test"})


class ServerProcess:
    """``python -m chat_server`` as a subprocess on a free port, in its own working directory."""

    def __init__(self, workdir: Path, keys: KeyPair, **settings: Any) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.settings = {k.upper(): str(v) for k, v in settings.items()}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("CHAT_", "JWT_"))},
            "CHAT_HOST": "127.0.0.1",
            "CHAT_PORT": str(self.port),
            "CHAT_DB": str(workdir / "chat.sqlite3"),
            "JWT_PUBLIC_KEY": str(keys.public_path),
            "PING_INTERVAL_S": "20",
            "CLOSE_TIMEOUT_S": "2",
            "PYTHONPATH": str(ROOT),
            **self.settings,
        }
        self.log_path = workdir / f"server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.serializer = self.env.get("SERIALIZER", "orjson")

    @property
    def url(self) -> str:
        """The websocket URL."""
        return f"ws://127.0.0.1:{self.port}/ws"

    def start(self, timeout_s: float = 20) -> ServerProcess:
        """Start and wait until /healthz answers."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chat_server"],
            cwd=self.workdir,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log()}")
            with suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1)
                return self
            time.sleep(0.05)
        raise RuntimeError(f"server did not answer /healthz:\n{self.log()}")

    def log(self) -> str:
        """Everything the server printed."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stats(self) -> dict[str, Any]:
        """The server's /stats counters."""
        import json

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=5) as resp:
            return json.loads(resp.read())

    def signal(self, sig: int) -> None:
        """Send a signal to the server."""
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 20) -> int:
        """Wait for the server to exit; its status."""
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL, and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int | None:
        """SIGTERM and wait (SIGKILL if it hangs); the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
            raise


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
