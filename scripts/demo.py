"""A short scripted demo: start the chat server, let two users talk, print what they see.

So that it needs no auth service running, the demo mints its own tokens with a
throw-away Ed25519 key pair in a temporary directory, as the auth service does
(same claims, same ``kid`` rule; the server verifies them exactly as it verifies
the auth service's). Nothing is written in the project. ``make talk`` runs it; for
the benchmark lab's demo see ``make demo``.
Usage: ``python scripts/demo.py [--serializer orjson] [--loop uvloop]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chat_server.codecs import get_codec  # noqa: E402
from chat_server.messages import Ack, HistoryRequest, Join, Send  # noqa: E402
from chatlab.harness import KeyPair, ServerProcess  # noqa: E402


def _show(who: str, message: object) -> None:
    print(f"  {who:<6} <- {message}")


async def _talk(url: str, serializer: str, keys: KeyPair) -> None:
    codec = get_codec(serializer)
    text = not codec.binary

    async def open_as(user: str):
        conn = await connect(
            url,
            additional_headers={"Authorization": f"Bearer {keys.mint(user)}"},
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
        keys = KeyPair(Path(tmp))
        server = ServerProcess(Path(tmp), keys, serializer=args.serializer, event_loop=args.loop)
        print(f"demo: starting the chat server on 127.0.0.1:{server.port}")
        server.start()
        try:
            print("demo: " + server.log().strip().splitlines()[-1].split(": ", 1)[-1])
            asyncio.run(_talk(server.url, args.serializer, keys))
        finally:
            status = server.stop()
        print(f"demo: server stopped gracefully (exit {status}). Next: `make test`, `make bench`.")
        return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
