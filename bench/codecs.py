"""Codec microbenchmark: each chatlab codec against the bare library it wraps.

What is measured: one encode+decode round trip of a frame, for a chat ``message``
(server to client, with ``ref``) and a ``send`` (client to server, with ``ref``):

- *bare*: the library alone, as hand-written code would use it. json and orjson:
  dump a dict literal built from the values into the frame bytes (json with the
  codec's compact, non-ASCII-escaping options), then load it. protobuf: build the
  generated message from the values by setting attributes, ``SerializeToString``,
  ``FromString``, ``WhichOneof`` and read every field back.
- *codec*: ``encode_server``/``encode_client`` of the typed Struct, then
  ``decode_server``/``decode_client`` of the frame: the validated, typed path the
  server runs. Its overhead over bare is building the dict or message from the
  Struct, the kind dispatch and, for JSON, the structural checks (msgspec.convert).

A JSON frame is turned into ``str`` between the two halves in both paths, as a
websocket library hands a text frame over. Both paths produce the same frame
bytes (checked before timing). Each path runs ``--number`` round trips with
``timeit``, ``--repeat`` times, bare and codec alternating so both see the same
machine load; the best (lowest) run is kept, the one least disturbed by other
processes. ns per round trip equals ms per million round trips.

A second table backs a choice in ``chat_server/codecs/json.py``: the JSON
encoders build the dict of the hot kinds by hand rather than with
``msgspec.to_builtins``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import timeit
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import msgspec
import orjson

from chat_server.codecs import CODEC_NAMES, Codec, chat_pb2, get_codec, protobuf_backend
from chat_server.codecs import json as json_codec
from chat_server.messages import Ack, Message, Send

TARGET_RATIO = 1.5
ROOM, SEQ, USER, BODY, TS, REF = "lobby", 42, "alice", "hello", 1732284000123, "c-17"
MESSAGE = Message(room=ROOM, seq=SEQ, user=USER, body=BODY, ts=TS, ref=REF)
SEND = Send(room=ROOM, body=BODY, ref=REF)
ACK = Ack(room=ROOM, seq=SEQ, ref=REF)

Trip = Callable[[], object]


@dataclass
class Result:
    """One frame kind through one codec: best ns per round trip and frame size."""

    frame: str
    codec: str
    bare_ns: float
    codec_ns: float
    ratio: float
    frame_bytes: int
    bytes_vs_json: float


# ---- the bare libraries ---------------------------------------------------------


def _json_dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _bare_json(frame: str, dumps: Callable[[Any], bytes], loads: Callable[[str], Any]) -> Trip:
    """Return a bare JSON round trip for ``frame`` ("message" or "send")."""
    if frame == "message":

        def trip() -> object:
            data = dumps(
                {
                    "type": "message",
                    "room": ROOM,
                    "seq": SEQ,
                    "user": USER,
                    "body": BODY,
                    "ts": TS,
                    "ref": REF,
                }
            )
            return loads(data.decode())

    else:

        def trip() -> object:
            data = dumps({"type": "send", "room": ROOM, "body": BODY, "ref": REF})
            return loads(data.decode())

    return trip


def _bare_protobuf(frame: str) -> Trip:
    """Return a bare protobuf round trip for ``frame`` ("message" or "send")."""
    if frame == "message":
        server = chat_pb2.ServerMessage
        server_from_bytes = server.FromString

        def trip() -> object:
            pb = server()
            c = pb.message
            c.room = ROOM
            c.seq = SEQ
            c.user = USER
            c.body = BODY
            c.ts = TS
            c.ref = REF
            got = server_from_bytes(pb.SerializeToString())
            got.WhichOneof("kind")
            c = got.message
            return (c.room, c.seq, c.user, c.body, c.ts, c.ref if c.HasField("ref") else None)

    else:
        client = chat_pb2.ClientMessage
        client_from_bytes = client.FromString

        def trip() -> object:
            pb = client()
            s = pb.send
            s.room = ROOM
            s.body = BODY
            s.ref = REF
            got = client_from_bytes(pb.SerializeToString())
            got.WhichOneof("kind")
            s = got.send
            return (s.room, s.body, s.ref if s.HasField("ref") else None)

    return trip


def bare_trip(codec_name: str, frame: str) -> Trip:
    """Return the bare-library round trip that produces the same frame as ``codec_name``."""
    if codec_name == "json":
        return _bare_json(frame, _json_dumps, json.loads)
    if codec_name == "orjson":
        return _bare_json(frame, orjson.dumps, orjson.loads)
    return _bare_protobuf(frame)


# ---- our codecs -------------------------------------------------------------------


def codec_trip(codec: Codec, frame: str) -> Trip:
    """Return the codec's typed round trip for ``frame`` ("message" or "send")."""
    if frame == "message":
        encode, decode, message = codec.encode_server, codec.decode_server, MESSAGE
    else:
        encode, decode, message = codec.encode_client, codec.decode_client, SEND  # type: ignore[assignment]
    if codec.binary:

        def trip() -> object:
            return decode(encode(message))  # type: ignore[arg-type]

    else:

        def trip() -> object:
            return decode(encode(message).decode())  # type: ignore[arg-type]

    return trip


def codec_frame(codec: Codec, frame: str) -> bytes:
    """Return the frame bytes the codec sends for ``frame``."""
    return codec.encode_server(MESSAGE) if frame == "message" else codec.encode_client(SEND)


def _bare_frame(codec_name: str, frame: str) -> bytes:
    """Return the frame bytes the bare path sends, to check both send the same."""
    values = (
        {"type": "message", "room": ROOM, "seq": SEQ, "user": USER, "body": BODY, "ts": TS}
        if frame == "message"
        else {"type": "send", "room": ROOM, "body": BODY}
    )
    values["ref"] = REF
    if codec_name == "json":
        return _json_dumps(values)
    if codec_name == "orjson":
        return orjson.dumps(values)
    if frame == "message":
        return chat_pb2.ServerMessage(
            message=chat_pb2.ChatMessage(room=ROOM, seq=SEQ, user=USER, body=BODY, ts=TS, ref=REF)
        ).SerializeToString()
    return chat_pb2.ClientMessage(
        send=chat_pb2.Send(room=ROOM, body=BODY, ref=REF)
    ).SerializeToString()


# ---- timing -------------------------------------------------------------------------


def best_ns(trips: dict[str, Trip], number: int, repeat: int) -> dict[str, float]:
    """Time each trip ``repeat`` times, interleaved; return the best ns per call of each."""
    best = dict.fromkeys(trips, float("inf"))
    for _ in range(repeat):
        for key, trip in trips.items():
            seconds = timeit.Timer(trip).timeit(number)
            best[key] = min(best[key], seconds * 1e9 / number)
    return best


def run_codecs(number: int, repeat: int) -> list[Result]:
    """Measure every codec on both frames; return one Result per frame and codec."""
    results: list[Result] = []
    for frame in ("message", "send"):
        trips: dict[str, Trip] = {}
        sizes: dict[str, int] = {}
        for name in CODEC_NAMES:
            codec = get_codec(name)
            sent = codec_frame(codec, frame)
            bare_sent = _bare_frame(name, frame)
            if sent != bare_sent:
                raise SystemExit(f"{name} {frame}: codec frame {sent!r} != bare {bare_sent!r}")
            sizes[name] = len(sent)
            trips[f"bare {name}"] = bare_trip(name, frame)
            trips[f"codec {name}"] = codec_trip(codec, frame)
        best = best_ns(trips, number, repeat)
        for name in CODEC_NAMES:
            bare, ours = best[f"bare {name}"], best[f"codec {name}"]
            results.append(
                Result(
                    frame=frame,
                    codec=name,
                    bare_ns=bare,
                    codec_ns=ours,
                    ratio=ours / bare,
                    frame_bytes=sizes[name],
                    bytes_vs_json=sizes[name] / sizes["json"],
                )
            )
    return results


def run_dict_builders(number: int, repeat: int) -> dict[str, dict[str, float]]:
    """Best ns to build the JSON dict of each hot kind: by hand and by to_builtins."""
    cases: list[tuple[str, Any, Callable[[Any], Any]]] = [
        ("message", MESSAGE, json_codec._message_dict),
        ("ack", ACK, json_codec._ack_dict),
        ("send", SEND, json_codec._send_dict),
    ]
    trips: dict[str, Trip] = {}
    for kind, message, by_hand in cases:
        if by_hand(message) != msgspec.to_builtins(message):
            raise SystemExit(f"{kind}: the hand-built dict differs from to_builtins")
        trips[f"{kind} hand"] = lambda f=by_hand, m=message: f(m)
        trips[f"{kind} to_builtins"] = lambda m=message: msgspec.to_builtins(m)
    best = best_ns(trips, number, repeat)
    return {
        kind: {"hand_ns": best[f"{kind} hand"], "to_builtins_ns": best[f"{kind} to_builtins"]}
        for kind, _, _ in cases
    }


# ---- report -------------------------------------------------------------------------


def environment() -> dict[str, str]:
    """Return the versions that the numbers depend on."""
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "protobuf": version("protobuf"),
        "protobuf_backend": protobuf_backend(),
        "orjson": version("orjson"),
        "msgspec": version("msgspec"),
        "machine": platform.machine(),
    }


def format_report(
    results: list[Result],
    builders: dict[str, dict[str, float]],
    env: dict[str, str],
    number: int,
    repeat: int,
) -> str:
    """Return the tables as text."""
    lines = [
        f"chatlab codecs: one encode+decode round trip per frame, codec path vs bare library "
        f"(best of {repeat} x {number:,}; ns/op = ms per million)",
        f"Python {env['python']} ({env['implementation']}, {env['machine']}), "
        f"protobuf {env['protobuf']} backend {env['protobuf_backend']}, "
        f"orjson {env['orjson']}, msgspec {env['msgspec']}",
        "",
        f"{'frame':<8} {'codec':<9} {'bare ns/op':>10} {'codec ns/op':>11} "
        f"{'codec/bare':>10} {'target':>7} {'bytes':>6} {'vs json':>7}",
    ]
    for r in results:
        verdict = "ok" if r.ratio <= TARGET_RATIO else "OVER"
        lines.append(
            f"{r.frame:<8} {r.codec:<9} {r.bare_ns:>10.0f} {r.codec_ns:>11.0f} "
            f"{r.ratio:>10.2f} {verdict:>7} {r.frame_bytes:>6} {r.bytes_vs_json:>7.2f}"
        )
    lines += [
        "",
        f"target: codec/bare <= {TARGET_RATIO}",
        "",
        "JSON encoders, building the dict of a hot kind (ns/op):",
        f"{'kind':<8} {'by hand':>8} {'to_builtins':>11} {'hand/to_builtins':>16}",
    ]
    for kind, times in builders.items():
        hand, generic = times["hand_ns"], times["to_builtins_ns"]
        lines.append(f"{kind:<8} {hand:>8.0f} {generic:>11.0f} {hand / generic:>16.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, optionally write them as JSON; return 0."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.codecs",
        description="Time each chatlab codec's encode+decode round trip against the bare "
        "library it wraps, for a chat message and a send frame.",
    )
    parser.add_argument(
        "--repeat", type=int, default=7, help="timed runs per path, best kept (default: 7)"
    )
    parser.add_argument(
        "--number", type=int, default=100_000, help="round trips per run (default: 100000)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.number < 1:
        parser.error("--repeat and --number must be at least 1")

    results = run_codecs(args.number, args.repeat)
    builders = run_dict_builders(args.number, args.repeat)
    env = environment()
    print(format_report(results, builders, env, args.number, args.repeat))
    if args.json is not None:
        document = {
            "benchmark": "codec encode+decode round trip vs bare library",
            "number": args.number,
            "repeat": args.repeat,
            "target_ratio": TARGET_RATIO,
            "environment": env,
            "results": [asdict(r) for r in results],
            "json_dict_builders": builders,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
