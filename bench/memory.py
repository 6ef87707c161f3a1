"""Memory per idle connection: the chat server's RSS delta over N connections, deflate off and on.

Method: start ``python -m chat_server`` (uvloop, orjson unless told otherwise),
open a few connections to warm up, read the server's RSS (psutil), open ``--connections``
more from this process (each one authenticated and past its ``welcome``, idle, in no
room), wait for the RSS to settle, read it again. The difference divided by the
number of connections is the server's cost per idle connection: websockets'
protocol and buffers, our session, and with deflate the zlib contexts of
permessage-deflate (window 2^12, memLevel 5). The client offers deflate in both
runs, so only the server's ``WS_DEFLATE`` differs.
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

from chatlab.harness import KeyPair, ServerProcess


async def _open(url: str, token: str, count: int) -> list[ClientConnection]:
    conns = []
    for start in range(0, count, 100):
        batch = await asyncio.gather(
            *(
                connect(
                    url,
                    additional_headers={"Authorization": f"Bearer {token}"},
                    compression="deflate",
                    open_timeout=30,
                    ping_interval=None,
                )
                for _ in range(min(100, count - start))
            )
        )
        for conn in batch:
            await conn.recv()  # welcome
        conns.extend(batch)
    return conns


def _settled_rss(proc: psutil.Process, settle_s: float = 1.0) -> int:
    time.sleep(settle_s)
    return proc.memory_info().rss


async def measure(deflate: bool, connections: int, serializer: str, workdir: Path) -> dict:
    """Start a server with WS_DEFLATE as given; return RSS before/after and bytes per connection."""
    keys = KeyPair(workdir)
    server = ServerProcess(
        workdir,
        keys,
        serializer=serializer,
        event_loop="uvloop",
        ws_deflate="on" if deflate else "off",
        max_connections=connections + 100,
        log_level="warning",
    )
    server.start()
    try:
        assert server.proc is not None
        proc = psutil.Process(server.proc.pid)
        token = keys.mint("idle")
        warm = await _open(server.url, token, 20)
        before = _settled_rss(proc)
        conns = await _open(server.url, token, connections)
        after = _settled_rss(proc)
        for conn in conns + warm:
            await conn.close()
    finally:
        server.stop()
    return {
        "deflate": "on" if deflate else "off",
        "connections": connections,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "bytes_per_connection": (after - before) / connections,
    }


def main(argv: list[str] | None = None) -> int:
    """Run both configurations and print a table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.memory", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--connections", type=int, default=1000, help="idle connections")
    parser.add_argument("--serializer", default="orjson", choices=["json", "orjson", "protobuf"])
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    results = []
    for deflate in (False, True):
        with tempfile.TemporaryDirectory(prefix="chatlab-mem-") as tmp:
            print(f"measuring WS_DEFLATE={'on' if deflate else 'off'} ...", file=sys.stderr)
            results.append(
                asyncio.run(measure(deflate, args.connections, args.serializer, Path(tmp)))
            )
    print(f"chat server RSS per idle connection ({args.connections} connections, uvloop)")
    print(f"{'WS_DEFLATE':<11}{'RSS before':>14}{'RSS after':>14}{'per connection':>18}")
    for r in results:
        print(
            f"{r['deflate']:<11}{r['rss_before_bytes'] / 2**20:>11.1f} MiB"
            f"{r['rss_after_bytes'] / 2**20:>11.1f} MiB"
            f"{r['bytes_per_connection'] / 1024:>14.1f} KiB"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
