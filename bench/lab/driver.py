"""``python -m bench.lab.driver``: the lab's fast open-loop load driver (picows on uvloop).

It opens ``--connections`` websockets to a chat server or to the bare relay, puts
them in rooms of ``--room-size`` and sends ``send`` frames at fixed total rates
(``--rates``, one step each), measuring fan-out latency at every room member.

Open loop: one scheduler sends what the clock says is due, round-robin over the
connections, whatever the server does; a wake-up that comes late sends its
backlog at once with the original scheduled times, so the driver's own lateness
counts in the latency too (no coordinated omission), and is reported as
``late_sends`` (more than 1 ms behind) and ``max_send_lag_ms``.

Each frame's body is ``~ts=`` and the scheduled send time (``time.perf_counter_ns``,
19 digits), then ``x`` padding up to ``--body-chars``. Frames are spliced from one
frame per connection encoded once with the real codec, so a protobuf length never
changes; a receiver finds the marker in the raw bytes (JSON or protobuf alike) and
never decodes a ``message``. Latency is receive time minus scheduled time, in an HDR
histogram of microseconds (1 us to 60 s, 3 significant digits).

Deliveries count to the step whose send phase scheduled them, during the step and
its ``--drain-s``; one later than that is lost to the step (``error_detail``
``after_drain``, not counted in ``errors``). Errors are error frames by code,
unexpected closes (``closed 1013``) and sends dropped because a connection's
unsent bytes passed a bound (``send_buffer_full``). Acks (chat) are matched to
sends in order per connection for ``ack_latency_ms`` (approximate when errors
replace acks). Timeline points are seconds since the driver started, or since
``--t0-monotonic`` (a caller's ``time.monotonic()``), which also sets each step's
``started_s`` on that clock.

With ``--retry`` (chat only) every send carries a ``ref``: its 19 scheduled-time
digits, unique over the run. A send answered ``unavailable`` is sent again after
:data:`RETRY_AFTER_S` with the same ``ref``, body and scheduled time, and a connection
the server dropped is opened again and sends again everything it had not seen acked,
as a careful client does (the server answers a repeat of a stored send with its
original ack: nothing is stored twice). Each step counts them in ``retries``
(``after_unavailable``, ``after_reconnect``, ``reconnects``). It is off by default:
a ``ref`` makes each send an idempotency lookup on the server, part of what a
capacity figure would then measure.

The driver's own garbage collector never runs inside a step: everything alive once
the connections are open is frozen (``gc.freeze()``, never walked again), and
automatic collection is off from each step's start to the end of its drain, with a
collection just before the step. With CPython's default thresholds a full collection
over 2,000 connections' objects takes tens of milliseconds, which an open-loop
driver would count as latency (late receive times, late sends).

A step is ``generator_limited`` when the driver used more than 90 % of one core
during its send phase, when more than 1 % of its sends left more than 5 ms late,
when one left more than 50 ms late, or when it waited, runnable, for its core more
than 10 % of the time (Linux schedstat: another process or the kernel ran there):
its figures then measure the driver too.

Exit status: 0 when every step ran, 1 when the connections could not be opened
(or joined), 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import logging
import math
import os
import sys
import time
import zlib
from array import array
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter_ns
from urllib.parse import urlsplit

import numpy as np
import psutil
from hdrh.histogram import HdrHistogram
from picows import (
    WSCloseCode,
    WSFrame,
    WSHandshakeError,
    WSListener,
    WSMsgType,
    WSTransport,
    ws_connect,
)
from websockets.extensions.permessage_deflate import (
    ClientPerMessageDeflateFactory,
    PerMessageDeflate,
)
from websockets.frames import Frame, Opcode
from websockets.headers import build_extension, parse_extension

from bench.lab.results import PERCENTILES, Step, TimePoint, parse_slo, stalled_points
from chat_server.codecs import CODEC_NAMES, Codec, chat_pb2, get_codec
from chat_server.messages import Join, Send, ServerMessage
from chat_server.runtime import pin_cpus, raise_open_files_limit
from chatlab.loops import loop_factory
from chatlab.settings import parse_core_list

log = logging.getLogger("bench.lab.driver")

#: what precedes the scheduled send time in every body
MARKER = b"~ts="
#: width of the scheduled send time in the body (``perf_counter_ns`` fits in 19 digits)
DIGITS = 19
#: the shortest body: the marker and the digits
MIN_BODY_CHARS = len(MARKER) + DIGITS
#: where a send's ref goes (--retry): replaced by the send's scheduled-time digits
REF_PLACEHOLDER = b"9" * DIGITS
#: --retry: how long after an ``unavailable`` a send goes again
RETRY_AFTER_S = 0.2
_MARKER_LEN, _MARKER_END = len(MARKER), len(MARKER) + DIGITS

#: HDR histogram range and precision, microseconds
HIST_MIN_US, HIST_MAX_US, HIST_DIGITS = 1, 60_000_000, 3
#: a send that left this much after its scheduled time is a late send
LATE_NS = 1_000_000
#: generator-limited rules: CPU of one core, share of sends behind by BEHIND_NS, max lag
CPU_LIMIT_PERCENT = 90.0
BEHIND_NS = 5_000_000
BEHIND_SHARE = 0.01
MAX_LAG_LIMIT_MS = 50.0
#: ... or share of the send phase the driver spent runnable but waiting for its core
RUNQ_WAIT_LIMIT = 0.10
#: sends made in one go before the scheduler lets received frames in
MAX_BATCH = 512
#: the scheduler wakes at most this often: sends due sooner leave together, this much late
MIN_WAKE_INTERVAL_NS = 200_000
#: arrivals are counted this often (each a pause of well under a millisecond) ...
FLUSH_INTERVAL_NS = 100_000_000
#: ... and a timeline point closes this often
POINT_INTERVAL_NS = 1_000_000_000
#: bytes one connection may hold unsent; past it its sends are dropped and counted
MAX_BUFFERED_BYTES = 4 * 2**20
#: sends per connection remembered for ack latency; past it the oldest are forgotten
MAX_PENDING_ACKS = 65_536
#: largest frame accepted from the server
MAX_FRAME_BYTES = 2**20
#: how long closing the connections may take at the end
CLOSE_TIMEOUT_S = 2.0
#: climb: after a broken step, wait until nothing has arrived for this long (the server
#: caught up) before the next step, but no longer than SETTLE_MOST_S
SETTLE_QUIET_S, SETTLE_MOST_S = 0.3, 8.0

TARGETS = ("chat", "relay")
DEFAULT_URLS = {"chat": "ws://127.0.0.1:8000/ws", "relay": "ws://127.0.0.1:8765/ws"}

EXIT_OK, EXIT_CONNECT_FAILED = 0, 1  # a bad argument: 2, from argparse


# ---- settings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DriverConfig:
    """Every setting of one driver run, validated by :func:`parse_args`."""

    target: str
    url: str
    serializer: str
    tokens: tuple[str, ...]
    connections: int
    room_size: int
    room_prefix: str
    rates: tuple[float, ...]
    step_s: float
    warmup_s: float
    drain_s: float
    body_chars: int
    json_out: Path | None
    cores: tuple[int, ...] | None
    event_loop: str
    connect_timeout_s: float
    t0_monotonic: float | None = None
    retry: bool = False
    deflate: bool = False  # offer permessage-deflate (RFC 7692) as browsers do
    climb_slo: dict[str, float] | None = None  # climb to the knee instead of fixed rates
    factor: float = 1.4  # climb: rate multiplier while the SLO holds
    resolution: float = 0.05  # climb: stop when first broken / last held <= 1 + this
    max_rate: float = math.inf  # climb: never offer more than this
    min_rate: float = 1.0  # climb: never offer less than this


def load_tokens(path: Path) -> tuple[str, ...]:
    """Tokens from a file: JSON ``{username: token}`` (``loadtest.seed``), a JSON list, or
    one token per line; raise ValueError when there is none."""
    text = path.read_text().strip()
    if text.startswith("{"):
        tokens = tuple(str(t) for t in json.loads(text).values())
    elif text.startswith("["):
        tokens = tuple(str(t) for t in json.loads(text))
    else:
        tokens = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not tokens:
        raise ValueError("no token in it")
    return tokens


def _rates(raw: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(r) for r in raw.split(",") if r.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r}: allowed: rates such as 2000,4000") from None
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"{raw!r}: allowed: positive rates such as 2000,4000")
    return rates


def parse_args(argv: list[str] | None = None) -> DriverConfig:
    """The command line as a :class:`DriverConfig`; a bad value exits 2 naming it."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.lab.driver",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        epilog="Example: python -m bench.lab.driver --target relay --cpu-affinity 1 "
        "--rates 2000,4000,8000 --step-s 5 --json-out steps.json",
    )
    parser.add_argument("--target", choices=TARGETS, default="chat", help="what to load [chat]")
    parser.add_argument(
        "--url",
        help="websocket URL [chat: ws://127.0.0.1:8000/ws, relay: ws://127.0.0.1:8765/ws; "
        "the relay's ?room= is added]",
    )
    parser.add_argument(
        "--serializer",
        choices=CODEC_NAMES,
        default="orjson",
        help="the chat server's SERIALIZER: json/orjson send text frames, protobuf binary "
        "ones (the relay carries either) [orjson]",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        help="chat: tokens, as JSON {username: token} (loadtest.seed --token-file) or one "
        "per line; connection i uses token i modulo their number",
    )
    parser.add_argument("--connections", type=int, default=100, help="connections [100]")
    parser.add_argument(
        "--room-size", type=int, default=10, help="connection i is in room i // this [10]"
    )
    parser.add_argument("--room-prefix", default="lab", help="rooms are PREFIX-<k> [lab]")
    parser.add_argument(
        "--rates",
        type=_rates,
        default=(1000.0,),
        help="total send rates, messages/s across all connections, one step each [1000]",
    )
    parser.add_argument("--step-s", type=float, default=10.0, help="seconds per step [10]")
    parser.add_argument(
        "--warmup-s", type=float, default=2.0, help="seconds at the first rate, unrecorded [2]"
    )
    parser.add_argument(
        "--drain-s",
        type=float,
        default=2.0,
        help="seconds after each step to collect its deliveries in flight [2]",
    )
    parser.add_argument(
        "--body-chars",
        type=int,
        default=MIN_BODY_CHARS,
        help=f"message body length, at least {MIN_BODY_CHARS} [{MIN_BODY_CHARS}]",
    )
    parser.add_argument(
        "--json-out", type=Path, help="write the steps here (a JSON list of Step dicts)"
    )
    parser.add_argument(
        "--cpu-affinity", default="off", help="pin the driver to these cores: off, 1, 0-1 [off]"
    )
    parser.add_argument(
        "--event-loop", choices=("uvloop", "asyncio"), default="uvloop", help="[uvloop]"
    )
    parser.add_argument(
        "--connect-timeout-s",
        type=float,
        default=10.0,
        help="seconds one connection may take to open (and join) [10]",
    )
    parser.add_argument(
        "--t0-monotonic",
        type=float,
        help="the caller's time.monotonic() at its start: timeline t_s and each step's "
        "started_s count from it [the driver's own start; started_s left empty]",
    )
    parser.add_argument(
        "--retry",
        action="store_true",
        help="chat: sends carry a ref; resend after unavailable, reopen and resend after a "
        "dropped connection [off]",
    )
    parser.add_argument(
        "--deflate",
        choices=("on", "off"),
        default="off",
        help="offer permessage-deflate (RFC 7692) as browsers do and compress when the "
        "server accepts it [off]",
    )
    parser.add_argument(
        "--climb",
        metavar="SLO",
        help="climb instead of running the rates: start at the first --rates value, "
        "multiply by --factor while the step holds SLO (e.g. p99=100; no delivery lost), "
        "then bisect between the last held and the first broken rate until they are "
        "within --resolution; a stalled step is marked and run once more",
    )
    parser.add_argument("--factor", type=float, default=1.4, help="climb: rate multiplier [1.4]")
    parser.add_argument(
        "--resolution", type=float, default=0.05, help="climb: relative width of the edge [0.05]"
    )
    parser.add_argument(
        "--max-rate", type=float, default=math.inf, help="climb: highest rate, sends/s [none]"
    )
    parser.add_argument("--log-level", default="warning", help="logging level [warning]")
    args = parser.parse_args(argv)

    target = args.target
    url = args.url or DEFAULT_URLS[target]
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        parser.error(f"--url {url!r}: allowed: ws://HOST:PORT/PATH or wss://...")
    for name in ("connections", "room_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: allowed: 1 or more")
    if not args.step_s > 0:
        parser.error(f"--step-s {args.step_s}: allowed: more than 0")
    for name in ("warmup_s", "drain_s"):
        if not getattr(args, name) >= 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: allowed: 0 or more")
    if not args.connect_timeout_s > 0:
        parser.error(f"--connect-timeout-s {args.connect_timeout_s}: allowed: more than 0")
    climb_slo = None
    if args.climb is not None:
        try:
            climb_slo = parse_slo(args.climb)
        except ValueError as exc:
            parser.error(f"--climb {args.climb!r}: {exc}")
        if not args.factor > 1 or not 0 < args.resolution < args.factor - 1:
            parser.error("--factor must be > 1 and 0 < --resolution < --factor - 1")
        if not args.max_rate >= args.rates[0]:
            parser.error(f"--max-rate {args.max_rate:g}: allowed: at least the first rate")
    if args.body_chars < MIN_BODY_CHARS:
        parser.error(f"--body-chars {args.body_chars}: allowed: {MIN_BODY_CHARS} or more")
    if args.json_out is not None and not args.json_out.parent.is_dir():
        parser.error(f"--json-out {args.json_out}: its directory does not exist")
    tokens: tuple[str, ...] = ()
    if target == "chat":
        if args.token_file is None:
            parser.error("--token-file: required with --target chat")
        try:
            tokens = load_tokens(args.token_file)
        except (OSError, ValueError) as exc:
            parser.error(f"--token-file {args.token_file}: {exc}")
    try:
        cores = parse_core_list(args.cpu_affinity)
    except ValueError as exc:
        parser.error(f"--cpu-affinity {args.cpu_affinity!r}: {exc}")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    return DriverConfig(
        target=target,
        url=url,
        serializer=args.serializer,
        tokens=tokens,
        connections=args.connections,
        room_size=args.room_size,
        room_prefix=args.room_prefix,
        rates=args.rates,
        step_s=args.step_s,
        warmup_s=args.warmup_s,
        drain_s=args.drain_s,
        body_chars=args.body_chars,
        json_out=args.json_out,
        cores=cores,
        event_loop=args.event_loop,
        retry=args.retry and target == "chat",
        connect_timeout_s=args.connect_timeout_s,
        t0_monotonic=args.t0_monotonic,
        deflate=args.deflate == "on",
        climb_slo=climb_slo,
        factor=args.factor,
        resolution=args.resolution,
        max_rate=args.max_rate,
        min_rate=args.rates[0] / args.factor**4,
    )


# ---- frames -------------------------------------------------------------------------------


def send_frame(
    codec: Codec, room: str, body_chars: int, with_ref: bool = False
) -> tuple[bytearray, slice, slice | None]:
    """One ``send`` frame for ``room``, encoded by ``codec``; where its time digits are,
    and (``with_ref``) where its ``ref``'s are.

    The digits are placeholders; writing 19 digits in each place gives the frame the
    codec would encode for that time and ref (same length, so protobuf lengths stay
    right).
    """
    body = MARKER.decode() + "0" * DIGITS + "x" * (body_chars - MIN_BODY_CHARS)
    ref = REF_PLACEHOLDER.decode() if with_ref else None
    frame = bytearray(codec.encode_client(Send(room=room, body=body, ref=ref)))
    start = frame.find(MARKER) + len(MARKER)
    assert start >= len(MARKER) and frame[start : start + DIGITS] == b"0" * DIGITS, frame
    ref_digits = None
    if with_ref:
        at = frame.find(REF_PLACEHOLDER)
        assert at >= 0, frame
        ref_digits = slice(at, at + DIGITS)
    return frame, slice(start, start + DIGITS), ref_digits


def decode_frame(codec: Codec, payload: bytes) -> ServerMessage:
    """A server frame's payload decoded (JSON codecs take text frames as ``str``)."""
    return codec.decode_server(payload if codec.binary else payload.decode("utf-8", "replace"))


def frame_kind_reader(codec: Codec) -> Callable[[bytes], str]:
    """A function naming a server frame's kind (``ack``, ``error``, ...) from its first bytes.

    JSON frames start with their ``type`` (msgspec writes the tag first); a protobuf
    frame starts with the tag of its ``oneof`` field. Anything else is decoded.
    """
    if codec.binary:
        oneof = chat_pb2.ServerMessage.DESCRIPTOR.oneofs_by_name["kind"]
        names = {f.number: f.name for f in oneof.fields}

        def protobuf_kind(payload: bytes) -> str:
            return names.get(payload[0] >> 3, "unknown") if payload else "unknown"

        return protobuf_kind

    prefix = b'{"type":"'

    def json_kind(payload: bytes) -> str:
        if payload.startswith(prefix):
            return payload[len(prefix) : payload.find(b'"', len(prefix))].decode("ascii", "replace")
        try:
            return type(decode_frame(codec, payload)).__struct_config__.tag  # type: ignore[return-value]
        except Exception:  # any undecodable frame is just of an unknown kind here
            return "unknown"

    return json_kind


# ---- waking on time -----------------------------------------------------------------------

_CLOCK_MONOTONIC = 1  # perf_counter_ns's clock on Linux
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class WakeTimer:
    """Wakes a coroutine at a ``perf_counter_ns`` time, to a few microseconds (a timerfd).

    uvloop's timers round to whole milliseconds (a 0.4 ms sleep returns at once, a
    0.6 ms one after 1.1 ms), so sleeping to each scheduled send either spins or
    sends late; a timerfd in the loop's poll wakes it when due, spinning never.
    """

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._spec = _Itimerspec()
        self._loop.add_reader(self._fd, self._fired)

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return  # re-armed before this callback ran: not expired yet
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def sleep_until(self, when_ns: int) -> None:
        """Return at ``when_ns`` (``perf_counter_ns`` clock) or just after; at once if past."""
        if when_ns <= perf_counter_ns():
            await asyncio.sleep(0)
            return
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(when_ns, 1_000_000_000)
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None):
            raise OSError(ctypes.get_errno(), "timerfd_settime")
        self._waiter = self._loop.create_future()
        await self._waiter

    def close(self) -> None:
        """Stop watching the timer and close it."""
        self._loop.remove_reader(self._fd)
        os.close(self._fd)


# ---- latencies ----------------------------------------------------------------------------


class LatencyHistogram:
    """Latencies in microseconds counted in HDR's buckets (1 us .. 60 s, 3 significant digits).

    Counting is numpy's (``bincount`` over the buckets' indices), so a batch of
    deliveries costs little and never one ``hdrh`` call per value; percentiles are
    read as ``hdrh`` reads them, and :meth:`to_hdr` gives the same histogram as
    recording each value into an ``HdrHistogram``.
    """

    def __init__(self) -> None:
        self.counts = np.zeros(_HDR_COUNTS_LEN, dtype=np.int64)

    def add(self, values_us: np.ndarray) -> None:
        """Count every value (clipped to the histogram's range)."""
        if len(values_us):
            values = np.clip(values_us, 0, HIST_MAX_US)
            self.counts += np.bincount(_hdr_index(values), minlength=_HDR_COUNTS_LEN)

    def merge_into(self, other: LatencyHistogram) -> None:
        """Add these counts to ``other``'s and start from zero again."""
        other.counts += self.counts
        self.counts[:] = 0

    @property
    def count(self) -> int:
        """How many values were added."""
        return int(self.counts.sum())

    def value_at_percentile(self, percentile: float) -> int:
        """The value at ``percentile`` (0 < percentile <= 100), as ``hdrh`` answers; 0 if empty."""
        cumulative = np.cumsum(self.counts)
        total = int(cumulative[-1])
        if not total:
            return 0
        target = max(int(min(percentile, 100.0) * total / 100 + 0.5), 1)
        return _hdr_highest_value(int(np.searchsorted(cumulative, target)))

    def percentiles_ms(self) -> dict[str, float]:
        """:data:`~bench.lab.results.PERCENTILES` in milliseconds; empty when nothing was added."""
        if not self.count:
            return {}
        quantiles = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
        result = {k: self.value_at_percentile(q) / 1000 for k, q in quantiles.items()}
        result["max"] = _hdr_highest_value(int(np.flatnonzero(self.counts)[-1])) / 1000
        return {k: round(result[k], 3) for k in PERCENTILES}

    def to_hdr(self) -> HdrHistogram:
        """The counts as an ``hdrh`` histogram."""
        histogram = HdrHistogram(HIST_MIN_US, HIST_MAX_US, HIST_DIGITS)
        nonzero = np.flatnonzero(self.counts)
        for index, count in zip(nonzero.tolist(), self.counts[nonzero].tolist(), strict=True):
            histogram.record_value(_hdr_lowest_value(index), count)
        return histogram

    def encoded(self) -> str:
        """The histogram, base64 (``hdrh`` encode); empty when nothing was added."""
        return self.to_hdr().encode().decode("ascii") if self.count else ""


# HDR's layout at 3 significant digits from 1 us: values below 2048 have a bucket each,
# then each power of two has 1024 buckets, each 2**shift wide
_HDR_COUNTS_LEN = HdrHistogram(HIST_MIN_US, HIST_MAX_US, HIST_DIGITS).counts_len
_HALF_MAGNITUDE = 10


def _hdr_index(values: np.ndarray) -> np.ndarray:
    """HDR's counts index of each value (as ``HdrHistogram._counts_index_for``)."""
    shift = np.maximum(np.frexp(values)[1].astype(np.int64) - (_HALF_MAGNITUDE + 1), 0)
    return (shift << _HALF_MAGNITUDE) + (values >> shift)


def _hdr_lowest_value(index: int) -> int:
    """The lowest value counted at HDR counts index ``index``."""
    shift = max((index >> _HALF_MAGNITUDE) - 1, 0)
    return (index - (shift << _HALF_MAGNITUDE)) << shift


def _hdr_highest_value(index: int) -> int:
    """The highest value counted at HDR counts index ``index``."""
    shift = max((index >> _HALF_MAGNITUDE) - 1, 0)
    return _hdr_lowest_value(index) + (1 << shift) - 1


_POWERS_OF_TEN = 10 ** np.arange(DIGITS - 1, -1, -1, dtype=np.int64)


def parse_times(digits: bytes) -> np.ndarray:
    """The scheduled times in ``digits``: DIGITS ASCII digits each, back to back."""
    matrix = np.frombuffer(digits, dtype=np.uint8).reshape(-1, DIGITS).astype(np.int64) - 48
    return matrix @ _POWERS_OF_TEN


def _take(values: array[int]) -> np.ndarray:
    """The values gathered so far, as an array; ``values`` is left empty (same object)."""
    taken = np.frombuffer(values.tobytes(), dtype=np.int64)
    del values[:]
    return taken


# ---- one step -----------------------------------------------------------------------------


class StepRecorder:
    """What one step measured so far; :meth:`result` makes it a :class:`Step`."""

    def __init__(self, name: str, rate: float, duration_s: float, connections: int) -> None:
        self.name = name
        self.started_s: float | None = None
        self.rate = rate
        self.duration_s = duration_s
        self.connections = connections
        self.start_ns = 0
        self.end_ns = 0
        self.sent = 0
        self.sent_at_point = 0
        self.expected = 0
        self.late_sends = 0
        self.behind_sends = 0
        self.max_lag_ns = 0
        self.delivered = 0
        self.errors: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()  # --retry: what was sent again, and why
        self.latency = LatencyHistogram()
        self.point_latency = LatencyHistogram()  # since the last timeline point
        self.ack_latency = LatencyHistogram()
        self.timeline: list[TimePoint] = []
        self.cpu_percent: float | None = None
        self.runq_wait_share: float | None = None  # of the send phase (Linux schedstat)
        self.gc_runs = 0  # collections of the driver's own GC from start to end of drain
        self.send_points = 0  # timeline points of the send phase (the rest are its drain)

    def result(self) -> Step:
        """The step as the results model has it, with the generator-limited verdict."""
        notes = []
        saturated = False
        if self.cpu_percent is not None and self.cpu_percent > CPU_LIMIT_PERCENT:
            notes.append(f"driver CPU {self.cpu_percent:.0f}% of one core > {CPU_LIMIT_PERCENT:g}%")
            saturated = True
        if self.sent and self.behind_sends > BEHIND_SHARE * self.sent:
            notes.append(
                f"{self.behind_sends} of {self.sent} sends left > {BEHIND_NS / 1e6:g} ms late"
                f" (> {BEHIND_SHARE:.0%})"
            )
        max_lag_ms = self.max_lag_ns / 1e6
        if max_lag_ms > MAX_LAG_LIMIT_MS:
            notes.append(f"max send lag {max_lag_ms:.1f} ms > {MAX_LAG_LIMIT_MS:g} ms")
        if self.runq_wait_share is not None and self.runq_wait_share > RUNQ_WAIT_LIMIT:
            saturated = True
            notes.append(
                f"driver waited for its core {self.runq_wait_share:.0%} of the time"
                f" (> {RUNQ_WAIT_LIMIT:.0%}): something else ran there"
            )
        return Step(
            driver="fast",
            name=self.name,
            connections=self.connections,
            offered_per_s=self.rate,
            duration_s=self.duration_s,
            sent=self.sent,
            delivered=self.delivered,
            expected=self.expected,
            sent_per_s=round(self.sent / self.duration_s, 1),
            delivered_per_s=round(self.delivered / self.duration_s, 1),
            latency_ms=self.latency.percentiles_ms(),
            errors=sum(n for k, n in self.errors.items() if k != "after_drain"),
            error_detail=dict(self.errors),
            retries=dict(self.retries),
            late_sends=self.late_sends,
            max_send_lag_ms=round(max_lag_ms, 3),
            generator_cpu_percent=(
                None if self.cpu_percent is None else round(self.cpu_percent, 1)
            ),
            generator_limited=bool(notes),
            generator_saturated=saturated,
            generator_gc_runs=self.gc_runs,
            generator_notes=notes,
            timeline=self.timeline,
            histogram=self.latency.encoded(),
            ack_latency_ms=self.ack_latency.percentiles_ms(),
            started_s=self.started_s,
            stall_s=[p.t_s for p in stalled_points(self.timeline[: self.send_points])],
        )


def summary_line(step: Step) -> str:
    """One human line for a finished step."""
    lat = step.latency_ms
    latency = (
        f"p50 {lat['p50']:.1f} p99 {lat['p99']:.1f} max {lat['max']:.1f} ms" if lat else "no data"
    )
    line = (
        f"{step.name}: sent {step.sent} ({step.sent_per_s:.0f}/s), delivered {step.delivered}"
        f" of {step.expected} ({step.delivered_per_s:.0f}/s), {latency}, errors {step.errors},"
        f" late sends {step.late_sends} (max lag {step.max_send_lag_ms:.1f} ms),"
        f" cpu {step.generator_cpu_percent or 0:.0f}%"
    )
    if step.generator_gc_runs:
        line += f", the driver's GC ran {step.generator_gc_runs} times in the step"
    if step.generator_limited:
        line += " GENERATOR-LIMITED: " + "; ".join(step.generator_notes)
    return line


# ---- connections --------------------------------------------------------------------------


class SetupError(Exception):
    """A connection could not be opened or joined; the message says why."""


class Connection(WSListener):  # type: ignore[misc]
    """One websocket: its send frame, and picows' callbacks for what it receives."""

    __slots__ = (
        "ack_sent_ns",
        "close_code",
        "digits",
        "driver",
        "frame",
        "index",
        "last_error",
        "members",
        "paused",
        "record_ack",
        "record_digits",
        "record_received_ns",
        "ref_digits",
        "seen",
        "send",
        "transport",
        "wake",
    )

    def __init__(
        self,
        driver: Driver,
        index: int,
        members: int,
        frame: bytearray,
        digits: slice,
        *,
        ref_digits: slice | None = None,
    ) -> None:
        super().__init__()
        self.driver = driver
        self.index = index
        self.members = members
        self.frame = frame
        self.digits = digits
        self.ref_digits = ref_digits
        self.record_digits = driver.delivery_digits.extend
        self.record_received_ns = driver.delivery_received_ns.append
        self.record_ack = driver.ack_us.append
        # scheduled times of sends not acked yet, in order (chat: one ack per send)
        self.ack_sent_ns: deque[int] = deque(maxlen=MAX_PENDING_ACKS if driver.acks else 0)
        self.transport: WSTransport | None = None
        self.send: Callable[..., None] = _not_connected
        self.paused = False
        self.seen: Counter[str] = Counter()
        self.wake: asyncio.Future[None] | None = None
        self.close_code = ""
        self.last_error = ""

    # picows callbacks ----------------------------------------------------------------------

    def on_ws_connected(self, transport: WSTransport) -> None:
        self.transport = transport
        self.send = transport.send

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        self.received(transport, frame, frame.get_payload_as_bytes())

    def received(self, transport: WSTransport, frame: WSFrame, payload: bytes) -> None:
        """The hot path: keep a delivery's digits and receive time (_flush parses them);
        anything else goes to :meth:`_other_frame`."""
        at = payload.find(MARKER)
        if at >= 0:
            self.record_digits(payload[at + _MARKER_LEN : at + _MARKER_END])
            self.record_received_ns(perf_counter_ns())
            return
        self._other_frame(transport, frame, payload)

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        self.driver.connection_lost(self)
        self._wake()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    # the rest ------------------------------------------------------------------------------

    def _other_frame(self, transport: WSTransport, frame: WSFrame, payload: bytes) -> None:
        """Anything but a delivery: acks, errors, the setup replies, close."""
        msg_type = frame.msg_type
        if msg_type == WSMsgType.CLOSE:
            self.close_code = str(frame.get_close_code().value)
            transport.send_close(frame.get_close_code(), frame.get_close_message())
            transport.disconnect()
            return
        if msg_type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return  # pings are answered by picows; pongs are not ours
        kind = self.driver.frame_kind(payload)
        if kind == "ack":
            if self.ack_sent_ns:
                self.record_ack((perf_counter_ns() - self.ack_sent_ns.popleft()) // 1000)
            return
        if kind == "presence":
            return
        self.seen[kind] += 1
        if kind == "error":
            if self.ack_sent_ns:
                self.ack_sent_ns.popleft()  # the send it answers will get no ack
            self.last_error, ref = self.driver.error_of(payload)
            self.driver.count_error(self.last_error)
            if self.last_error == "unavailable" and ref and self.ref_digits is not None:
                self.driver.retry_later(self.index, int(ref))
        elif kind not in ("welcome", "joined"):
            self.driver.count_error(f"unexpected {kind}")
        self._wake()

    def _wake(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    async def wait_for(self, kind: str) -> None:
        """Return once a frame of ``kind`` came; raise SetupError on an error frame or close."""
        while not self.seen[kind]:
            if self.seen["error"]:
                raise SetupError(f"connection {self.index}: {self.last_error} before {kind}")
            if self.transport is None or self.transport.is_disconnected:
                raise SetupError(f"connection {self.index}: closed before {kind}")
            self.wake = asyncio.get_running_loop().create_future()
            await self.wake

    def buffer_full(self) -> bool:
        """True when this connection holds more unsent bytes than :data:`MAX_BUFFERED_BYTES`."""
        assert self.transport is not None
        buffered = self.transport.underlying_transport.get_write_buffer_size()
        return bool(buffered > MAX_BUFFERED_BYTES)


def next_climb_rate(rate: float, held: float, broke: float, config: DriverConfig) -> float | None:
    """The climb's next rate after ``rate``, given the highest rate that held so far (0:
    none) and the lowest that broke (inf: none); None when the edge is found (within
    ``resolution``) or the climb hit ``max_rate`` or ``min_rate``."""
    if broke == math.inf:
        return None if rate >= config.max_rate else min(rate * config.factor, config.max_rate)
    if held == 0:
        return None if rate / config.factor < config.min_rate else rate / config.factor
    if broke / held <= 1 + config.resolution:
        return None
    return math.sqrt(held * broke)


def worth_a_rerun(step: Step, slo: dict[str, float]) -> bool:
    """A stalled step is run again when it held anyway, or when every second but the
    stalled ones kept the SLO's p99 (a passing stall, not an overload)."""
    if step.holds(slo):
        return True
    bound = slo.get("p99")
    calm = [p for p in step.timeline if p.t_s not in step.stall_s]
    return bound is not None and all(p.p99_ms is not None and p.p99_ms < bound for p in calm)


#: the permessage-deflate offer, as browsers make it (and websockets' client by default)
_DEFLATE_FACTORY = ClientPerMessageDeflateFactory(
    client_max_window_bits=True, compress_settings={"memLevel": 5}
)
DEFLATE_OFFER = build_extension([(_DEFLATE_FACTORY.name, _DEFLATE_FACTORY.get_request_params())])
_OPCODES = {WSMsgType.TEXT: Opcode.TEXT, WSMsgType.BINARY: Opcode.BINARY}
_DEFLATE_TAIL = b"\x00\x00\xff\xff"


def negotiated_deflate(extensions_header: str | None) -> PerMessageDeflate | None:
    """The compressor the server's ``Sec-WebSocket-Extensions`` reply agreed on, or None."""
    if not extensions_header:
        return None
    for name, params in parse_extension(extensions_header):
        if name == _DEFLATE_FACTORY.name:
            return _DEFLATE_FACTORY.process_response_params(params, [])
    return None


class DeflateConnection(Connection):
    """A :class:`Connection` that offered permessage-deflate (RFC 7692): once the server
    accepted it, what it sends is compressed (rsv1 set) and what arrives compressed is
    inflated, by websockets' sans-I/O :class:`PerMessageDeflate` (context takeover kept)."""

    __slots__ = ("deflate", "send_raw")

    def on_ws_connected(self, transport: WSTransport) -> None:
        super().on_ws_connected(transport)
        self.deflate = negotiated_deflate(
            transport.response.headers.get("Sec-WebSocket-Extensions")
        )
        if self.deflate is not None:
            self.send_raw = transport.send
            self.send = self._send_deflated

    def _send_deflated(self, msg_type: WSMsgType, message: bytes | bytearray) -> None:
        frame = self.deflate.encode(Frame(_OPCODES[msg_type], message))
        self.send_raw(msg_type, frame.data, True, True)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        payload = frame.get_payload_as_bytes()
        deflate = self.deflate
        if frame.rsv1 and deflate is not None:
            if frame.fin and frame.msg_type in _OPCODES:
                # the hot path, a whole compressed message: inflate it with the extension's
                # own decoder, without building websockets Frames (RFC 7692 7.2.2: append
                # the empty block's tail the sender removed)
                if deflate.remote_no_context_takeover:
                    deflate.decoder = zlib.decompressobj(wbits=-deflate.remote_max_window_bits)
                payload = deflate.decoder.decompress(payload + _DEFLATE_TAIL, MAX_FRAME_BYTES)
            else:
                compressed = Frame(_OPCODES[frame.msg_type], payload, frame.fin, True)
                payload = bytes(deflate.decode(compressed, max_size=MAX_FRAME_BYTES).data)
        self.received(transport, frame, payload)


def _runq_wait_ns() -> int | None:
    """Nanoseconds this thread has waited, runnable, for a CPU (None where Linux does not say)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _not_connected(*_: object) -> None:
    raise RuntimeError("send before the connection was opened")


# ---- the driver ---------------------------------------------------------------------------


class Driver:
    """Connections, the scheduler and the per-second bookkeeping of one run."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self.codec = get_codec(config.serializer)
        self.msg_type = WSMsgType.BINARY if self.codec.binary else WSMsgType.TEXT
        self.acks = config.target == "chat"
        self.frame_kind = frame_kind_reader(self.codec)
        # t_s = 0 on the perf_counter_ns clock: the caller's t0, or now
        self.origin_ns = perf_counter_ns()
        if config.t0_monotonic is not None:
            self.origin_ns -= int((time.monotonic() - config.t0_monotonic) * 1e9)
        self.process = psutil.Process()
        # since the last flush (a tenth of a second's worth): each delivery's scheduled
        # time (DIGITS ASCII digits) and receive time; each ack's latency in microseconds
        self.delivery_digits = bytearray()
        self.delivery_received_ns: array[int] = array("q")
        self.ack_us: array[int] = array("q")
        # deliveries scheduled before this count to earlier steps (or to the warmup)
        self.window_start_ns = 2**63
        self.connections: list[Connection] = []
        self.open_connections: list[Connection] = []
        self.closing = False
        self.current: StepRecorder | None = None
        self.finished: list[tuple[StepRecorder, Step]] = []
        self.next_connection = 0
        self.timer: WakeTimer  # made in run(): it needs the running loop
        # --retry: the connection now serving each index, sends to repeat (when, index,
        # scheduled time), and the reopenings under way
        self.by_index: dict[int, Connection] = {}
        self.retries_due: deque[tuple[int, int, int]] = deque()
        self._reopening: set[asyncio.Task[None]] = set()
        self.gc_runs = 0  # collections of this process' GC so far (Step.generator_gc_runs)
        gc.callbacks.append(self._count_collection)

    def _count_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.gc_runs += 1

    # connections ---------------------------------------------------------------------------

    def _room(self, index: int) -> tuple[str, int]:
        """Connection ``index``'s room and how many connections share it."""
        config = self.config
        k = index // config.room_size
        members = min(config.room_size, config.connections - k * config.room_size)
        return f"{config.room_prefix}-{k}", members

    async def _open(self, index: int, gate: asyncio.Semaphore) -> Connection:
        config = self.config
        room, members = self._room(index)
        frame, digits, ref_digits = send_frame(self.codec, room, config.body_chars, config.retry)
        kind = DeflateConnection if config.deflate else Connection
        conn = kind(self, index, members, frame, digits, ref_digits=ref_digits)
        url = config.url
        headers: dict[str, str] = {}
        if config.deflate:
            headers["Sec-WebSocket-Extensions"] = DEFLATE_OFFER
        if config.target == "relay":
            url += ("&" if "?" in url else "?") + f"room={room}"
        else:
            headers["Authorization"] = f"Bearer {config.tokens[index % len(config.tokens)]}"
            headers["Sec-WebSocket-Protocol"] = self.codec.subprotocol
        async with gate:
            try:
                async with asyncio.timeout(config.connect_timeout_s):
                    await ws_connect(
                        lambda: conn,
                        url,
                        extra_headers=headers,
                        websocket_handshake_timeout=config.connect_timeout_s,
                        max_frame_size=MAX_FRAME_BYTES,
                    )
                    if config.target == "chat":
                        await conn.wait_for("welcome")
                        conn.send(self.msg_type, self.codec.encode_client(Join(room=room)))
                        await conn.wait_for("joined")
            except WSHandshakeError as exc:
                status = exc.response.status if exc.response is not None else "?"
                body = (exc.raw_body or b"").decode(errors="replace").strip()
                raise SetupError(f"connection {index}: HTTP {status} {body or exc}") from None
            except (OSError, TimeoutError) as exc:
                raise SetupError(f"connection {index}: {exc!r}") from None
        return conn

    async def connect_all(self) -> None:
        """Open (and for chat join) every connection; raise SetupError if any fails."""
        gate = asyncio.Semaphore(64)
        opened = await asyncio.gather(
            *(self._open(i, gate) for i in range(self.config.connections)),
            return_exceptions=True,
        )
        self.connections = [c for c in opened if isinstance(c, Connection)]
        failures = [c for c in opened if isinstance(c, BaseException)]
        if failures:
            await self.close_all()
            raise SetupError(f"{len(failures)} of {len(opened)} failed; first: {failures[0]}")
        self.open_connections = list(self.connections)
        self.by_index = {c.index: c for c in self.connections}

    def connection_lost(self, conn: Connection) -> None:
        """picows: ``conn`` is gone; unless we are closing, that is an error (and with
        ``--retry`` the connection is opened again)."""
        if conn in self.open_connections:
            self.open_connections = [c for c in self.open_connections if c is not conn]
        if not self.closing and self.current is not None:
            self.count_error(f"closed {conn.close_code or 'abnormally'}")
        if self.config.retry and not self.closing and self.by_index.get(conn.index) is conn:
            task = asyncio.ensure_future(self._reopen(conn))
            self._reopening.add(task)
            task.add_done_callback(self._reopening.discard)

    # --retry ------------------------------------------------------------------------------

    def retry_later(self, index: int, scheduled_ns: int) -> None:
        """Send connection ``index``'s send of ``scheduled_ns`` again after RETRY_AFTER_S."""
        self.retries_due.append((perf_counter_ns() + int(RETRY_AFTER_S * 1e9), index, scheduled_ns))

    def resend(self, conn: Connection, scheduled_ns: int, why: str) -> None:
        """Send again, with its ref and scheduled time, a send not acked."""
        assert conn.ref_digits is not None
        frame = conn.frame
        digits = b"%019d" % scheduled_ns
        frame[conn.digits] = digits
        frame[conn.ref_digits] = digits
        conn.send(self.msg_type, frame)
        conn.ack_sent_ns.append(scheduled_ns)
        if self.current is not None:
            self.current.retries[why] += 1

    async def retry_loop(self) -> None:
        """Every 50 ms, send again what ``unavailable`` answered (on the index's open
        connection; later if it is being reopened)."""
        while True:
            await asyncio.sleep(0.05)
            now = perf_counter_ns()
            due = self.retries_due
            for _ in range(len(due)):
                if due[0][0] > now:
                    break
                _, index, scheduled_ns = due.popleft()
                conn = self.by_index.get(index)
                if conn is not None and conn in self.open_connections:
                    self.resend(conn, scheduled_ns, "after_unavailable")
                else:
                    due.append((now + int(RETRY_AFTER_S * 1e9), index, scheduled_ns))

    async def _reopen(self, old: Connection) -> None:
        """Open connection ``old.index`` again (until closing) and resend what it had
        not seen acked."""
        gate = asyncio.Semaphore(1)
        while not self.closing:
            try:
                conn = await self._open(old.index, gate)
                break
            except SetupError:
                await asyncio.sleep(0.2)
        else:
            return
        self.by_index[old.index] = conn
        self.connections.append(conn)
        self.open_connections = [*self.open_connections, conn]
        if self.current is not None:
            self.current.retries["reconnects"] += 1
        pending, old.ack_sent_ns = list(old.ack_sent_ns), deque()
        for scheduled_ns in pending:
            self.resend(conn, scheduled_ns, "after_reconnect")

    async def close_all(self) -> None:
        """Close every connection (1000), waiting at most :data:`CLOSE_TIMEOUT_S`."""
        self.closing = True
        transports = [c.transport for c in self.connections if c.transport is not None]
        for transport in transports:
            transport.send_close(WSCloseCode.OK)
        waits = [asyncio.ensure_future(t.wait_disconnected()) for t in transports]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=CLOSE_TIMEOUT_S)
            for wait in pending:
                wait.cancel()
        for transport in transports:
            transport.disconnect(graceful=False)

    # receiving -----------------------------------------------------------------------------

    def count_error(self, key: str) -> None:
        """Count one error in the current step (or the first step, during the warmup)."""
        if self.current is not None:
            self.current.errors[key] += 1

    def error_code(self, payload: bytes) -> str:
        """The ``code`` of an error frame."""
        return self.error_of(payload)[0]

    def error_of(self, payload: bytes) -> tuple[str, str | None]:
        """The ``code`` and ``ref`` of an error frame."""
        try:
            error = decode_frame(self.codec, payload)
        except Exception:  # an undecodable error frame is still an error
            return "undecodable error", None
        return str(getattr(error, "code", "error")), getattr(error, "ref", None)

    def _count_after_drain(self, scheduled_ns: np.ndarray) -> None:
        """Deliveries scheduled before the current step: after their own step's drain."""
        for recorder, step in self.finished:
            late = int(
                ((scheduled_ns >= recorder.start_ns) & (scheduled_ns < recorder.end_ns)).sum()
            )
            if late:
                step.error_detail["after_drain"] = step.error_detail.get("after_drain", 0) + late

    # sending -------------------------------------------------------------------------------

    async def send_schedule(self, rate: float, recorder: StepRecorder) -> None:
        """Send ``rate``/s from ``recorder.start_ns`` to ``recorder.end_ns``, each at its time.

        Round-robin over the open connections; a late wake-up sends the backlog with the
        original scheduled times; ``recorder`` gets the counts at each wake-up.
        """
        interval_ns = 1e9 / rate
        start_ns = recorder.start_ns
        total = math.ceil((recorder.end_ns - start_ns) / interval_ns)
        msg_type = self.msg_type
        k = 0
        i = self.next_connection
        sent = expected = late = behind = 0
        max_lag = recorder.max_lag_ns
        timer = self.timer
        while k < total:
            conns = self.open_connections
            if not conns:
                return
            n = len(conns)
            batch = 0
            now = perf_counter_ns()
            due = start_ns + int(k * interval_ns)
            while due <= now and batch < MAX_BATCH:
                conn = conns[i % n]
                i += 1
                k += 1
                batch += 1
                if conn.paused and conn.buffer_full():
                    self.count_error("send_buffer_full")
                else:
                    frame = conn.frame
                    digits = b"%019d" % due
                    frame[conn.digits] = digits
                    if conn.ref_digits is not None:
                        frame[conn.ref_digits] = digits
                    conn.send(msg_type, frame)
                    conn.ack_sent_ns.append(due)
                    sent += 1
                    expected += conn.members
                    lag = now - due
                    if lag > LATE_NS:
                        late += 1
                        if lag > BEHIND_NS:
                            behind += 1
                        max_lag = max(max_lag, lag)
                if k == total:
                    break
                due = start_ns + int(k * interval_ns)
                now = perf_counter_ns()
            recorder.sent += sent
            recorder.expected += expected
            recorder.late_sends += late
            recorder.behind_sends += behind
            recorder.max_lag_ns = max_lag
            sent = expected = late = behind = 0
            self.next_connection = i % n
            if batch >= MAX_BATCH:
                await asyncio.sleep(0)
            elif k < total:
                await timer.sleep_until(max(due, now + MIN_WAKE_INTERVAL_NS))

    # steps ---------------------------------------------------------------------------------

    def _flush(self, recorder: StepRecorder) -> None:
        """Count what arrived since the last flush into ``recorder`` (deliveries and acks)."""
        scheduled_ns = parse_times(bytes(self.delivery_digits))
        del self.delivery_digits[:]
        received_ns = _take(self.delivery_received_ns)
        in_window = scheduled_ns >= self.window_start_ns
        if not in_window.all():
            self._count_after_drain(scheduled_ns[~in_window])
        deliveries_us = (received_ns[in_window] - scheduled_ns[in_window]) // 1000
        recorder.point_latency.add(deliveries_us)
        recorder.delivered += len(deliveries_us)
        recorder.ack_latency.add(_take(self.ack_us))

    def _time_point(self, recorder: StepRecorder, since_ns: int, now_ns: int) -> None:
        """Close the timeline point since ``since_ns``: its rates and percentiles."""
        point = recorder.point_latency
        delivered = point.count
        seconds = (now_ns - since_ns) / 1e9
        recorder.timeline.append(
            TimePoint(
                t_s=round((now_ns - self.origin_ns) / 1e9, 3),
                users=len(self.open_connections),
                sent_per_s=round((recorder.sent - recorder.sent_at_point) / seconds, 1),
                delivered_per_s=round(delivered / seconds, 1),
                p50_ms=point.value_at_percentile(50) / 1000 if delivered else None,
                p99_ms=point.value_at_percentile(99) / 1000 if delivered else None,
                max_ms=point.percentiles_ms()["max"] if delivered else None,
            )
        )
        recorder.sent_at_point = recorder.sent
        point.merge_into(recorder.latency)

    async def run_step(
        self, rate: float, recorder: StepRecorder, drain_s: float, *, recorded: bool = True
    ) -> None:
        """Send at ``rate`` for the step, then drain; the recorder holds the results.

        Arrivals are counted every :data:`FLUSH_INTERVAL_NS` (short pauses, not one long
        one a second), a timeline point closes every :data:`POINT_INTERVAL_NS`. With
        ``recorded`` False (the warmup) no delivery counts: they all arrive outside the
        window of a recorded step.
        """
        gc.collect()  # the last step's garbage, before this one's window
        gc.disable()
        runs_before = self.gc_runs
        try:
            await self._run_step(rate, recorder, drain_s, recorded=recorded)
        finally:
            gc.enable()
            recorder.gc_runs = self.gc_runs - runs_before

    async def _run_step(
        self, rate: float, recorder: StepRecorder, drain_s: float, *, recorded: bool
    ) -> None:
        start_ns = perf_counter_ns()
        if recorded:
            self.window_start_ns = start_ns
        recorder.start_ns = start_ns
        if self.config.t0_monotonic is not None:
            recorder.started_s = round((start_ns - self.origin_ns) / 1e9, 3)
        end_ns = recorder.end_ns = start_ns + int(recorder.duration_s * 1e9)
        stop_ns = end_ns + int(drain_s * 1e9)
        self.current = recorder
        cpu_before = self.process.cpu_times()
        runq_before_ns = _runq_wait_ns()
        sender = asyncio.ensure_future(self.send_schedule(rate, recorder))
        every = range(start_ns + FLUSH_INTERVAL_NS, stop_ns, FLUSH_INTERVAL_NS)
        flushes = sorted({*every, end_ns, stop_ns})
        point_ns = start_ns
        for flush_ns in flushes:
            await asyncio.sleep(max(0, flush_ns - perf_counter_ns()) / 1e9)
            if flush_ns == end_ns:
                await sender
                cpu_after = self.process.cpu_times()
                used_s = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
                elapsed_ns = perf_counter_ns() - start_ns
                recorder.cpu_percent = 100 * used_s / (elapsed_ns / 1e9)
                runq_after_ns = _runq_wait_ns()
                if runq_before_ns is not None and runq_after_ns is not None:
                    recorder.runq_wait_share = (runq_after_ns - runq_before_ns) / elapsed_ns
            self._flush(recorder)
            if (flush_ns - start_ns) % POINT_INTERVAL_NS == 0 or flush_ns in (end_ns, stop_ns):
                now_ns = perf_counter_ns()
                self._time_point(recorder, point_ns, now_ns)
                point_ns = now_ns
            if flush_ns <= end_ns:
                recorder.send_points = len(recorder.timeline)
        await sender

    async def run(self) -> int:
        """Connect, warm up, run every step, close; return the exit status."""
        self.timer = WakeTimer()
        try:
            await self.connect_all()
        except SetupError as exc:
            print(f"driver: could not open the connections: {exc}", file=sys.stderr)
            self.timer.close()
            return EXIT_CONNECT_FAILED
        log.info("%d connections open", len(self.connections))
        gc.collect()
        gc.freeze()  # the connections' objects: no collection walks them again
        retrying = asyncio.ensure_future(self.retry_loop()) if self.config.retry else None
        try:
            await self._run_steps()
        finally:
            self.current = None
            if retrying is not None:
                retrying.cancel()
            for task in list(self._reopening):
                task.cancel()
            await self.close_all()
            self.timer.close()
        return EXIT_OK

    async def _run_steps(self) -> None:
        config = self.config
        steps: list[Step] = []
        first = StepRecorder(
            f"rate {config.rates[0]:g}/s", config.rates[0], config.step_s, config.connections
        )
        if config.warmup_s > 0:
            warmup = StepRecorder("warmup", config.rates[0], config.warmup_s, config.connections)
            warmup.errors = first.errors  # errors while warming up count to the first step
            self.current = warmup
            await self.run_step(config.rates[0], warmup, drain_s=0, recorded=False)
        if config.climb_slo is not None:
            await self._climb(config.climb_slo, first, steps)
            return
        for index, rate in enumerate(config.rates):
            await self._recorded_step(rate, first if index == 0 else None, steps)

    async def _recorded_step(
        self, rate: float, recorder: StepRecorder | None, steps: list[Step]
    ) -> Step:
        """Run one recorded step at ``rate``; its Step, appended to ``steps`` and written."""
        config = self.config
        if recorder is None:
            recorder = StepRecorder(f"rate {rate:g}/s", rate, config.step_s, config.connections)
        await self.run_step(rate, recorder, config.drain_s)
        step = recorder.result()
        step.body_chars = config.body_chars
        step.frame_bytes = len(self.connections[0].frame) if self.connections else 0
        step.deflate = bool(self.connections) and all(
            getattr(c, "deflate", None) is not None for c in self.connections
        )
        self.finished.append((recorder, step))
        steps.append(step)
        print(summary_line(step), file=sys.stderr, flush=True)
        self.write(steps)
        return step

    async def _climb(self, slo: dict[str, float], first: StepRecorder, steps: list[Step]) -> None:
        """Find the knee: multiply the rate by ``factor`` while the SLO holds, then bisect
        (geometrically) between the last held and the first broken rate until they are
        within ``resolution``. A stalled step (:func:`stalled_points`) that held, or that
        broke only in its stalled seconds, is run once more and the re-run decides. A step
        that held while the driver was saturated (its core full, or waiting for it) ends the
        climb: the knee is beyond it."""
        config = self.config
        held, broke = 0.0, math.inf
        rate = config.rates[0]
        recorder: StepRecorder | None = first
        while True:
            rate = round(rate)
            step = await self._recorded_step(rate, recorder, steps)
            recorder = None
            if step.stall_s and worth_a_rerun(step, slo):
                step.superseded = True
                await self._settle()
                step = await self._recorded_step(rate, None, steps)
                step.rerun = True
                self.write(steps)
            if step.holds(slo):
                held = max(held, rate)
                if step.generator_saturated:
                    return  # the driver, not the target, is the limit: higher says nothing
            else:
                broke = min(broke, rate)
                await self._settle()
            following = next_climb_rate(rate, held, broke, config)
            if following is None:
                return
            rate = following

    async def _settle(self) -> None:
        """Wait until nothing has arrived for :data:`SETTLE_QUIET_S` (at most
        :data:`SETTLE_MOST_S`): a step after an overload starts on a server that caught up."""
        deadline = perf_counter_ns() + int(SETTLE_MOST_S * 1e9)
        while perf_counter_ns() < deadline:
            before = len(self.delivery_received_ns) + len(self.ack_us)
            await asyncio.sleep(SETTLE_QUIET_S)
            if len(self.delivery_received_ns) + len(self.ack_us) == before:
                return

    def write(self, steps: list[Step]) -> None:
        """Write ``--json-out`` (atomically), if asked."""
        path = self.config.json_out
        if path is None:
            return
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps([asdict(s) for s in steps], indent=1))
        tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """Run the driver with the command line's options; return the exit status."""
    config = parse_args(argv)
    logging.getLogger("picows").setLevel(logging.WARNING)  # it logs every connection at INFO
    # picows' transports warn once per write to a peer that reset, until its close is handled
    logging.getLogger("aiofastnet").setLevel(logging.ERROR)
    pin_cpus(config.cores)
    raise_open_files_limit(config.connections)
    with asyncio.Runner(loop_factory=loop_factory(config.event_loop)) as runner:
        return runner.run(Driver(config).run())


if __name__ == "__main__":
    sys.exit(main())
