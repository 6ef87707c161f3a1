"""``python -m bench.faults``: a fault under load, with retrying clients, then a count.

Starts a chat server (SQLite, or ``--fault redis-down`` on its own Redis with AOF),
opens ``--clients`` websocket clients in rooms of 10 that together send ``--rate``
messages/s, each with a unique ``ref``. Halfway through ``--duration-s`` the fault
strikes: ``kill9`` (SIGKILL, then a restart on the same port and database),
``sigterm`` (a graceful stop while sends are in flight, then a restart) or
``redis-down`` (Redis killed for ``--outage-s``, default 12 s, then restarted on its
AOF). Clients do what the contract says a careful client does: a send answered
``unavailable`` is sent again, later, with the same ``ref`` and body; after a dropped
connection the client reconnects, joins again, and sends every send not acked yet
again with its ``ref``. When the load ends, every send is retried until acked (or a
deadline), then every room's history is read page by page and counted: each send
must be stored exactly once (no duplicate of a ``ref``, nothing acked missing), and
every acked ``seq`` must be the one stored.

Prints one summary; exit status 0 when every message was stored exactly once, 1 if
not. Load tests go to 127.0.0.1 only and stop by themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from chatlab.harness import KeyPair, RedisProcess, ServerProcess

FAULTS = ("kill9", "sigterm", "redis-down")
HISTORY_PAGE = 500
#: a client retries sends answered unavailable at most this often
RETRY_AFTER_S = 0.5


@dataclass
class Sender:
    """One client: its rooms' name, its sends by ref, what was acked."""

    user: str
    room: str
    token: str
    bodies: dict[str, str] = field(default_factory=dict)  # ref -> body, every send made
    acked: dict[str, int] = field(default_factory=dict)  # ref -> seq
    retries: int = 0
    unavailable: int = 0
    reconnects: int = 0
    conn: ClientConnection | None = None


async def _connect(url: str, sender: Sender, deadline: float) -> ClientConnection:
    """Connect (retrying while the server is away), read welcome, join the room."""
    while True:
        try:
            conn = await connect(
                f"{url}?token={sender.token}",
                subprotocols=["chatlab.json"],  # type: ignore[list-item]
                open_timeout=5,
                max_size=2**22,
            )
            await conn.recv()  # welcome
            await conn.send(orjson.dumps({"type": "join", "room": sender.room}).decode())
            return conn
        except (OSError, InvalidHandshake, InvalidStatus, ConnectionClosed, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _reader(sender: Sender, pending_retry: asyncio.Queue[str]) -> None:
    """Record acks; queue a retry for a send answered unavailable."""
    assert sender.conn is not None
    async for raw in sender.conn:
        frame = orjson.loads(raw)
        kind = frame.get("type")
        if kind == "ack" and frame.get("ref") in sender.bodies:
            sender.acked[frame["ref"]] = frame["seq"]
        elif (
            kind == "error" and frame.get("ref") in sender.bodies and frame["code"] == "unavailable"
        ):
            sender.unavailable += 1
            pending_retry.put_nowait(frame["ref"])


async def _client(
    url: str, sender: Sender, rate: float, stop_sending: asyncio.Event, end: float
) -> None:
    """Send at ``rate``; reconnect and resend what is not acked; retry until all are."""
    retry: asyncio.Queue[str] = asyncio.Queue()
    retry_at = 0.0  # unavailable: the next retries wait a moment (no hot loop)
    k = 0
    next_send = time.monotonic() + random.random() / rate
    while True:
        sender.conn = await _connect(url, sender, end)
        reader = asyncio.ensure_future(_reader(sender, retry))
        try:
            # after a (re)connect: every send not acked yet goes again, same ref and body
            for ref, body in list(sender.bodies.items()):
                if ref not in sender.acked:
                    sender.retries += 1
                    await sender.conn.send(_send_frame(sender.room, body, ref))
            while True:
                if reader.done():
                    reader.result()  # raises what ended it
                    raise ConnectionClosed(None, None)
                if not retry.empty() and time.monotonic() >= retry_at:
                    retry_at = time.monotonic() + RETRY_AFTER_S
                    while not retry.empty():
                        ref = retry.get_nowait()
                        if ref not in sender.acked:
                            sender.retries += 1
                            frame = _send_frame(sender.room, sender.bodies[ref], ref)
                            await sender.conn.send(frame)
                if stop_sending.is_set():
                    if len(sender.acked) == len(sender.bodies) or time.monotonic() > end:
                        return
                    await asyncio.sleep(0.2)
                    if retry.empty():  # nothing answered yet: ask again for what is not acked
                        for ref in sender.bodies:
                            if ref not in sender.acked:
                                retry.put_nowait(ref)
                        await asyncio.sleep(0.5)
                    continue
                now = time.monotonic()
                if now < next_send:
                    await asyncio.sleep(next_send - now)
                    continue
                next_send += 1 / rate
                ref = f"{sender.user}.{k}"
                k += 1
                sender.bodies[ref] = f"m {ref}"
                await sender.conn.send(_send_frame(sender.room, sender.bodies[ref], ref))
        except (ConnectionClosed, OSError):
            sender.reconnects += 1
            await asyncio.sleep(0.1)
        finally:
            reader.cancel()
            with contextlib.suppress(Exception):
                await sender.conn.close()


def _send_frame(room: str, body: str, ref: str) -> str:
    return orjson.dumps({"type": "send", "room": room, "body": body, "ref": ref}).decode()


async def _history(url: str, token: str, room: str) -> list[dict[str, Any]]:
    """Every stored message of ``room``, oldest first, read page by page."""
    messages: list[dict[str, Any]] = []
    async with connect(f"{url}?token={token}", subprotocols=["chatlab.json"]) as conn:  # type: ignore[list-item]
        await conn.recv()
        before = None
        while True:
            request: dict[str, Any] = {"type": "history", "room": room, "limit": HISTORY_PAGE}
            if before is not None:
                request["before"] = before
            await conn.send(orjson.dumps(request).decode())
            while True:
                frame = orjson.loads(await conn.recv())
                if frame.get("type") == "history":
                    break
            page = frame["messages"]
            messages[:0] = page
            if not page:
                return messages
            before = page[0]["seq"]
            if before <= 1:
                return messages


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The whole run; the counts."""
    keys = KeyPair(workdir)
    redis = None
    settings: dict[str, Any] = {
        "rate_limit_per_s": 100000,
        "rate_limit_burst": 100000,
        "log_level": "warning",
        "cpu_affinity": args.server_core,
    }
    if args.fault == "redis-down":
        redis = RedisProcess(workdir, appendonly=True)
        redis.start(timeout_s=20)
        settings |= {"broker": "redis", "redis_url": redis.url}
    server = ServerProcess(workdir, keys, **settings).start(timeout_s=30)
    users = [f"user{i:04d}" for i in range(args.clients)]
    senders = [Sender(u, f"room{i // 10}", keys.mint(u, 3600)) for i, u in enumerate(users)]
    stop_sending = asyncio.Event()
    end = time.monotonic() + args.duration_s + 120
    per_client = args.rate / args.clients
    tasks = [
        asyncio.ensure_future(_client(server.url, s, per_client, stop_sending, end))
        for s in senders
    ]
    await asyncio.sleep(args.duration_s / 2)
    sent_before = sum(len(s.bodies) for s in senders)
    print(f"faults: {args.fault} after {sent_before} sends", file=sys.stderr)
    if args.fault == "kill9":
        server.kill()
        await asyncio.sleep(0.5)
        server.start(timeout_s=30)
    elif args.fault == "sigterm":
        await asyncio.to_thread(server.stop)
        server.start(timeout_s=30)
    else:
        assert redis is not None
        redis.kill()
        await asyncio.sleep(args.outage_s)
        redis.start(timeout_s=30)
    await asyncio.sleep(args.duration_s / 2)
    stop_sending.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    stored: dict[str, int] = {}
    duplicates = 0
    gaps = 0
    for room in sorted({s.room for s in senders}):
        history = await _history(server.url, senders[0].token, room)
        seqs = [m["seq"] for m in history]
        gaps += sum(1 for a, b in itertools.pairwise(seqs) if b != a + 1)
        for message in history:
            ref = message.get("ref")
            if ref in stored:
                duplicates += 1
            stored[ref] = message["seq"]
    server.stop()
    if redis is not None:
        redis.stop()
    sent = {ref for s in senders for ref in s.bodies}
    acked = {ref: seq for s in senders for ref, seq in s.acked.items()}
    return {
        "fault": args.fault,
        "clients": args.clients,
        "sends": len(sent),
        "acked": len(acked),
        "unavailable_answers": sum(s.unavailable for s in senders),
        "retried_sends": sum(s.retries for s in senders),
        "reconnects": sum(s.reconnects for s in senders),
        "stored": len(stored),
        "duplicates": duplicates,
        "sent_not_stored": len(sent - stored.keys()),
        "acked_missing": sum(1 for ref in acked if ref not in stored),
        "acked_seq_differs": sum(1 for ref, seq in acked.items() if stored.get(ref) != seq),
        "not_acked_at_end": len(sent - acked.keys()),
        "history_gaps": gaps,
    }


def main(argv: list[str] | None = None) -> int:
    """Run one fault and print the counts; 0 if every send was stored exactly once."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--fault", choices=FAULTS, required=True, help="what goes wrong")
    parser.add_argument("--clients", type=int, default=200, help="in rooms of 10 [200]")
    parser.add_argument("--rate", type=float, default=2000, help="sends/s, all clients [2000]")
    parser.add_argument("--duration-s", type=float, default=20, help="load duration [20]")
    parser.add_argument("--outage-s", type=float, default=12, help="redis-down: seconds [12]")
    parser.add_argument("--server-core", default="0", help="the server's core [0]")
    args = parser.parse_args(argv)
    if args.clients < 10 or args.clients % 10:
        parser.error("--clients must be a positive multiple of 10")
    with tempfile.TemporaryDirectory(prefix="chatlab-faults-") as tmp:
        counts = asyncio.run(run(args, Path(tmp)))
    width = max(map(len, counts))
    for name, value in counts.items():
        print(f"{name:<{width}}  {value}")
    exactly_once = (
        counts["duplicates"] == 0
        and counts["sent_not_stored"] == 0
        and counts["acked_missing"] == 0
        and counts["acked_seq_differs"] == 0
    )
    print("every send stored exactly once" if exactly_once else "NOT exactly once")
    return 0 if exactly_once else 1


if __name__ == "__main__":
    sys.exit(main())
