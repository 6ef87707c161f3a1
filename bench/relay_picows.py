"""The bare relays on picows (``python -m bench.relay --transport picows``).

Same contract as the websockets relays in :mod:`bench.relay`: ``ws://HOST:PORT/ws?room=NAME``,
no token, no codec, no store; every message received goes, verbatim and with its type
(text or binary), to every member of the sender's room, the sender included (a
message sent in several frames is reassembled and relayed as one); ``GET /healthz``
answers 200, any other path 404, ``/ws`` without ``?room=`` is upgraded and closed
with 1008. Compression is never negotiated (picows has none); text is relayed
without decoding it.

picows calls back per frame from the event loop with no coroutine, task or queue
per connection. Two ways to write, chosen at start:

- ``per-frame-send`` (:class:`PerFrameMember`): one ``WSTransport.send`` per message
  per member, picows framing each one: a syscall per delivered frame.
- ``coalesced`` (:class:`CoalescedMember`): each message framed once for its room
  (server frames are unmasked) and each member's output written once per loop
  iteration, straight to picows' public ``WSTransport.underlying_transport``
  (:mod:`bench.relay_base`): the transport's floor.

Either way a member too far behind is closed with 1013 rather than growing memory:
past ``MAX_OUTBOUND_BYTES`` in its transport's buffer (per-frame, checked only while
picows reports writing paused), or in what is pending and buffered (coalesced). Its
close frame goes behind what is buffered, nothing more is sent to it, and it is
dropped if still there ``CLOSE_TIMEOUT_S`` later.
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

from bench.relay_base import (
    CLOSE_TIMEOUT_S,
    MAX_OUTBOUND_BYTES,
    WS_PATH,
    CoalescedWriter,
    IterationFlush,
    leave_room,
)
from chat_server.runtime import on_stop_signals
from chat_server.transport.frames import frame_header

log = logging.getLogger("bench.relay")

_TEXT, _BINARY, _CONT, _CLOSE = (
    WSMsgType.TEXT,
    WSMsgType.BINARY,
    WSMsgType.CONTINUATION,
    WSMsgType.CLOSE,
)
_HEADER = {_TEXT: int(_TEXT), _BINARY: int(_BINARY)}


class PicowsRelay:
    """Rooms of open connections; a message from a member goes to all members of its room."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, coalesced: bool, max_message_bytes: int
    ) -> None:
        self.loop = loop
        self.flusher = IterationFlush(loop)
        self.member_class: type[Member] = CoalescedMember if coalesced else PerFrameMember
        self.max_message_bytes = max_message_bytes
        self.rooms: dict[str, set[Member]] = {}
        self.messages_in = 0

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
        return self.member_class(self, room)


class Member(WSListener):  # type: ignore[misc]
    """One connection: joins its room when upgraded, reassembles fragmented messages and
    relays each message to the room (:meth:`relay_message`, as the subclass writes)."""

    def __init__(self, relay: PicowsRelay, room: str) -> None:
        super().__init__()
        self.relay = relay
        self.room = room
        self.transport: WSTransport | None = None
        self.members: set[Member] = set()
        self._fragments: bytearray | None = None
        self._fragments_kind = _TEXT

    def on_ws_connected(self, transport: WSTransport) -> None:
        self.transport = transport
        if not self.room:
            transport.send_close(WSCloseCode.POLICY_VIOLATION, b"missing ?room=")
            transport.disconnect()
            return
        self.members = self.relay.rooms.setdefault(self.room, set())
        self.members.add(self)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        kind = frame.msg_type
        if (kind is _TEXT or kind is _BINARY) and frame.fin and self._fragments is None:
            self.relay.messages_in += 1
            # a view into picows' read buffer: only read during this callback
            self.relay_message(kind, frame.get_payload_as_memoryview())
        elif kind is _CLOSE:
            self.leave()
            if not transport.is_close_frame_sent:  # else this ends our closing handshake
                self.flush()
                transport.send_close(frame.get_close_code(), frame.get_close_message())
            transport.disconnect()
        elif kind is _TEXT or kind is _BINARY or kind is _CONT:
            self._on_fragment(transport, frame)

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        self.leave()

    def relay_message(self, kind: WSMsgType, payload: memoryview | bytes) -> None:
        """Send one message to every member of the room, this connection included."""
        raise NotImplementedError

    def flush(self) -> None:
        """Write what is pending for this member (nothing, unless writes are coalesced)."""

    def leave(self) -> None:
        """Leave the room (nothing more is relayed to this member)."""
        leave_room(self.relay.rooms, self.room, self)
        self.members = set()

    def close_behind_later(self) -> None:
        """Send close 1013 behind what the transport buffers; drop the connection if it
        is still there after ``CLOSE_TIMEOUT_S``."""
        assert self.transport is not None
        self.transport.send_close(WSCloseCode.TRY_AGAIN_LATER, b"slow consumer")
        self.relay.loop.call_later(CLOSE_TIMEOUT_S, self._drop)

    def _drop(self) -> None:
        if self.transport is not None and not self.transport.is_disconnected:
            self.transport.disconnect(graceful=False)

    def _on_fragment(self, transport: WSTransport, frame: WSFrame) -> None:
        """A message in several frames: reassembled (up to ``max_message_bytes``), relayed."""
        kind = frame.msg_type
        if kind is _CONT:
            if self._fragments is None:
                self._fail(transport, WSCloseCode.PROTOCOL_ERROR, b"continuation without a message")
                return
        elif self._fragments is not None:
            self._fail(
                transport, WSCloseCode.PROTOCOL_ERROR, b"new message inside a fragmented one"
            )
            return
        else:
            self._fragments = bytearray()
            self._fragments_kind = kind
        fragments = self._fragments
        if len(fragments) + frame.payload_size > self.relay.max_message_bytes:
            self._fail(transport, WSCloseCode.MESSAGE_TOO_BIG, b"message too big")
            return
        fragments += frame.get_payload_as_memoryview()
        if frame.fin:
            self._fragments = None
            self.relay.messages_in += 1
            self.relay_message(self._fragments_kind, bytes(fragments))

    def _fail(self, transport: WSTransport, code: WSCloseCode, reason: bytes) -> None:
        self._fragments = None
        self.leave()
        self.flush()
        transport.send_close(code, reason)
        transport.disconnect()


class PerFrameMember(Member):
    """``per-frame-send``: one ``WSTransport.send`` per message per member."""

    def __init__(self, relay: PicowsRelay, room: str) -> None:
        super().__init__(relay, room)
        self.paused = False

    def relay_message(self, kind: WSMsgType, payload: memoryview | bytes) -> None:
        # send() copies the payload, so the view is read during this callback only
        for member in tuple(self.members):
            if member.paused and member.too_far_behind():  # type: ignore[attr-defined]
                continue
            member.transport.send(kind, payload)  # type: ignore[union-attr]

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def too_far_behind(self) -> bool:
        """True (and the member is being closed with 1013) once its buffer passed the bound."""
        transport = self.transport
        assert transport is not None
        if transport.underlying_transport.get_write_buffer_size() <= MAX_OUTBOUND_BYTES:
            return False
        self.leave()
        self.close_behind_later()
        return True


class CoalescedMember(CoalescedWriter, Member):
    """``coalesced``: a message framed once for the room, each member's output written
    once per loop iteration to the TCP transport under picows (which picows also
    writes to, so its control frames stay in order with what was flushed before)."""

    def __init__(self, relay: PicowsRelay, room: str) -> None:
        super().__init__(relay, room)
        self._init_writes(relay.flusher)

    def on_ws_connected(self, transport: WSTransport) -> None:
        self._tcp = transport.underlying_transport
        super().on_ws_connected(transport)

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        super().on_ws_disconnected(transport)
        self._pending = []
        self._tcp = None

    def relay_message(self, kind: WSMsgType, payload: memoryview | bytes) -> None:
        wire = frame_header(_HEADER[kind], len(payload)) + payload
        for member in self.members:
            member.queue(wire)  # type: ignore[attr-defined]

    def _close_behind(self) -> None:
        self.relay.loop.call_soon(self.leave)  # relay_message may be iterating the room
        self.close_behind_later()


async def run_picows(host: str, port: int, coalesced: bool, max_message_bytes: int) -> int:
    """Serve with picows until SIGTERM or SIGINT; return the exit status."""
    relay = PicowsRelay(asyncio.get_running_loop(), coalesced, max_message_bytes)
    stop = asyncio.Event()
    on_stop_signals(stop.set)
    server = await ws_create_server(
        relay.listener_for,
        host,
        port,
        max_frame_size=max_message_bytes,
    )
    bound = ", ".join(f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s in server.sockets)
    mode = "coalesced" if coalesced else "per-frame-send"
    log.info("picows %s relay listening on %s (ws path %s?room=NAME)", mode, bound, WS_PATH)
    async with server:
        await stop.wait()
        server.close()
        relay.flusher.flush_all()
        for members in list(relay.rooms.values()):
            for member in list(members):
                if member.transport is not None:
                    member.transport.send_close(WSCloseCode.GOING_AWAY, b"relay stopping")
                    member.transport.disconnect()
    log.info("relay stopped after %d messages in", relay.messages_in)
    return 0
