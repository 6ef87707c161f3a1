"""The bare relay on picows (``python -m bench.relay --transport picows``).

Same contract as the websockets relay in :mod:`bench.relay`: ``ws://HOST:PORT/ws?room=NAME``,
no token, no codec, no store; every frame received goes, verbatim and with its type
(text or binary), to every member of the sender's room, the sender included;
``GET /healthz`` answers 200, any other path 404, ``/ws`` without ``?room=`` is
upgraded and closed with 1008. Compression is never negotiated (picows has none).
Messages must come in one frame each: a fragmented one is closed with 1003.

picows calls back per frame from the event loop with no coroutine, task or queue
per connection, which makes this relay a ceiling for load generators cheaper than
the websockets one.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import parse_qs, urlsplit

from picows import (
    WSCloseCode,
    WSFrame,
    WSListener,
    WSMsgType,
    WSTransport,
    WSUpgradeRequest,
    WSUpgradeResponse,
    WSUpgradeResponseWithListener,
    ws_create_server,
)

from bench.relay import MAX_FRAME_BYTES, WS_PATH
from chat_server.runtime import on_stop_signals

log = logging.getLogger("bench.relay")

#: bytes a member may leave unread in its write buffer; past it the relay closes it
#: with 1013 instead of growing its memory (checked only while the transport is paused)
MAX_BUFFERED_BYTES = 16 * 2**20

_DATA = (WSMsgType.TEXT, WSMsgType.BINARY)


class PicowsRelay:
    """Rooms of open connections; a frame from a member goes to all members of its room."""

    def __init__(self) -> None:
        self.rooms: dict[str, set[_Member]] = {}
        self.frames_in = 0

    def listener_for(self, request: WSUpgradeRequest) -> WSListener | WSUpgradeResponseWithListener:
        """Route one upgrade request: ``/healthz``, ``/ws?room=`` or 404 (picows' factory)."""
        url = urlsplit(request.path.decode("latin-1"))
        if url.path == "/healthz":
            return WSUpgradeResponseWithListener(
                WSUpgradeResponse.create_ok_response(b"ok\n"), None
            )
        if url.path != WS_PATH:
            return WSUpgradeResponseWithListener(
                WSUpgradeResponse.create_error_response(404, b"not found\n"), None
            )
        room = parse_qs(url.query).get("room", [""])[0]
        return _Member(self, room)


class _Member(WSListener):  # type: ignore[misc]
    """One connection: joins its room when upgraded, relays each data frame to the room."""

    def __init__(self, relay: PicowsRelay, room: str) -> None:
        super().__init__()
        self.relay = relay
        self.room = room
        self.transport: WSTransport | None = None
        self.paused = False
        self.members: set[_Member] = set()

    def on_ws_connected(self, transport: WSTransport) -> None:
        self.transport = transport
        if not self.room:
            transport.send_close(WSCloseCode.POLICY_VIOLATION, b"missing ?room=")
            transport.disconnect()
            return
        self.members = self.relay.rooms.setdefault(self.room, set())
        self.members.add(self)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        msg_type = frame.msg_type
        if msg_type in _DATA and frame.fin:
            self.relay.frames_in += 1
            # the payload is a view into picows' read buffer: send() copies it, so it is
            # only read during this callback, as picows requires
            payload = frame.get_payload_as_memoryview()
            for member in tuple(self.members):
                if member.paused and member.too_far_behind():
                    continue
                member.transport.send(msg_type, payload)  # type: ignore[union-attr]
        elif msg_type == WSMsgType.CLOSE:
            transport.send_close(frame.get_close_code(), frame.get_close_message())
            transport.disconnect()
        elif msg_type == WSMsgType.CONTINUATION or msg_type in _DATA:
            transport.send_close(WSCloseCode.UNSUPPORTED_DATA, b"fragmented messages unsupported")
            transport.disconnect()

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        self.members.discard(self)
        if not self.members and self.relay.rooms.get(self.room) is self.members:
            del self.relay.rooms[self.room]

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def too_far_behind(self) -> bool:
        """True (and the member is being closed with 1013) once its buffer passed the bound."""
        transport = self.transport
        assert transport is not None
        if transport.underlying_transport.get_write_buffer_size() <= MAX_BUFFERED_BYTES:
            return False
        self.members.discard(self)
        transport.send_close(WSCloseCode.TRY_AGAIN_LATER, b"slow consumer")
        transport.disconnect(graceful=False)
        return True


async def run_picows(host: str, port: int) -> int:
    """Serve with picows until SIGTERM or SIGINT; return the exit status."""
    relay = PicowsRelay()
    stop = asyncio.Event()
    on_stop_signals(stop.set)
    server = await ws_create_server(
        relay.listener_for,
        host,
        port,
        max_frame_size=MAX_FRAME_BYTES,
    )
    bound = ", ".join(f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s in server.sockets)
    log.info("picows relay listening on %s (ws path %s?room=NAME)", bound, WS_PATH)
    async with server:
        await stop.wait()
        server.close()
        for members in list(relay.rooms.values()):
            for member in list(members):
                if member.transport is not None:
                    member.transport.send_close(WSCloseCode.GOING_AWAY, b"relay stopping")
                    member.transport.disconnect()
    log.info("relay stopped after %d frames in", relay.frames_in)
    return 0
