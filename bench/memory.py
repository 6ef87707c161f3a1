"""Memory per connection: the chat server's RSS delta over N connections, for each
``WS_DEFLATE`` (off, on, shared), idle and after traffic.

Method: start ``python -m chat_server`` (uvloop, orjson unless told otherwise), open a
few connections to warm up, read the server's RSS (psutil), open ``--connections`` more
from this process (each one authenticated and past its ``welcome``), wait for the RSS to
settle, read it again. The difference divided by the number of connections is the
server's cost per connection: websockets' protocol and buffers, our session, and with
``on`` the zlib compressor and inflater each connection keeps (window 2^12, memLevel 5);
``shared`` keeps none per connection. The client offers permessage-deflate in every
run, so only the server's ``WS_DEFLATE`` differs.

``idle``: the connections are in no room and have sent nothing. ``after traffic``: the
same connections then join rooms of 10, each sends one message and receives its room's
ten (acks and presence too) before the RSS is read, so what a connection keeps once it
has talked (buffers grown, a compressor's window filled) counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil
from websockets.asyncio.client import ClientConnection, connect

from chat_server.codecs import get_codec
from chat_server.codecs.base import Codec
from chat_server.messages import Ack, Join, Joined, Message, Send
from chatlab.harness import KeyPair, ServerProcess

DEFLATE_MODES = ("off", "on", "shared")
TRAFFIC_MODES = ("idle", "after")
#: members per room in the after-traffic mode: each connection receives this many messages
ROOM_SIZE = 10
#: connections opened or driven at once
BATCH = 100


async def _open(url: str, token: str, count: int) -> list[ClientConnection]:
    conns = []
    for start in range(0, count, BATCH):
        batch = await asyncio.gather(
            *(
                connect(
                    url,
                    additional_headers={"Authorization": f"Bearer {token}"},
                    compression="deflate",
                    open_timeout=30,
                    ping_interval=None,
                    max_queue=None,
                )
                for _ in range(min(BATCH, count - start))
            )
        )
        for conn in batch:
            await conn.recv()  # welcome
        conns.extend(batch)
    return conns


async def _until(conn: ClientConnection, codec: Codec, done: dict[type, int]) -> None:
    """Read until ``conn`` has received ``done[kind]`` frames of each kind."""
    seen = dict.fromkeys(done, 0)
    while any(seen[kind] < count for kind, count in done.items()):
        kind = type(codec.decode_server(await asyncio.wait_for(conn.recv(), 60)))
        if kind in seen:
            seen[kind] += 1


async def _talk(conns: list[ClientConnection], codec: Codec) -> None:
    """Rooms of :data:`ROOM_SIZE`: every connection joins, sends one message and
    receives its room's (joins first, so that nobody misses a message)."""
    text = not codec.binary
    for start in range(0, len(conns), BATCH):
        batch = list(enumerate(conns))[start : start + BATCH]
        for i, conn in batch:
            await conn.send(codec.encode_client(Join(room=f"mem-{i // ROOM_SIZE}")), text=text)
        await asyncio.gather(*(_until(conn, codec, {Joined: 1}) for _, conn in batch))
    sends = [
        codec.encode_client(Send(room=f"mem-{i // ROOM_SIZE}", body=f"hello from {i}"))
        for i in range(len(conns))
    ]
    for conn, frame in zip(conns, sends, strict=True):
        await conn.send(frame, text=text)
    await asyncio.gather(*(_until(conn, codec, {Message: ROOM_SIZE, Ack: 1}) for conn in conns))


def _settled_rss(proc: psutil.Process, settle_s: float = 1.0) -> int:
    time.sleep(settle_s)
    return int(proc.memory_info().rss)


async def measure(
    deflate: str,
    traffic: str,
    connections: int,
    serializer: str,
    workdir: Path,
    *,
    settings: dict[str, str] | None = None,
) -> dict:
    """Start a server with ``WS_DEFLATE=deflate``; RSS before and after ``connections``
    connections (``traffic`` ``after``: once they have talked), and bytes per connection.

    ``settings`` (``.env`` names) go to the server over these: the lab measures a
    configuration with its own toggles (transport, event loop ...)."""
    if traffic == "after" and connections % ROOM_SIZE:
        raise ValueError(f"after traffic: --connections must be a multiple of {ROOM_SIZE}")
    keys = KeyPair(workdir)
    server = ServerProcess(
        workdir,
        keys,
        serializer=serializer,
        event_loop="uvloop",
        ws_deflate=deflate,
        log_level="warning",
        **(settings or {}),
        max_connections=connections + 100,
        store_queue_max=connections + 100,  # every connection's send may wait at once
    )
    server.start()
    codec = get_codec(server.serializer)
    try:
        assert server.proc is not None
        proc = psutil.Process(server.proc.pid)
        token = keys.mint("member")
        warm = await _open(server.url, token, 20)
        before = _settled_rss(proc)
        conns = await _open(server.url, token, connections)
        if traffic == "after":
            await _talk(conns, codec)
        after = _settled_rss(proc)
        for conn in conns + warm:
            await conn.close()
    finally:
        server.stop()
    return {
        "deflate": deflate,
        "transport": server.env.get("TRANSPORT", "websockets"),
        "traffic": traffic,
        "connections": connections,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "bytes_per_connection": (after - before) / connections,
    }


def _modes(raw: str, allowed: tuple[str, ...]) -> list[str]:
    modes = [m.strip() for m in raw.split(",") if m.strip()]
    bad = [m for m in modes if m not in allowed]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"{raw!r}: a comma-separated list of {', '.join(allowed)}")
    return modes


def main(argv: list[str] | None = None) -> int:
    """Run each configuration and print a table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.memory", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--connections", type=int, default=1000, help="connections [1000]")
    parser.add_argument("--serializer", default="orjson", choices=["json", "orjson", "protobuf"])
    parser.add_argument(
        "--transport",
        default="websockets",
        choices=["websockets", "picows"],
        help="the server's TRANSPORT [websockets] (picows: no WS_DEFLATE=on)",
    )
    parser.add_argument(
        "--deflate",
        type=lambda raw: _modes(raw, DEFLATE_MODES),
        default=list(DEFLATE_MODES),
        help="WS_DEFLATE values to measure, comma-separated [off,on,shared]",
    )
    parser.add_argument(
        "--traffic",
        type=lambda raw: _modes(raw, TRAFFIC_MODES),
        default=["idle"],
        help="idle (no room, nothing sent) and/or after (each has sent one message and"
        " received ten), comma-separated [idle]",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    results = []
    for traffic in args.traffic:
        for deflate in args.deflate:
            with tempfile.TemporaryDirectory(prefix="chatlab-mem-") as tmp:
                print(f"measuring WS_DEFLATE={deflate}, {traffic} ...", file=sys.stderr)
                results.append(
                    asyncio.run(
                        measure(
                            deflate,
                            traffic,
                            args.connections,
                            args.serializer,
                            Path(tmp),
                            settings={"TRANSPORT": args.transport},
                        )
                    )
                )
    print(
        f"chat server RSS per connection ({args.connections} connections, uvloop, {args.transport})"
    )
    print(
        f"{'WS_DEFLATE':<11}{'traffic':<9}{'RSS before':>14}{'RSS after':>14}{'per connection':>18}"
    )
    for r in results:
        print(
            f"{r['deflate']:<11}{r['traffic']:<9}{r['rss_before_bytes'] / 2**20:>11.1f} MiB"
            f"{r['rss_after_bytes'] / 2**20:>11.1f} MiB"
            f"{r['bytes_per_connection'] / 1024:>14.1f} KiB"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
