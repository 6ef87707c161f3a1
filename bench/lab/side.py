"""What the lab measures beside the drivers' steps, after each run of a chat
configuration: bytes on the wire per delivered message (:mod:`bench.wire`: the demo's
bodies, chat-length and long ones) and memory per connection (:mod:`bench.memory`: idle,
and after traffic), each on a server of its own started with the configuration's
settings, so that the report can put them beside its CPU per frame and knee.

They run where the figure means what it says: one chat process on the embedded broker
(``bench.memory`` reads one process' RSS; with ``BROKER=redis`` the messages would go
through a Redis the lab does not lend these servers).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.lab.matrix import Config, Load

#: rooms of 10 that bench.wire opens: every member reads every room-mate's messages
WIRE_ROOMS = 2


def side_skipped(config: Config) -> str:
    """Why ``config`` gets no side measurement ("" when it does)."""
    if config.target != "chat":
        return "not a chat server"
    if int(config.env.get("WORKERS", "1") or 1) > 1:
        return "WORKERS > 1: bench.memory reads one process' memory"
    if config.env.get("BROKER", "memory") != "memory":
        return "BROKER=redis: these servers run on the embedded broker only"
    return ""


def measure_side(
    config: Config, load: Load, workdir: Path, phase: Callable[[str], None]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``config``'s bytes on the wire (one row per body set) and memory per connection
    (one row per traffic mode), as ``load`` asks; ``phase`` is told what runs."""
    from bench.memory import measure as measure_memory
    from bench.wire import measure as measure_wire
    from chat_server.runtime import raise_open_files_limit

    settings = dict(config.env)
    deflate = settings.get("WS_DEFLATE", "off")
    wire: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    if load.wire_messages:
        phase("bytes on the wire (bench.wire)")
        with tempfile.TemporaryDirectory(prefix="wire-", dir=workdir) as tmp:
            wire = asyncio.run(
                measure_wire(deflate, WIRE_ROOMS, load.wire_messages, Path(tmp), settings=settings)
            )
    if load.memory_connections:
        raise_open_files_limit(load.memory_connections + 200)  # this side's sockets
        for traffic in load.memory_traffic:
            phase(f"memory per connection, {traffic} (bench.memory)")
            with tempfile.TemporaryDirectory(prefix="memory-", dir=workdir) as tmp:
                serializer = settings.get("SERIALIZER", "orjson")
                memory.append(
                    asyncio.run(
                        measure_memory(
                            deflate,
                            traffic,
                            load.memory_connections,
                            serializer,
                            Path(tmp),
                            settings=settings,
                        )
                    )
                )
    return wire, memory
