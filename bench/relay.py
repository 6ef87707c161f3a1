"""``python -m bench.relay``: a websocket relay doing the least work, to measure load generators.

It serves ``ws://HOST:PORT/ws?room=NAME`` with no token, no codec and no store, and
relays every frame it receives, verbatim (text as text, binary as binary), to every
member of the sender's room, the sender included, with ``websockets.broadcast``
(no backpressure; compression off unless ``--deflate on``, which accepts
permessage-deflate as the chat server does). ``GET /healthz`` answers 200. Anything a load
generator measures against it is the generator's own cost plus loopback: that is
the ceiling the Locust load test (``--target relay``) can measure a chat server at.
``--transport picows`` serves the same contract on picows (:mod:`bench.relay_picows`),
which costs the relay less per frame: the ceiling of the lab's fast driver.

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

from chat_server.runtime import on_stop_signals, pin_cpus, raise_open_files_limit
from chat_server.transport.websockets import permessage_deflate
from chatlab.loops import loop_factory
from chatlab.settings import parse_core_list

log = logging.getLogger("bench.relay")

#: the websocket path, as on the chat server
WS_PATH = "/ws"
#: close code for a request without ``?room=`` (policy violation)
CLOSE_POLICY = 1008
#: connections the open-files limit is raised for
MAX_CONNECTIONS = 10_000
#: largest frame accepted (either transport)
MAX_FRAME_BYTES = 2**20
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
        max_size=MAX_FRAME_BYTES,
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
        "--deflate",
        choices=("on", "off"),
        default="off",
        help="accept permessage-deflate as the chat server does (websockets only) [off]",
    )
    parser.add_argument("--log-level", default="info", help="logging level [info]")
    args = parser.parse_args(argv)
    if args.deflate == "on" and args.transport == "picows":
        parser.error("--deflate on: the picows relay has no permessage-deflate")
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

            return runner.run(run_picows(args.host, args.port))
        return runner.run(run(args.host, args.port, deflate=args.deflate == "on"))


if __name__ == "__main__":
    sys.exit(main())
