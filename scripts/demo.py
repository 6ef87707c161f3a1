"""A short scripted demo: start the chat server, let two users talk, print what they see.

Until the auth service and the lab land, the demo mints its own tokens with a
throw-away Ed25519 key pair in a temporary directory (the server verifies them
exactly as it will verify the auth service's). Nothing is written in the project.
Usage: ``python scripts/demo.py [--serializer orjson] [--loop uvloop]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chat_server.codecs import get_codec  # noqa: E402
from chat_server.messages import Ack, HistoryRequest, Join, Send  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _mint(key: ed25519.Ed25519PrivateKey, user: str) -> str:
    now = int(time.time())
    claims = {
        "sub": user,
        "iss": "chatlab-auth",
        "aud": "chatlab-chat",
        "iat": now,
        "exp": now + 300,
        "jti": uuid.uuid4().hex,
    }
    return jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": "demo"})


def _show(who: str, message: object) -> None:
    print(f"  {who:<6} <- {message}")


async def _talk(url: str, serializer: str, key: ed25519.Ed25519PrivateKey) -> None:
    codec = get_codec(serializer)
    text = not codec.binary

    async def open_as(user: str):
        conn = await connect(
            url,
            additional_headers={"Authorization": f"Bearer {_mint(key, user)}"},
            subprotocols=[codec.subprotocol],
            compression=None,
        )
        _show(user, codec.decode_server(await conn.recv()))
        return conn

    async def send(conn, message) -> None:
        await conn.send(codec.encode_client(message), text=text)

    async def read(conn, user: str, count: int) -> list[object]:
        seen = []
        for _ in range(count):
            message = codec.decode_server(await asyncio.wait_for(conn.recv(), 10))
            _show(user, message)
            seen.append(message)
        return seen

    alice = await open_as("alice")
    bob = await open_as("bob")
    await send(alice, Join(room="lobby"))
    await read(alice, "alice", 1)
    await send(bob, Join(room="lobby"))
    await read(bob, "bob", 1)
    await read(alice, "alice", 1)  # presence: bob joined
    lines = [("alice", "hi bob!"), ("bob", "hello alice, how is the lab?"), ("alice", "fast.")]
    for n, (user, body) in enumerate(lines, 1):
        conn = alice if user == "alice" else bob
        print(f"  {user:<6} -> send {body!r}")
        await send(conn, Send(room="lobby", body=body, ref=f"{user}-{n}"))
        # the sender sees its message and its ack, the other member the message
        sender_seen = await read(conn, user, 2)
        await read(bob if conn is alice else alice, "bob" if conn is alice else "alice", 1)
        assert any(isinstance(m, Ack) for m in sender_seen)
    print("  bob    -> history of lobby")
    await send(bob, HistoryRequest(room="lobby", limit=10))
    await read(bob, "bob", 1)
    await alice.close()
    await bob.close()


def main() -> int:
    """Run the demo; exit 0 when everything was seen as expected."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serializer", default="orjson", choices=["json", "orjson", "protobuf"])
    parser.add_argument("--loop", default="uvloop", choices=["asyncio", "uvloop"])
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="chatlab-demo-") as tmp:
        workdir = Path(tmp)
        key = ed25519.Ed25519PrivateKey.generate()
        public_pem = workdir / "jwt_public.pem"
        public_pem.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        port = _free_port()
        env = {
            **os.environ,
            "CHAT_PORT": str(port),
            "CHAT_DB": str(workdir / "chat.sqlite3"),
            "JWT_PUBLIC_KEY": str(public_pem),
            "SERIALIZER": args.serializer,
            "EVENT_LOOP": args.loop,
            "PYTHONPATH": str(ROOT),
        }
        print(
            f"demo: starting the chat server on 127.0.0.1:{port} ({args.serializer}, {args.loop})"
        )
        server = subprocess.Popen([sys.executable, "-m", "chat_server"], cwd=workdir, env=env)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        print("demo: the server did not start", file=sys.stderr)
                        return 1
                    time.sleep(0.1)
            asyncio.run(_talk(f"ws://127.0.0.1:{port}/ws", args.serializer, key))
        finally:
            server.send_signal(signal.SIGTERM)
            status = server.wait(30)
        print(f"demo: server stopped gracefully (exit {status}). Next: `make test`, `make bench`.")
        return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
