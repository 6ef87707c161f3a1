"""The websockets transport (``TRANSPORT=websockets``, the default): an asyncio.Protocol
over websockets' sans-I/O ``ServerProtocol``.

:class:`WebsocketsConnection` is the connection's asyncio protocol: it feeds what
it reads to ``ServerProtocol.receive_data``, handles ``events_received()`` and
writes ``data_to_send()`` (as uvicorn's ``websockets_sansio_impl`` does). All of it
is websockets' public sans-I/O API: the HTTP and frame parsing, limits on the
request and on frame sizes (``MAX_FRAME_BYTES``: 1009), protocol errors (1002),
pongs to pings (counted toward ``MAX_OUTBOUND_BYTES`` once written), the echo of a
client's close, and permessage-deflate with context
takeover (``WS_DEFLATE=on``). With ``WS_DEFLATE=shared`` websockets negotiates
permessage-deflate through its public extension API (:class:`SharedDeflateFactory`),
but the frames are chatlab's: a connection's data frames take the coalescer's framing,
compressed once per broadcast, and :class:`SharedDeflate` inflates what the client
compressed, without a compressor or inflater kept between messages
(:mod:`chat_server.transport.deflate`). The rest is chatlab's, shared with picows in
:class:`~chat_server.transport.peer.ChatPeer`.

The handshake is :class:`~chat_server.transport.base.Admission`'s: ``/healthz``,
``/stats``, the web page, 404, 503, 401 before 400, the subprotocol, and
``X-Chatlab-Worker: <pid>`` on every response with ``EXPOSE_INTERNALS=on``. A request
whose method is not GET never reaches websockets: the transport's
:class:`~chat_server.transport.accept.MethodGate` answers it 405.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from websockets.exceptions import NegotiationError, PayloadTooBig, ProtocolError
from websockets.extensions import Extension, ServerExtensionFactory
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import CTRL_OPCODES, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import ExtensionName, ExtensionParameter

from chat_server.regressions import Regression
from chat_server.settings import Settings
from chat_server.transport.accept import HANDSHAKE_TIMEOUT_S, shut_write
from chat_server.transport.base import Admitted, Reply, ServerTransport
from chat_server.transport.deflate import (
    EXTENSION_NAME,
    InflatedTooBig,
    MessageInflater,
    negotiate,
)
from chat_server.transport.peer import PEER_SLOTS, ChatPeer
from chatlab.forwarded import FORWARDED_FOR

# websockets logs every connection's open and close at INFO: one line per connection
# is noise under load, so its own logger starts at WARNING (LOG_LEVEL=debug shows it).
ws_log = logging.getLogger("chat_server.transport.websockets")

TEXT = Opcode.TEXT
BINARY = Opcode.BINARY
CONT = Opcode.CONT
PING = Opcode.PING
PONG = Opcode.PONG
OPEN = State.OPEN
CONNECTING = State.CONNECTING
CLOSED = State.CLOSED


class WebsocketsConnection(ChatPeer, asyncio.Protocol):
    """One connection's asyncio protocol: websockets' ``ServerProtocol`` for the wire,
    :class:`ChatPeer` for the rest."""

    __slots__ = (*PEER_SLOTS, "_deflate", "_handshake_timer", "_peer", "_protocol")

    def __init__(self, owner: WebsocketsTransport, peer: str) -> None:
        super().__init__(owner)
        #: the address the connection was accepted from
        self._peer = peer
        self._protocol = ServerProtocol(
            extensions=owner.extensions,
            select_subprotocol=owner.select_subprotocol,
            max_size=owner.settings.max_frame_bytes,
            logger=ws_log,
        )
        self._handshake_timer: Any = None
        #: WS_DEFLATE=shared, negotiated: the extension inflating this connection's messages
        self._deflate: SharedDeflate | None = None

    # ---- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.tcp = transport
        self._handshake_timer = self.owner.loop.call_later(HANDSHAKE_TIMEOUT_S, transport.abort)

    def data_received(self, data: bytes) -> None:
        protocol = self._protocol
        protocol.receive_data(data)
        pinged = False
        for event in protocol.events_received():
            if type(event) is Frame:
                opcode = event.opcode
                if opcode is TEXT:
                    if event.fin and self._fragments is None:
                        self._deliver_text(event.data)
                    else:
                        self._fragment(True, event.data, event.fin)
                elif opcode is BINARY:
                    if event.fin and self._fragments is None:
                        self._deliver(event.data)
                    else:
                        self._fragment(False, event.data, event.fin)
                elif opcode is CONT:
                    self._fragment(None, event.data, event.fin)
                elif opcode is PONG:
                    self._pong()
                elif opcode is PING:
                    # the protocol queued its pong: counted once written; the ping draws a
                    # rate-limit token (websockets answers every ping, so past the
                    # allowance the pong still goes, and the flood close bounds them)
                    pinged = True
                    if not self.closing:
                        self._control_frame_allowed()
                # a close is echoed by the protocol itself
            else:
                self._handshake(event)  # type: ignore[arg-type]
        if pinged and self.closing and self._owes_past_bound():
            return  # dropped: its pongs are not written
        self._send_pending()
        if pinged:
            self._ponged()
        if protocol.state is not OPEN:
            self._leaving_open()

    def eof_received(self) -> None:
        # the websocket has its own closing handshake: nothing is written after EOF, so
        # the transport closes (returning None)
        self._protocol.receive_eof()
        self._send_pending()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self._protocol.receive_eof()  # websockets' state is CLOSED from now on
        self._gone()

    # ---- ChatPeer -------------------------------------------------------------------------

    def _write_frames(self, frames: list[bytes]) -> None:
        # permessage-deflate: each frame through this connection's own compressor
        protocol = self._protocol
        send = protocol.send_binary if self.owner.codec.binary else protocol.send_text
        for frame in frames:
            send(frame)
        self._send_pending()

    def _send_close_frame(self, code: int, reason: str) -> None:
        self._protocol.send_close(code, reason)
        self._send_pending()

    def _send_ping(self) -> None:
        self._protocol.send_ping(b"")
        self._send_pending()

    def _inflater_held(self) -> bool:
        # as the parser left it after this read (it parses a read's frames before they
        # are handled): off by one message at most, within one read
        return self._deflate is not None and self._deflate.inflating

    def _fail(self, code: int, reason: str) -> None:
        if self._deflate is not None:  # nothing more is read: the inflater goes now
            self._deflate.forget()
        super()._fail(code, reason)

    # ---- internals ------------------------------------------------------------------------

    def _send_pending(self) -> None:
        """Write what the protocol has for the wire; its end-of-stream mark shuts our side."""
        tcp = self.tcp
        assert tcp is not None
        for data in self._protocol.data_to_send():
            if data:
                tcp.write(data)
            else:
                shut_write(tcp)

    def _handshake(self, request: Request) -> None:
        """Answer the upgrade request with Admission's decision (101 when admitted)."""
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        owner = self.owner
        headers = request.headers
        authorization = headers.get_all("Authorization")  # the first, as picows reads it
        decision = owner.admission.decide(
            request.path,
            authorization[0] if authorization else None,
            headers.get_all("Sec-WebSocket-Protocol"),
            peer=self._peer,
            forwarded_for=headers.get_all(FORWARDED_FOR),
        )
        protocol = self._protocol
        if isinstance(decision, Admitted):
            response = protocol.accept(request)
            if owner.shared_deflate is not None:
                self._deflate = owner.shared_deflate.take_accepted()
        else:
            response = _response(protocol, decision)
        for name, value in owner.worker_headers:
            response.headers[name] = value
        protocol.send_response(response)
        if protocol.state is OPEN:
            if protocol.extensions:  # permessage-deflate negotiated: WS_DEFLATE says how
                self._take_framing(owner.negotiated_framing)
            self._send_pending()  # the 101 before the welcome
            assert isinstance(decision, Admitted)
            self._opened(decision.user, decision.client)

    def _leaving_open(self) -> None:
        """The protocol left OPEN (or never got there): close or wait as it says."""
        protocol = self._protocol
        state = protocol.state
        if state is CONNECTING:
            if protocol.close_expected():  # an answer other than 101 was sent
                assert self.tcp is not None
                self.tcp.close()
            return
        self.closing = True
        if state is not CLOSED and self.session is not None:
            self._drop_later()  # the closing handshake has CLOSE_TIMEOUT_S to end


class WebsocketsTransport(ServerTransport):
    """Serves ``/ws`` (and ``/healthz``, ``/stats``, the web page) with websockets' sans-I/O
    protocol."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: permessage-deflate as WS_DEFLATE says (None: off)
        self.extensions = _deflate_extensions(self.settings)
        #: WS_DEFLATE=shared: the factory, which hands each connection its extension
        self.shared_deflate = next(
            (f for f in self.extensions or () if isinstance(f, SharedDeflateFactory)), None
        )
        #: the codec's subprotocol when the client offers it, else none (a client that
        #: offers only others was refused 400 by Admission already); websockets binds it
        #: to the protocol, so it is a plain function
        self.select_subprotocol = _subprotocol_selector(self.codec.subprotocol)

    def connection_protocol(self, peer: str) -> WebsocketsConnection:
        """A connection's protocol, once its request is a GET."""
        return WebsocketsConnection(self, peer)


def permessage_deflate(window_bits: int = 12, mem_level: int = 5) -> ServerPerMessageDeflateFactory:
    """The server's permessage-deflate offer answer: window ``2^window_bits`` both ways."""
    return ServerPerMessageDeflateFactory(
        server_max_window_bits=window_bits,
        client_max_window_bits=window_bits,
        compress_settings={"memLevel": mem_level},
    )


def _deflate_extensions(
    settings: Settings,
) -> list[ServerPerMessageDeflateFactory | SharedDeflateFactory] | None:
    """permessage-deflate as ``WS_DEFLATE`` says.

    On: websockets' own, with its memory-frugal defaults: window 2^12 both ways and zlib
    memLevel 5, since even these cost several times the memory per idle connection of
    deflate off (``docs/decisions/0009-permessage-deflate.md``);
    REGRESSION=deflate_max_window: window 2^15 and memLevel 9, zlib's maximum (its
    memory cost is for the lab to measure). Shared: :class:`SharedDeflateFactory`.
    """
    if settings.ws_deflate == "shared":
        return [SharedDeflateFactory()]
    if settings.ws_deflate != "on":
        return None
    window_bits, mem_level = Regression.of(settings).deflate_window()
    return [permessage_deflate(window_bits=window_bits, mem_level=mem_level)]


class SharedDeflateFactory(ServerExtensionFactory):
    """``WS_DEFLATE=shared``'s negotiation: every offer websockets' own factory would
    accept, answered without context takeover either way
    (:func:`~chat_server.transport.deflate.negotiate`)."""

    name = ExtensionName(EXTENSION_NAME)

    def __init__(self) -> None:
        self._accepted: SharedDeflate | None = None

    def process_request_params(
        self, params: Sequence[ExtensionParameter], accepted_extensions: Sequence[Extension]
    ) -> tuple[list[ExtensionParameter], SharedDeflate]:
        """The answer's parameters and the connection's extension; NegotiationError
        declines the offer (websockets then tries the next, or answers without one)."""
        if any(other.name == self.name for other in accepted_extensions):
            raise NegotiationError(f"skipped duplicate {self.name}")
        answer = negotiate(params)
        self._accepted = extension = SharedDeflate()
        return answer, extension

    def take_accepted(self) -> SharedDeflate | None:
        """The extension the handshake that just ran accepted (None: it accepted none).

        ``ServerProtocol.accept`` negotiates within the call, on the event loop's one
        thread, so the extension made last is that connection's; taking it clears it.
        """
        extension, self._accepted = self._accepted, None
        return extension


class SharedDeflate(Extension):
    """One connection's permessage-deflate without context takeover, for websockets' parser.

    :meth:`decode` inflates a compressed message with an inflater that lives only while
    the message is read (bounded by the parser's ``max_size``, ``MAX_FRAME_BYTES``:
    PayloadTooBig, which websockets closes with 1009; a bad stream raises
    :class:`~chat_server.transport.deflate.InvalidCompressedData`, which it closes with
    1007). :meth:`encode` leaves frames as they are: what the protocol itself sends is
    control frames, never compressed, and the data frames go out through the coalescer.
    """

    __slots__ = ("_inflater",)

    name = ExtensionName(EXTENSION_NAME)

    def __init__(self) -> None:
        #: the message being read in several frames, if it is compressed
        self._inflater: MessageInflater | None = None

    @property
    def inflating(self) -> bool:
        """Whether an inflater is kept for a compressed message not yet whole."""
        return self._inflater is not None

    def forget(self) -> None:
        """Drop the inflater of a message given up (its connection is closing)."""
        self._inflater = None

    def decode(self, frame: Frame, *, max_size: int | None = None) -> Frame:
        """``frame`` with its data inflated when its message is compressed."""
        opcode = frame.opcode
        if opcode is CONT:
            inflater = self._inflater
            if inflater is None:
                return frame
            if frame.rsv1:
                raise ProtocolError("RSV1 bit set in continuation frame")
        elif not frame.rsv1 or opcode in CTRL_OPCODES:
            return frame
        else:
            assert max_size is not None  # the protocol's max_size: MAX_FRAME_BYTES
            inflater = self._inflater = MessageInflater(max_size)
        if frame.fin:
            self._inflater = None
        try:
            data = inflater.feed(frame.data, frame.fin)
        except InflatedTooBig:
            self._inflater = None
            raise PayloadTooBig(None, max_size or 0) from None
        return Frame(opcode, data, frame.fin, False, frame.rsv2, frame.rsv3)

    def encode(self, frame: Frame) -> Frame:
        """``frame`` as it is: sent uncompressed, as RFC 7692 allows any message to be."""
        return frame


def _subprotocol_selector(ours: str) -> Callable[[ServerProtocol, Sequence[str]], str | None]:
    """websockets' ``select_subprotocol``: ``ours`` when offered, else none."""

    def select(protocol: ServerProtocol, offered: Sequence[str]) -> str | None:
        return ours if ours in offered else None

    return select


def _response(protocol: ServerProtocol, reply: Reply) -> Response:
    """A websockets response carrying ``reply``'s status, body and headers."""
    response = protocol.reject(reply.status, reply.body)
    if reply.content_type != response.headers["Content-Type"]:
        del response.headers["Content-Type"]  # Headers append on assignment
        response.headers["Content-Type"] = reply.content_type
    for name, value in reply.headers:
        response.headers[name] = value
    return response
