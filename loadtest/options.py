"""The options ``loadtest/chat.py`` adds to Locust's command line, parsed and checked once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chat_server.codecs import CODEC_NAMES
from loadtest.profiles import (
    PROFILES,
    Schedule,
    parse_pause,
    parse_slo,
    parse_stages,
)

DEFAULT_AUTH_URL = "http://127.0.0.1:8001"


def add_arguments(parser: Any, **_kwargs: Any) -> None:
    """Add the locustfile's options to Locust's parser (on ``init_command_line_parser``)."""
    parser.add_argument(
        "--load-profile",
        choices=list(PROFILES),
        default="gentle",
        help="named load profile: "
        + "; ".join(f"{p.name}: {p.description}" for p in PROFILES.values())
        + " [gentle]",
    )
    parser.add_argument(
        "--stages",
        default="",
        help="custom stage table DURATION:USERS[@RATE][:quiet],... e.g. 30s:20@5,60s:20,30s:0 "
        "(overrides --load-profile's stages; a quiet tail is appended unless the last is quiet)",
    )
    parser.add_argument(
        "--pause",
        default="",
        help="seconds between one user's sends, MIN-MAX (default: the profile's)",
    )
    parser.add_argument(
        "--auth-url",
        default=DEFAULT_AUTH_URL,
        help="auth service, or its replicas comma-separated (round robin; a replica that "
        f"refuses the connection or answers 503 is passed for the next) [{DEFAULT_AUTH_URL}]",
    )
    parser.add_argument(
        "--ca-file",
        default="",
        help="PEM CA certificates that verify a wss:// host and an https:// --auth-url "
        "[the system's CAs]",
    )
    parser.add_argument(
        "--auth-mode",
        choices=["login", "prelogin"],
        default="login",
        help="login: each user logs in as it starts; prelogin: all tokens first, "
        "users idle until everyone is connected [login]",
    )
    parser.add_argument(
        "--token-file",
        default="",
        help="JSON {username: token}: take tokens from it instead of the auth service",
    )
    parser.add_argument("--room-size", type=int, default=10, help="users per room [10]")
    parser.add_argument(
        "--slo",
        default="",
        help="fanout thresholds in ms, e.g. p90=200,p95=500,p99=1000: exit 1 if broken",
    )
    parser.add_argument(
        "--target",
        choices=["chat", "relay"],
        default="chat",
        help="chat: the chat server; relay: python -m bench.relay (measures this generator) [chat]",
    )
    parser.add_argument(
        "--serializer",
        choices=list(CODEC_NAMES),
        default="orjson",
        help="the chat server's SERIALIZER (json and orjson speak JSON) [orjson]",
    )
    parser.add_argument(
        "--user-prefix", default="load", help="user names are PREFIX0, PREFIX1... [load]"
    )
    parser.add_argument(
        "--deflate",
        choices=["on", "off"],
        default="on",
        help="offer permessage-deflate, as browsers do (used only if the server's WS_DEFLATE "
        "is on or shared) [on]",
    )
    parser.add_argument(
        "--delivery-report",
        default="",
        help="write delivery counts, generator load and the verdict to this JSON file",
    )


@dataclass(frozen=True)
class Options:
    """The custom options, parsed and checked once per run."""

    target: str
    stages_source: str
    schedule: Schedule
    pause_s: tuple[float, float]
    auth_url: str
    ca_file: str
    auth_mode: str
    token_file: str
    room_size: int
    slo: dict[str, tuple[float, float]]
    serializer: str
    user_prefix: str
    delivery_report: str
    deflate: bool


def resolve_options(parsed: Any) -> Options:
    """Build :class:`Options` from Locust's parsed options; ValueError names a bad one.

    Stages come from ``--stages``, else from ``--load-profile``; the pause from
    ``--pause``, else from the profile. (Locust's ``-u``/``-r``/``-t`` do not apply: the
    stage table decides, and Locust says so when they are given.)
    """
    profile = PROFILES[parsed.load_profile]
    if parsed.stages:
        stages, source = parse_stages(parsed.stages), f"--stages {parsed.stages}"
    else:
        stages, source = profile.stages, f"profile {profile.name}"
    if parsed.room_size < 1:
        raise ValueError(f"--room-size {parsed.room_size}: must be 1 or more")
    if parsed.ca_file and not Path(parsed.ca_file).is_file():
        raise ValueError(f"--ca-file {parsed.ca_file}: no such file (PEM CA certificates)")
    return Options(
        target=parsed.target,
        stages_source=source,
        schedule=Schedule(stages),
        pause_s=parse_pause(parsed.pause) if parsed.pause else profile.pause_s,
        auth_url=parsed.auth_url,
        ca_file=parsed.ca_file,
        auth_mode=parsed.auth_mode,
        token_file=parsed.token_file,
        room_size=parsed.room_size,
        slo=parse_slo(parsed.slo),
        serializer=parsed.serializer,
        user_prefix=parsed.user_prefix,
        delivery_report=parsed.delivery_report,
        deflate=parsed.deflate == "on",
    )
