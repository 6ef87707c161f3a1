"""The driver's settings: :class:`DriverConfig`, read and checked once from the command line."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from bench.lab.driver.frames import MIN_BODY_CHARS
from bench.lab.results import parse_slo
from chat_server.codecs import CODEC_NAMES
from chatlab.settings import parse_core_list

TARGETS = ("chat", "relay")
DEFAULT_URLS = {"chat": "ws://127.0.0.1:8000/ws", "relay": "ws://127.0.0.1:8765/ws"}
#: what ``--help`` says the driver does (the second paragraph of :mod:`bench.lab.driver`)
DESCRIPTION = """It opens ``--connections`` websockets to a chat server or to the bare relay, puts
them in rooms of ``--room-size`` and sends ``send`` frames at fixed total rates
(``--rates``, one step each), measuring fan-out latency at every room member."""


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
    # steps back to back: a delivery counts to the step it arrives in, whichever step
    # scheduled it (one timeline across a rate change, bench.overload)
    continuous: bool = False
    deflate: bool = False  # offer permessage-deflate (RFC 7692) as browsers do
    climb_slo: dict[str, float] | None = None  # climb to the knee instead of fixed rates
    factor: float = 1.4  # climb: rate multiplier while the SLO holds
    resolution: float = 0.05  # climb: stop when first broken / last held <= 1 + this
    max_rate: float = math.inf  # climb: never offer more than this
    min_rate: float = 1.0  # climb: never offer less than this
    # fixed-rate steps before the climb or the rates, to measure what a frame costs there
    cost_rates: tuple[float, ...] = ()
    cost_step_s: float = 4.0
    # after a climb: one step of sustain_s at sustain_share of the knee (0: none)
    sustain_s: float = 0.0
    sustain_share: float = 0.9
    # whose CPU each step's window reads: the server's process tree, and the lab's (its
    # caller: everything under it is not "other processes")
    server_pid: int | None = None
    lab_pid: int | None = None
    # the server's own cores: each step's window reads their busy time and steal too
    # (what else ran where the server runs); a climb step whose server core was busy is
    # measured again, at most ``busy_reruns`` times (bench.lab.machine.core_load)
    server_cores: tuple[int, ...] | None = None
    busy_reruns: int = 2
    # servers of the lab that share the server's cores, idle meanwhile (a paired cost
    # phase): their CPU over each window is read apart from the server's
    neighbour_pids: tuple[int, ...] = ()
    # a wss:// URL's certificate is verified against this PEM CA file ("": the system's)
    ca_file: str = ""
    # a proxy in front of the server (HAProxy terminating TLS): its CPU is read over each
    # window apart from the server's
    proxy_pid: int | None = None


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
        description=DESCRIPTION,
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
        "--continuous",
        action="store_true",
        help="steps are one window: a delivery counts to the step (and timeline second)"
        " it arrives in, whichever step sent it, so a backlog left by one rate shows in"
        " the next step's latency (use with --drain-s 0); a step's delivered then differs"
        " from its expected [off: to the step that sent it, during its drain]",
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
    parser.add_argument(
        "--cost-rates",
        type=_rates,
        default=(),
        help="fixed rates run first (after the warmup), one step of --cost-step-s each, "
        "named 'cost RATE/s': what a frame costs the server there (with --server-pid) [none]",
    )
    parser.add_argument("--cost-step-s", type=float, default=4.0, help="seconds per cost step [4]")
    parser.add_argument(
        "--sustain-s",
        type=float,
        default=0.0,
        help="after a climb, hold --sustain-share of the knee this long, named "
        "'sustain RATE/s': whether the knee holds sustained or only in bursts [0: no]",
    )
    parser.add_argument(
        "--sustain-share", type=float, default=0.9, help="of the knee, for --sustain-s [0.9]"
    )
    parser.add_argument(
        "--server-pid",
        type=int,
        help="read this process tree's CPU over each step's send phase: the server's CPU "
        "µs per delivered frame [not read]",
    )
    parser.add_argument(
        "--proxy-pid",
        type=int,
        help="a proxy between driver and server (--url is the proxy's): read its process "
        "tree's CPU over each step's send phase apart from the server's [none]",
    )
    parser.add_argument(
        "--ca-file",
        default="",
        help="PEM CA certificates that verify a wss:// --url [the system's CAs]",
    )
    parser.add_argument(
        "--lab-pid",
        type=int,
        help="the process tree whose CPU is not 'other processes' (the lab that started "
        "server and driver) [the server's tree and the driver]",
    )
    parser.add_argument(
        "--server-cores",
        default="off",
        help="the server's cores: each step also reads their busy time and steal, and a "
        "climb step during which something else kept them busy is measured again (at most "
        "twice) [off: not read]",
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
    if args.sustain_s < 0 or not 0 < args.sustain_share <= 1:
        parser.error("--sustain-s must be 0 or more and 0 < --sustain-share <= 1")
    if not args.cost_step_s > 0:
        parser.error(f"--cost-step-s {args.cost_step_s}: allowed: more than 0")
    for name in ("server_pid", "lab_pid", "proxy_pid"):
        pid = getattr(args, name)
        if pid is not None and not psutil.pid_exists(pid):
            parser.error(f"--{name.replace('_', '-')} {pid}: no such process")
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
    if args.ca_file and not Path(args.ca_file).is_file():
        parser.error(f"--ca-file {args.ca_file}: no such file (PEM CA certificates)")
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
    try:
        server_cores = parse_core_list(args.server_cores)
    except ValueError as exc:
        parser.error(f"--server-cores {args.server_cores!r}: {exc}")
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
        continuous=args.continuous,
        connect_timeout_s=args.connect_timeout_s,
        t0_monotonic=args.t0_monotonic,
        deflate=args.deflate == "on",
        climb_slo=climb_slo,
        factor=args.factor,
        resolution=args.resolution,
        max_rate=args.max_rate,
        min_rate=args.rates[0] / args.factor**4,
        cost_rates=args.cost_rates,
        cost_step_s=args.cost_step_s,
        sustain_s=args.sustain_s,
        sustain_share=args.sustain_share,
        server_pid=args.server_pid,
        lab_pid=args.lab_pid,
        server_cores=server_cores,
        ca_file=args.ca_file,
        proxy_pid=args.proxy_pid,
    )


@dataclass(frozen=True)
class DriverArgs:
    """One driver run as its caller describes it; :meth:`argv` is its command line, the
    one builder the lab and ``bench.tail`` share (:func:`parse_args` reads it back to
    the same values: a test holds them together). Unset options keep the driver's
    defaults."""

    target: str
    url: str
    connections: int
    rates: tuple[float, ...]
    step_s: float
    warmup_s: float
    drain_s: float
    cpu_affinity: str = "off"
    room_size: int = 10
    serializer: str = "orjson"
    token_file: Path | None = None
    json_out: Path | None = None
    t0_monotonic: float | None = None
    deflate: bool = False
    climb: str = ""  # an SLO such as "p99=100": climb instead of the rates
    factor: float | None = None
    resolution: float | None = None
    max_rate: float | None = None
    cost_rates: tuple[float, ...] = ()
    cost_step_s: float | None = None
    sustain_s: float | None = None
    server_pid: int | None = None
    lab_pid: int | None = None
    retry: bool = False
    continuous: bool = False
    server_cores: str = "off"
    body_chars: int | None = None
    ca_file: str = ""
    proxy_pid: int | None = None

    def argv(self) -> list[str]:
        """The driver's arguments (after ``python -m bench.lab.driver``)."""
        args = [
            *("--target", self.target, "--url", self.url),
            *("--connections", str(self.connections), "--room-size", str(self.room_size)),
            *("--rates", ",".join(f"{r:g}" for r in self.rates)),
            *("--step-s", f"{self.step_s:g}", "--warmup-s", f"{self.warmup_s:g}"),
            *("--drain-s", f"{self.drain_s:g}", "--cpu-affinity", self.cpu_affinity),
        ]
        if self.server_cores != "off":
            args += ["--server-cores", self.server_cores]
        if self.target == "chat":
            args += ["--serializer", self.serializer]
        optional = {
            "--token-file": self.token_file,
            "--json-out": self.json_out,
            "--t0-monotonic": None if self.t0_monotonic is None else repr(self.t0_monotonic),
            "--climb": self.climb or None,
            "--factor": self.factor,
            "--resolution": self.resolution,
            "--max-rate": self.max_rate,
            "--cost-rates": ",".join(f"{r:g}" for r in self.cost_rates) or None,
            "--cost-step-s": self.cost_step_s,
            "--sustain-s": self.sustain_s,
            "--server-pid": self.server_pid,
            "--lab-pid": self.lab_pid,
            "--body-chars": self.body_chars,
            "--ca-file": self.ca_file or None,
            "--proxy-pid": self.proxy_pid,
        }
        for flag, value in optional.items():
            if value is not None:
                args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        if self.deflate:
            args += ["--deflate", "on"]
        if self.retry:
            args.append("--retry")
        if self.continuous:
            args.append("--continuous")
        return args

    def command(self) -> list[str]:
        """The whole command line, with this Python."""
        return [sys.executable, "-m", "bench.lab.driver", *self.argv()]
