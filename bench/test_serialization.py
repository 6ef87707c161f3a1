"""Serialization microbenchmarks (pytest-benchmark): json, orjson and protobuf side by side.

``pytest bench/ --benchmark-only`` runs them; each group holds the three formats
for one operation, so pytest-benchmark prints them side by side. Two subjects:

- the test message of the seed report (the report this project started from, whose
  server measured 6,500 → 18,000 messages/s on its own machine at p90/p95/p99
  481/570/768 ms; see ``README.md``), ``{"name": "Test Name", "age": 40,
  "random_float": 0.554781258874, "items": ["Hammer", "Radio"]}``, with each bare
  library, as the seed measured it (its table: JSON 3,588/2,630 ms, orjson 407/645 ms,
  protobuf 403/344 ms per million serialize/deserialize; 132/116/64 bytes);
- our own chat ``message`` and ``send`` frames through the real codecs.

Each test records the encoded size in ``extra_info["bytes"]``; ``python -m
bench.seed_table BENCH.json`` renders the seed-style table from ``--benchmark-json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from bench import seed_pb2
from chat_server.codecs import get_codec
from chat_server.messages import Message, Send

SEED = {
    "name": "Test Name",
    "age": 40,
    "random_float": 0.554781258874,
    "items": ["Hammer", "Radio"],
}
FORMATS = ["json", "orjson", "protobuf"]


_SEED_PB = seed_pb2.SeedMessage(**SEED)

SEED_SERIALIZE: dict[str, Callable[[], bytes]] = {
    # the seed's JSON sizes (132/116 bytes) are the libraries' default output
    "json": lambda: json.dumps(SEED).encode(),
    "orjson": lambda: orjson.dumps(SEED),
    "protobuf": _SEED_PB.SerializeToString,
}
SEED_DESERIALIZE: dict[str, Callable[[bytes], Any]] = {
    "json": json.loads,
    "orjson": orjson.loads,
    "protobuf": seed_pb2.SeedMessage.FromString,
}

MESSAGE = Message(
    room="lobby", seq=42, user="alice", body="hello there", ts=1732284000123, ref="c-17"
)
SEND = Send(room="lobby", body="hello there", ref="c-17")


@pytest.mark.parametrize("fmt", FORMATS)
def test_seed_serialize(benchmark: Any, fmt: str) -> None:
    benchmark.group = "seed message: serialize"
    data = benchmark(SEED_SERIALIZE[fmt])
    benchmark.extra_info["bytes"] = len(data)
    assert len(data) > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_seed_deserialize(benchmark: Any, fmt: str) -> None:
    benchmark.group = "seed message: deserialize"
    data = SEED_SERIALIZE[fmt]()
    benchmark.extra_info["bytes"] = len(data)
    decoded = benchmark(SEED_DESERIALIZE[fmt], data)
    if fmt == "protobuf":
        assert decoded.name == SEED["name"] and list(decoded.items) == SEED["items"]
    else:
        assert decoded == SEED


def _frame(codec_name: str, encode: Callable[[Any], bytes], message: Any) -> bytes | str:
    data = encode(message)
    # a websocket library hands a text frame over as str
    return data if codec_name == "protobuf" else data.decode()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["message", "send"])
def test_chat_encode(benchmark: Any, fmt: str, kind: str) -> None:
    codec = get_codec(fmt)
    benchmark.group = f"chat {kind}: encode (codec)"
    if kind == "message":
        data = benchmark(codec.encode_server, MESSAGE)
    else:
        data = benchmark(codec.encode_client, SEND)
    benchmark.extra_info["bytes"] = len(data)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["message", "send"])
def test_chat_decode(benchmark: Any, fmt: str, kind: str) -> None:
    codec = get_codec(fmt)
    benchmark.group = f"chat {kind}: decode (codec)"
    if kind == "message":
        frame = _frame(fmt, codec.encode_server, MESSAGE)
        decoded = benchmark(codec.decode_server, frame)
        assert decoded == MESSAGE
    else:
        frame = _frame(fmt, codec.encode_client, SEND)
        decoded = benchmark(codec.decode_client, frame)
        assert decoded == SEND
    benchmark.extra_info["bytes"] = len(frame.encode() if isinstance(frame, str) else frame)
