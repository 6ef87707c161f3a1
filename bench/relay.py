"""``python -m bench.relay``: websocket relays doing the least work, the transport alone.

Each serves ``ws://HOST:PORT/ws?room=NAME`` with no token, no codec and no store, and
relays every message it receives, verbatim (text as text, binary as binary), to every
member of the sender's room, the sender included; a message sent in several frames is
relayed as one. ``GET /healthz`` answers 200, another path 404, ``/ws`` without
``?room=`` is upgraded and closed with 1008. ``--transport`` picks the library,
``--mode`` how frames are written: the transport's idiomatic API (the default:
``recv-broadcast`` on websockets' asyncio server, ``per-frame-send`` on picows), or
``coalesced``, each message framed once and one write per member per loop iteration,
as the chat server writes (websockets: bench.relay_sansio, its sans-I/O protocol in
an asyncio.Protocol; picows: bench.relay_picows): the transport's floor.

A member too far behind is closed with 1013 rather than growing memory, except on
``recv-broadcast``: it uses ``websockets.broadcast``, which has no backpressure and no
bound (compression off unless ``--deflate on``, which accepts permessage-deflate as the
chat server does; the other modes never negotiate it).

Exit status: 0 after SIGTERM or SIGINT, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, broadcast, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from bench.relay_base import CLOSE_POLICY, DEFAULT_MODES, MAX_MESSAGE_BYTES, MODES, WS_PATH
from chat_server.runtime import on_stop_signals, pin_cpus, raise_open_files_limit
from chat_server.transport.websockets import permessage_deflate
from chatlab.loops import loop_factory
from chatlab.settings import parse_core_list

log = logging.getLogger("bench.relay")

#: connections the open-files limit is raised for
MAX_CONNECTIONS = 10_000
#: ``--transport`` values; websockets is the default
TRANSPORTS = ("websockets", "picows")


class Relay:
    """Rooms of open connections; a frame from a member goes to all members of its room."""

    def __init__(self) -> None:
        self.rooms: dict[str, set[ServerConnection]] = {}
        self.frames_in = 0

    async def handle(self, conn: ServerConnection) -> None:
        """Relay this connection's frames to its room until it closes; then leave the room."""
        assert conn.request is not None
        room = parse_qs(urlsplit(conn.request.path).query).get("room", [""])[0]
        if not room:
            await conn.close(CLOSE_POLICY, "missing ?room=")
            return
        members = self.rooms.setdefault(room, set())
        members.add(conn)
        try:
            async for frame in conn:
                self.frames_in += 1
                broadcast(members, frame)
        except ConnectionClosed:
            pass  # a client that vanished without a close frame: normal under load tests
        finally:
            members.discard(conn)
            if not members:
                del self.rooms[room]


def _process_request(conn: ServerConnection, request: Request) -> Response | None:
    """Answer ``/healthz``; refuse any path but ``/ws`` with 404; let ``/ws`` upgrade."""
    path = urlsplit(request.path).path
    if path == "/healthz":
        return conn.respond(HTTPStatus.OK, "ok\n")
    if path != WS_PATH:
        return conn.respond(HTTPStatus.NOT_FOUND, "not found\n")
    return None


async def run(host: str, port: int, deflate: bool = False) -> int:
    """Serve until SIGTERM or SIGINT (compressing when ``deflate`` and the client offers it)."""
    relay = Relay()
    stop = asyncio.Event()
    on_stop_signals(stop.set)
    async with serve(
        relay.handle,
        host,
        port,
        compression=None,
        extensions=[permessage_deflate()] if deflate else None,
        process_request=_process_request,
        max_size=MAX_MESSAGE_BYTES,
        ping_interval=None,
    ) as server:
        bound = ", ".join(f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s in server.sockets)
        log.info("relay listening on %s (ws path %s?room=NAME)", bound, WS_PATH)
        await stop.wait()
    log.info("relay stopped after %d frames in", relay.frames_in)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; a bad ``--cpu-affinity`` or ``--port`` exits 2 naming it."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.relay",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        epilog="modes (--mode):\n"
        + "\n".join(
            f"  {mode:<15} {what} [{', '.join(transports)}]"
            for mode, (what, transports) in MODES.items()
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1]")
    parser.add_argument("--port", type=int, default=8765, help="port to listen on [8765]")
    parser.add_argument(
        "--cpu-affinity",
        default="off",
        help="pin the relay to these cores: off, 0, 0,1, 0-1 [off]",
    )
    parser.add_argument(
        "--event-loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="event loop implementation [uvloop]",
    )
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="websockets",
        help="websocket library serving the relay [websockets]",
    )
    parser.add_argument(
        "--mode",
        choices=tuple(MODES),
        default=None,
        help="how frames are written (see modes below)"
        " [recv-broadcast on websockets, per-frame-send on picows]",
    )
    parser.add_argument(
        "--deflate",
        choices=("on", "off"),
        default="off",
        help="accept permessage-deflate as the chat server does (recv-broadcast only) [off]",
    )
    parser.add_argument("--log-level", default="info", help="logging level [info]")
    args = parser.parse_args(argv)
    if args.mode is None:
        args.mode = DEFAULT_MODES[args.transport]
    if args.transport not in MODES[args.mode][1]:
        parser.error(f"--mode {args.mode}: runs on {', '.join(MODES[args.mode][1])} only")
    if args.deflate == "on" and args.transport == "picows":
        parser.error("--deflate on: the picows relay has no permessage-deflate")
    if args.deflate == "on" and args.mode != "recv-broadcast":
        parser.error(
            f"--deflate on: the {args.mode} relay frames each message once for every member"
        )
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: allowed 0-65535")
    try:
        args.cores = parse_core_list(args.cpu_affinity)
    except ValueError as exc:
        parser.error(f"--cpu-affinity {args.cpu_affinity!r}: {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the relay with the command line's options; return the exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("websockets").setLevel(logging.WARNING)
    logging.getLogger("picows").setLevel(logging.WARNING)  # it logs every connection at INFO
    # picows' transports warn once per write to a peer that reset, until its close is handled
    logging.getLogger("aiofastnet").setLevel(logging.ERROR)
    pin_cpus(args.cores)
    raise_open_files_limit(MAX_CONNECTIONS)
    with asyncio.Runner(loop_factory=loop_factory(args.event_loop)) as runner:
        if args.transport == "picows":
            from bench.relay_picows import run_picows

            coalesced = args.mode == "coalesced"
            return runner.run(run_picows(args.host, args.port, coalesced, MAX_MESSAGE_BYTES))
        if args.mode == "coalesced":
            from bench.relay_sansio import run_sansio

            return runner.run(run_sansio(args.host, args.port, MAX_MESSAGE_BYTES))
        return runner.run(run(args.host, args.port, deflate=args.deflate == "on"))


if __name__ == "__main__":
    sys.exit(main())
