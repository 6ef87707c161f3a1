"""The websockets floor relay (``python -m bench.relay --transport websockets --mode coalesced``).

Same contract as the bare relays in :mod:`bench.relay`: ``ws://HOST:PORT/ws?room=NAME``,
no token, no codec, no store; every message received goes, verbatim and with its type
(text or binary), to every member of the sender's room, the sender included (a
message sent in several frames is reassembled and relayed as one); ``GET /healthz``
answers 200, any other path 404, ``/ws`` without ``?room=`` is upgraded and closed
with 1008. permessage-deflate is never negotiated (the answer carries no
``Sec-WebSocket-Extensions``), and text is relayed without decoding it.

Each connection is an :class:`asyncio.Protocol` over websockets' public sans-I/O
:class:`~websockets.server.ServerProtocol` (``receive_data``, ``events_received``,
``accept``/``reject``, ``send_response``, ``data_to_send``): websockets' parsing,
handshake and closing handshake, none of its asyncio layer. A message is framed
once for its whole room and each member's output is written once per loop
iteration (:mod:`bench.relay_base`); what the protocol itself writes (the
handshake's answer, pongs, close frames) joins the same pending output, in order.
This is the least a websockets server can do per delivered frame: the transport's
floor.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import parse_qs, urlsplit

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from bench.relay_base import (
    CLOSE_GOING_AWAY,
    CLOSE_POLICY,
    CLOSE_TIMEOUT_S,
    CLOSE_TRY_AGAIN_LATER,
    WS_PATH,
    CoalescedWriter,
    IterationFlush,
    leave_room,
)
from chat_server.runtime import on_stop_signals

log = logging.getLogger("bench.relay")

_TEXT, _BINARY, _CONT = Opcode.TEXT, Opcode.BINARY, Opcode.CONT


class SansIORelay:
    """Rooms of open connections; a message from a member goes to all members of its room."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_message_bytes: int) -> None:
        self.loop = loop
        self.flusher = IterationFlush(loop)
        self.max_message_bytes = max_message_bytes
        self.rooms: dict[str, set[RelayConnection]] = {}
        self.connections: set[RelayConnection] = set()
        self.messages_in = 0

    def connection(self) -> RelayConnection:
        """A new connection's protocol (the server's protocol factory)."""
        return RelayConnection(self)


class RelayConnection(CoalescedWriter, asyncio.Protocol):
    """One TCP connection: the handshake, then each message relayed to its room."""

    __slots__ = (
        "_behind",
        "_drop",
        "_flusher",
        "_fragments",
        "_fragments_opcode",
        "_pending",
        "_pending_bytes",
        "_room_bytes",
        "_tcp",
        "members",
        "protocol",
        "relay",
        "room",
    )

    def __init__(self, relay: SansIORelay) -> None:
        self.relay = relay
        # no extensions: the answer carries no Sec-WebSocket-Extensions, so one framing
        # fits every member
        self.protocol = ServerProtocol(max_size=relay.max_message_bytes)
        self.room = ""
        #: the room's members while this connection is one of them (else an empty set)
        self.members: set[RelayConnection] = set()
        self._init_writes(relay.flusher)
        self._fragments: list[bytes] | None = None
        self._fragments_opcode = _TEXT
        self._drop: asyncio.TimerHandle | None = None

    # ---- asyncio callbacks -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._tcp = transport  # type: ignore[assignment]
        self.relay.connections.add(self)

    def data_received(self, data: bytes) -> None:
        protocol = self.protocol
        protocol.receive_data(data)
        for event in protocol.events_received():
            if type(event) is Frame:
                opcode = event.opcode
                if (opcode is _TEXT or opcode is _BINARY) and event.fin:
                    # the frame as received is the message: final, no extension bits
                    self._relay(event.serialize(mask=False))
                    continue
                self._on_other_frame(event)
            else:
                self._on_request(event)  # type: ignore[arg-type]
        self._take_output()  # a failure's close frame (1002, 1009) after what came before

    def eof_received(self) -> bool:
        self.protocol.receive_eof()
        self._take_output()
        return False  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()  # idempotent: the protocol is CLOSED after it
        self._leave()
        self._pending = []
        self._tcp = None
        if self._drop is not None:
            self._drop.cancel()
        self.relay.connections.discard(self)

    # ---- events --------------------------------------------------------------------------

    def _relay(self, wire: bytes) -> None:
        """One framed message to every member of the room, this connection included."""
        self.relay.messages_in += 1
        for member in self.members:
            member.queue(wire)

    def _on_request(self, request: Request) -> None:
        """Answer the handshake: ``/healthz`` 200, ``/ws`` upgraded (1008 with no room), 404."""
        url = urlsplit(request.path)
        protocol = self.protocol
        if url.path == "/healthz":
            response = protocol.reject(200, "ok\n")
        elif url.path != WS_PATH:
            response = protocol.reject(404, "not found\n")
        else:
            response = protocol.accept(request)  # 400, 426 for a bad upgrade request
        protocol.send_response(response)
        if protocol.state is OPEN:
            room = parse_qs(url.query).get("room", [""])[0]
            if room:
                self.room = room
                self.members = self.relay.rooms.setdefault(room, set())
                self.members.add(self)
            else:
                protocol.send_close(CLOSE_POLICY, "missing ?room=")
        self._take_output()  # the answer goes before any message relayed to this member

    def _on_other_frame(self, frame: Frame) -> None:
        """A fragment, a control frame (the protocol answers pings and closes itself)."""
        opcode = frame.opcode
        if opcode is _CONT:
            # the protocol refuses a continuation frame that starts no message (1002)
            # and bounds the whole message by max_size (1009)
            assert self._fragments is not None
            self._fragments.append(frame.data)
            if frame.fin:
                message, self._fragments = b"".join(self._fragments), None
                self._relay(Frame(self._fragments_opcode, message).serialize(mask=False))
        elif opcode is _TEXT or opcode is _BINARY:
            self._fragments = [frame.data]
            self._fragments_opcode = opcode
        else:
            self._take_output()  # a pong, or the closing handshake, in order with the data

    def _take_output(self) -> None:
        """What the protocol has to write joins the pending output; at its end of stream,
        everything pending is written and the transport closed."""
        protocol = self.protocol
        for data in protocol.data_to_send():
            if data:
                pending = self._pending
                if not pending:
                    self._flusher.mark(self)
                pending.append(data)
                self._pending_bytes += len(data)
            else:  # SEND_EOF: the handshake was refused, or the closing handshake is done
                self.flush()
                if self._tcp is not None:
                    self._tcp.close()
        if protocol.close_expected():
            self._closing()

    def _closing(self) -> None:
        """A close frame was sent or received: leave the room; reset if not gone in time."""
        self._leave()
        if self._drop is None:
            self._drop = self.relay.loop.call_later(CLOSE_TIMEOUT_S, self.abort)

    def _leave(self) -> None:
        leave_room(self.relay.rooms, self.room, self)
        self.members = set()

    def _close_behind(self) -> None:
        self.relay.loop.call_soon(self._leave)  # a broadcast may be iterating the room
        self.close(CLOSE_TRY_AGAIN_LATER, "slow consumer")

    def close(self, code: int, reason: str) -> None:
        """Start the closing handshake now, behind what the transport buffers."""
        if self.protocol.state is not OPEN or self._tcp is None:
            return
        self.flush()
        self.protocol.send_close(code, reason)
        self._tcp.write(b"".join(self.protocol.data_to_send()))
        if self._drop is None:
            self._drop = self.relay.loop.call_later(CLOSE_TIMEOUT_S, self.abort)

    def abort(self) -> None:
        """Drop the connection now (a member that did not finish its closing handshake)."""
        self._drop = None
        if self._tcp is not None:
            self._tcp.abort()


async def run_sansio(host: str, port: int, max_message_bytes: int) -> int:
    """Serve until SIGTERM or SIGINT; return the exit status."""
    loop = asyncio.get_running_loop()
    relay = SansIORelay(loop, max_message_bytes)
    stop = asyncio.Event()
    on_stop_signals(stop.set)
    server = await loop.create_server(relay.connection, host, port)
    bound = ", ".join(f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s in server.sockets)
    log.info("websockets floor relay listening on %s (ws path %s?room=NAME)", bound, WS_PATH)
    async with server:
        await stop.wait()
        server.close()
        relay.flusher.flush_all()
        for connection in list(relay.connections):
            connection.close(CLOSE_GOING_AWAY, "relay stopping")
    log.info("relay stopped after %d messages in", relay.messages_in)
    return 0
