"""Bytes on the wire per delivered message, for each ``WS_DEFLATE`` (off, on, shared).

Method: start ``python -m chat_server`` (orjson, uvloop) with each ``WS_DEFLATE``, open
``--rooms`` rooms of 10 connections from this process, each offering permessage-deflate
as browsers do (websockets' client: ``permessage-deflate; client_max_window_bits``), and
have every member send ``--messages`` messages in turn, for each body set:

- ``demo``: the lab driver's bodies (``~ts=`` and the 19 digits of a send time: what the
  demo's ladder sends);
- ``chat``: 20 to 80 characters of words, as people type them;
- ``long``: 400 to 1,000 characters of words.

Every member reads every message; each ``message`` frame's size as it came off the wire
(the websocket header and the payload as sent: compressed where the extension is on,
read before the client inflates it) is summed over all deliveries. With ``on`` a
connection's compressor remembers what it sent before (context takeover), so its frames
shrink as a conversation goes on; with ``shared`` each message is compressed alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect
from websockets.extensions import ClientExtensionFactory, Extension
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
from websockets.frames import CTRL_OPCODES, Frame
from websockets.typing import ExtensionParameter

from bench.lab.driver.frames import DIGITS, MARKER, header_bytes
from chat_server.codecs import get_codec
from chat_server.codecs.base import Codec
from chat_server.messages import Join, Joined, Message, Send
from chatlab.harness import KeyPair, ServerProcess

DEFLATE_MODES = ("off", "on", "shared")
BODY_SETS = ("demo", "chat", "long")
ROOM_SIZE = 10
#: words the chat and long bodies are made of (seeded: every mode gets the same bodies)
_WORD_TEXT = (
    "the a to and of in is it you that for on was with he as have be at one are this but "
    "what by from they we say her she or an will my all would there their so up out if "
    "about who get which go me when make can like time no just him know take people into "
    "year your good some could them see other than then now look only come its over think "
    "also back after use two how our work first well way even new want because any these "
    "give day most us meeting tomorrow lunch deploy server message room latency queue"
)
WORDS = _WORD_TEXT.split()


def bodies(kind: str, count: int, seed: int) -> list[str]:
    """``count`` message bodies of a body set."""
    rng = random.Random(seed)
    if kind == "demo":
        return [
            MARKER.decode() + str(rng.randrange(10**18, 10**19)).zfill(DIGITS) for _ in range(count)
        ]
    low, high = (20, 80) if kind == "chat" else (400, 1000)
    out = []
    for _ in range(count):
        target, words = rng.randint(low, high), []
        while sum(len(w) + 1 for w in words) < target:
            words.append(rng.choice(WORDS))
        out.append(" ".join(words)[:target])
    return out


class WireSizes(ClientExtensionFactory):
    """websockets' client permessage-deflate, with each data frame's size off the wire kept."""

    name = ClientPerMessageDeflateFactory.name

    def __init__(self, sizes: list[tuple[int, bytes]]) -> None:
        self._inner = ClientPerMessageDeflateFactory(compress_settings={"memLevel": 5})
        self._sizes = sizes

    def get_request_params(self) -> Sequence[ExtensionParameter]:
        return self._inner.get_request_params()

    def process_response_params(
        self, params: Sequence[ExtensionParameter], accepted_extensions: Sequence[Extension]
    ) -> Extension:
        inner = self._inner.process_response_params(params, accepted_extensions)
        return _Sized(inner, self._sizes)


class _Sized(Extension):
    name = ClientPerMessageDeflateFactory.name

    def __init__(self, inner: Extension, sizes: list[tuple[int, bytes]]) -> None:
        self.inner, self.sizes = inner, sizes

    def decode(self, frame: Frame, *, max_size: int | None = None) -> Frame:
        decoded = self.inner.decode(frame, max_size=max_size)
        if frame.opcode not in CTRL_OPCODES:
            self.sizes.append((header_bytes(len(frame.data)) + len(frame.data), decoded.data))
        return decoded

    def encode(self, frame: Frame) -> Frame:
        return self.inner.encode(frame)


async def _read(conn: ClientConnection, decode: Callable, count: int) -> list[int]:
    """Read until ``count`` messages came; each one's payload size as the codec encoded it."""
    sizes: list[int] = []
    while len(sizes) < count:
        frame = await asyncio.wait_for(conn.recv(), 30)
        if isinstance(decode(frame), Message):
            sizes.append(len(frame.encode() if isinstance(frame, str) else frame))
    return sizes


def _payload(codec: Codec, data: bytes) -> bytes | str:
    """An inflated frame's payload as ``codec`` decodes it (JSON codecs take ``str``)."""
    return bytes(data) if codec.binary else bytes(data).decode()


async def measure(
    deflate: str,
    rooms: int,
    messages: int,
    workdir: Path,
    *,
    settings: dict[str, str] | None = None,
) -> list[dict]:
    """Bytes per delivered message for each body set, against ``WS_DEFLATE=deflate``
    (``settings``, ``.env`` names, go to the server over it: the lab measures a
    configuration with its own toggles)."""
    keys = KeyPair(workdir)
    server = ServerProcess(
        workdir,
        keys,
        event_loop="uvloop",
        log_level="warning",
        **(settings or {}),
        ws_deflate=deflate,
    )
    server.start()
    codec = get_codec(server.serializer)
    text = not codec.binary
    rows = []
    try:
        members: list[tuple[ClientConnection, list[tuple[int, bytes]]]] = []
        for i in range(rooms * ROOM_SIZE):
            off_wire: list[tuple[int, bytes]] = []
            conn = await connect(
                server.url,
                additional_headers={"Authorization": f"Bearer {keys.mint(f'wire{i}')}"},
                compression=None,
                extensions=[WireSizes(off_wire)],
                ping_interval=None,
                max_queue=None,
            )
            await conn.recv()  # welcome
            await conn.send(codec.encode_client(Join(room=f"wire-{i // ROOM_SIZE}")), text=text)
            while not isinstance(codec.decode_server(await conn.recv()), Joined):
                pass
            members.append((conn, off_wire))
        negotiated = members[0][0].response.headers.get("Sec-WebSocket-Extensions") or ""
        for seed, kind in enumerate(BODY_SETS):
            for _, wire_sizes in members:
                wire_sizes.clear()
            texts = bodies(kind, messages * ROOM_SIZE, seed)
            readers = [
                asyncio.create_task(_read(c, codec.decode_server, len(texts))) for c, _ in members
            ]
            for n, body in enumerate(texts):  # members take turns, in every room
                for room in range(rooms):
                    conn = members[room * ROOM_SIZE + n % ROOM_SIZE][0]
                    await conn.send(
                        codec.encode_client(Send(room=f"wire-{room}", body=body)), text=text
                    )
                await asyncio.sleep(0.001)
            plain = [size for sizes in await asyncio.gather(*readers) for size in sizes]
            if negotiated:  # as they came off the wire, compressed
                wire = [
                    size
                    for _, wire_sizes in members
                    for size, data in wire_sizes
                    if isinstance(codec.decode_server(_payload(codec, data)), Message)
                ]
            else:
                wire = [header_bytes(size) + size for size in plain]
            assert len(wire) == len(plain) == len(texts) * len(members), (len(wire), len(plain))
            rows.append(
                {
                    "deflate": deflate,
                    "bodies": kind,
                    "negotiated": negotiated,
                    "body_chars_mean": round(sum(map(len, texts)) / len(texts), 1),
                    "delivered": len(wire),
                    "plain_bytes_per_delivery": sum(header_bytes(p) + p for p in plain)
                    / len(plain),
                    "wire_bytes_per_delivery": sum(wire) / len(wire),
                }
            )
        for conn, _ in members:
            await conn.close()
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    """Measure each ``WS_DEFLATE`` and print a table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.wire", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rooms", type=int, default=2, help="rooms of 10 connections [2]")
    parser.add_argument(
        "--messages", type=int, default=20, help="messages each member sends per body set [20]"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    for deflate in DEFLATE_MODES:
        with tempfile.TemporaryDirectory(prefix="chatlab-wire-") as tmp:
            print(f"measuring WS_DEFLATE={deflate} ...", file=sys.stderr)
            rows += asyncio.run(measure(deflate, args.rooms, args.messages, Path(tmp)))
    print(
        f"bytes on the wire per delivered message ({args.rooms} rooms of {ROOM_SIZE}, "
        f"{args.messages * ROOM_SIZE} messages per room and body set, orjson)"
    )
    print(f"{'bodies':<7}{'chars':>7}{'WS_DEFLATE':>12}{'bytes':>9}{'of off':>9}")
    off = {r["bodies"]: r["wire_bytes_per_delivery"] for r in rows if r["deflate"] == "off"}
    for kind in BODY_SETS:
        for r in (r for r in rows if r["bodies"] == kind):
            share = r["wire_bytes_per_delivery"] / off[kind]
            print(
                f"{kind:<7}{r['body_chars_mean']:>7.0f}{r['deflate']:>12}"
                f"{r['wire_bytes_per_delivery']:>9.1f}{share:>8.0%}"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
