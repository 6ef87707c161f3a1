"""The performance toggles the lab compares (codec, loop, compression, transport, workers,
GC) and the deliberate regressions it measures against."""

from __future__ import annotations

import re

from chatlab.settings import EVENT_LOOP_SPEC, Spec, choice, integer, number, parse_core_list

#: ``TRANSPORT`` values: the websocket implementations the server runs on
TRANSPORTS = ("websockets", "picows")

REGRESSIONS = (
    "off",
    "commit_per_message",
    "encode_per_recipient",
    "blocking_loop",
    "cpu_per_send",
    "auth_inline",
    "deflate_max_window",
)

_WORKER_SEAT = re.compile(r"^\d+(:\d+){4}$")


def _worker_seat(raw: str) -> str:
    value = raw.strip()
    if value and not _WORKER_SEAT.match(value):
        raise ValueError("allowed: empty (the supervisor sets it for its workers)")
    return value


PERFORMANCE_SPECS: tuple[Spec, ...] = (
    Spec(
        "SERIALIZER",
        "serializer",
        "orjson",
        choice("json", "orjson", "protobuf"),
        "wire codec: json (stdlib), orjson, protobuf (binary frames)",
    ),
    EVENT_LOOP_SPEC,
    Spec(
        "WS_DEFLATE",
        "ws_deflate",
        "off",
        choice("off", "on", "shared"),
        "accept permessage-deflate: off; on (context takeover: a compressor per connection,"
        " window 2^12, memLevel 5); shared (no context takeover: each broadcast compressed"
        " once, window 2^9, for every member that negotiated it)",
    ),
    Spec(
        "CPU_AFFINITY",
        "cpu_affinity",
        "off",
        parse_core_list,
        "pin the process to these cores (off, 0, 0,1, 0-1)",
    ),
    Spec(
        "WORKERS",
        "workers",
        "1",
        integer(1, 1024),
        "server processes sharing the port (above 1: needs BROKER=redis)",
    ),
    Spec(
        "GC_POLICY",
        "gc_policy",
        "tuned",
        choice("tuned", "default"),
        "tuned: freeze start-up objects, raise thresholds, full collections when idle"
        " (docs/performance.md); default: CPython's own",
    ),
    Spec(
        "GC_FULL_INTERVAL_S",
        "gc_full_interval_s",
        "600",
        number(1),
        "with GC_POLICY=tuned: at most this long between full collections under load",
    ),
    Spec(
        "TRANSPORT",
        "transport",
        "websockets",
        choice(*TRANSPORTS),
        "websocket implementation: websockets, or picows (permessage-deflate only shared)",
    ),
    Spec(
        "REGRESSION",
        "regression",
        "off",
        choice(*REGRESSIONS),
        "one deliberate mistake for the lab (off in real use)",
    ),
    Spec(
        "AUTH_INLINE_PORT",
        "auth_inline_port",
        "8002",
        integer(1, 65535),
        "with REGRESSION=auth_inline: port of the inline POST /login",
    ),
    Spec(
        "CHATLAB_WORKER",
        "worker_seat",
        "",
        _worker_seat,
        "set by the supervisor for each worker it starts (WORKERS > 1): leave it empty",
    ),
)
