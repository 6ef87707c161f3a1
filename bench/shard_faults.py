"""``python -m bench.shard_faults``: one shard's fault under load; the other shards' acks.

Starts a private Redis Cluster (``--primaries`` primaries with a replica each, AOF
everysec, ``cluster-node-timeout`` 2 s) and a chat server on it (``WORKERS``
``--workers``, ``REDIS_CLUSTER=on``), opens ``--clients`` websocket clients in
``--rooms`` rooms that together send about ``--rate`` messages/s, each send with a
unique ``ref``; a send answered ``unavailable`` goes again after 0.5 s with its ``ref``.
After ``--before-s`` the primary serving the first room is struck:

- ``kill9``: ``kill -9``, restarted ``--down-s`` later (it rejoins as a replica);
- ``sigstop``: frozen for ``--down-s`` (past the node timeout: its replica is promoted);
- ``replica``: its replica killed and not restarted;
- ``primary-lost``: killed and not restarted (its replica promoted, now alone).

For the rooms whose primary was *not* struck, it prints the ack latency (from a send's
first try to its ack) over the ``--window-s`` before the fault and the ``--window-s``
after it: p50, p99, max, the sends acked later than 1 s, the ``unavailable`` answers;
and the same for the struck shard's rooms. ``--runs`` repeats it (a fresh cluster each
time). Rows as JSON lines with ``--json``. Load goes to 127.0.0.1 only and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from redis.crc import key_slot
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from chatlab.harness import KeyPair, RedisClusterProcesses, ServerProcess

FAULTS = ("kill9", "sigstop", "replica", "primary-lost")
#: a send answered unavailable goes again after this long
RETRY_AFTER_S = 0.5


@dataclass
class Talker:
    """One client in one room: when each send was first tried, and its answers."""

    user: str
    room: str
    token: str
    first_try: dict[str, float] = field(default_factory=dict)
    acked_at: dict[str, float] = field(default_factory=dict)
    unavailable_at: list[float] = field(default_factory=list)
    retry: list[str] = field(default_factory=list)


def _slot(room: str) -> int:
    return key_slot(f"chat:{{{room}}}".encode())


def _send(room: str, ref: str) -> str:
    return orjson.dumps({"type": "send", "room": room, "body": ref, "ref": ref}).decode()


async def _talk(url: str, talker: Talker, rate: float, stop: asyncio.Event) -> None:
    """Send at ``rate`` until ``stop``; retry what is answered unavailable."""
    conn: ClientConnection = await connect(
        f"{url}?token={talker.token}",
        subprotocols=["chatlab.json"],  # type: ignore[list-item]
    )
    await conn.recv()  # welcome
    await conn.send(orjson.dumps({"type": "join", "room": talker.room}).decode())

    async def read() -> None:
        async for raw in conn:
            frame = orjson.loads(raw)
            ref = frame.get("ref")
            if ref not in talker.first_try:
                continue
            if frame.get("type") == "ack":
                talker.acked_at.setdefault(ref, time.monotonic())
            elif frame.get("type") == "error" and frame.get("code") == "unavailable":
                talker.unavailable_at.append(time.monotonic())
                talker.retry.append(ref)

    reader = asyncio.ensure_future(read())
    k = 0
    next_retry = 0.0
    try:
        while not stop.is_set():
            now = time.monotonic()
            if talker.retry and now >= next_retry:
                refs, talker.retry = talker.retry, []
                next_retry = now + RETRY_AFTER_S
                for ref in refs:
                    await conn.send(_send(talker.room, ref))
            ref = f"{talker.user}.{k}"
            k += 1
            talker.first_try[ref] = now
            await conn.send(_send(talker.room, ref))
            await asyncio.sleep(1 / rate)
    except ConnectionClosed:
        pass
    finally:
        reader.cancel()
        await conn.close()


def _strike(cluster: RedisClusterProcesses, fault: str, slot: int, down_s: float) -> None:
    """Strike the primary serving ``slot`` as ``fault`` says (blocking)."""
    primary = cluster.primary_of(slot)
    if fault == "replica":
        cluster.replica_of(primary).kill()
    elif fault == "primary-lost":
        primary.kill()
    elif fault == "kill9":
        primary.kill()
        time.sleep(down_s)
        primary.start()
    else:
        cluster.freeze(primary)
        time.sleep(down_s)
        cluster.thaw(primary)


def _summary(talkers: list[Talker], start: float, end: float) -> dict[str, Any]:
    """Ack latency of the sends first tried in ``[start, end)``, and the unavailable answers."""
    waits = sorted(
        t.acked_at[ref] - first
        for t in talkers
        for ref, first in t.first_try.items()
        if start <= first < end and ref in t.acked_at
    )
    tried = sum(1 for t in talkers for first in t.first_try.values() if start <= first < end)
    quantiles = (
        statistics.quantiles(waits, n=100, method="inclusive") if len(waits) > 1 else [0.0] * 99
    )
    return {
        "sends": tried,
        "acked": len(waits),
        "p50_ms": round(quantiles[49] * 1000, 1),
        "p99_ms": round(quantiles[98] * 1000, 1),
        "max_ms": round((waits[-1] if waits else 0.0) * 1000, 1),
        "acked_after_1s": sum(1 for w in waits if w > 1.0),
        "unavailable": sum(1 for t in talkers for at in t.unavailable_at if start <= at < end),
    }


async def run_once(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One run on a fresh cluster; the summary row."""
    cluster = RedisClusterProcesses(workdir / "cluster", primaries=args.primaries, appendonly=True)
    cluster.start()
    keys = KeyPair(workdir)
    server = ServerProcess(
        workdir,
        keys,
        broker="redis",
        redis_cluster="on",
        redis_url=cluster.url,
        workers=args.workers,
        transport=args.transport,
        rate_limit_per_s=100000,
        rate_limit_burst=100000,
        presence_lease_s=10,
        log_level="warning",
    ).start(timeout_s=60)
    try:
        rooms = [f"shard-{i}" for i in range(args.rooms)]
        victim = cluster.primary_of(_slot(rooms[0]))
        struck = {r for r in rooms if cluster.primary_of(_slot(r)) is victim}
        talkers = [
            Talker(f"user{i:04d}", rooms[i % len(rooms)], keys.mint(f"user{i:04d}", 3600))
            for i in range(args.clients)
        ]
        stop = asyncio.Event()
        rate = args.rate / args.clients
        tasks = [asyncio.ensure_future(_talk(server.url, t, rate, stop)) for t in talkers]
        await asyncio.sleep(args.before_s)
        fault_at = time.monotonic()
        strike = asyncio.ensure_future(
            asyncio.to_thread(_strike, cluster, args.fault, _slot(rooms[0]), args.down_s)
        )
        await asyncio.sleep(args.window_s)
        stop.set()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, BaseException):
                print(f"shard_faults: a client failed: {outcome!r}", file=sys.stderr)
        await strike
        healthy = [t for t in talkers if t.room not in struck]
        faulted = [t for t in talkers if t.room in struck]
        window = args.window_s
        return {
            "fault": args.fault,
            "rooms_struck": len(struck),
            "rooms_healthy": len(rooms) - len(struck),
            "healthy_before": _summary(healthy, fault_at - window, fault_at),
            "healthy_after": _summary(healthy, fault_at, fault_at + window),
            "struck_before": _summary(faulted, fault_at - window, fault_at),
            "struck_after": _summary(faulted, fault_at, fault_at + window),
        }
    finally:
        server.kill()
        cluster.kill()


def main(argv: list[str] | None = None) -> int:
    """Run the fault ``--runs`` times and print one row per run."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.shard_faults", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--fault", choices=FAULTS, required=True, help="what strikes one shard")
    parser.add_argument("--clients", type=int, default=200, help="websocket clients [200]")
    parser.add_argument("--rooms", type=int, default=20, help="rooms, spread by slot [20]")
    parser.add_argument("--rate", type=float, default=1450, help="sends/s, all clients [1450]")
    parser.add_argument("--workers", type=int, default=2, help="WORKERS [2]")
    parser.add_argument("--primaries", type=int, default=3, help="cluster primaries [3]")
    parser.add_argument("--transport", default="websockets", help="TRANSPORT [websockets]")
    parser.add_argument("--before-s", type=float, default=20, help="load before the fault [20]")
    parser.add_argument("--window-s", type=float, default=15, help="measured each side [15]")
    parser.add_argument("--down-s", type=float, default=10, help="kill9/sigstop: down for [10]")
    parser.add_argument("--runs", type=int, default=3, help="runs, each on a fresh cluster [3]")
    parser.add_argument("--json", type=Path, help="also write the rows here, one JSON per line")
    args = parser.parse_args(argv)
    if args.before_s < args.window_s:
        parser.error("--before-s must be at least --window-s")
    rows = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="chatlab-shard-faults-") as tmp:
            row = asyncio.run(run_once(args, Path(tmp)))
        row["run"] = run + 1
        rows.append(row)
        print(json.dumps(row))
    if args.json is not None:
        args.json.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
