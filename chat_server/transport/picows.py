"""The picows transport (``TRANSPORT=picows``): the same contract as websockets, cheaper per frame.

picows parses the handshake and the frames and calls back per frame from the event
loop, with no task or queue per connection. The handshake is
:class:`~chat_server.transport.base.Admission`'s, run in picows' listener factory
(:meth:`PicowsTransport._route`): ``/healthz``, ``/stats``, the web page, 404, 503,
401 before 400, the chosen subprotocol and ``X-Chatlab-Worker`` on every response
(with ``EXPOSE_INTERNALS=on``).
Each upgraded connection's listener, :class:`PicowsPeer`, is a
:class:`~chat_server.transport.peer.ChatPeer`: writes coalesced per loop iteration
(straight to the TCP transport under the websocket), the slow-consumer bound
checked on every flush and after every pong, replay pacing, closing with its
timeout, keepalive (picows' own auto-ping closes with 1001, the contract says 1011:
it is off), reassembly with its bounds and the UTF-8 check are the ones websockets'
connections share. What is picows' here: the echo of a client's close frame, and the
pongs, written through ``WSTransport.send_pong`` (picows' auto-pong is off, so that
they count toward ``MAX_OUTBOUND_BYTES``).

permessage-deflate with context takeover (``WS_DEFLATE=on``) is websockets' only: it is
refused at start with this transport (see :mod:`chat_server.settings`). With
``WS_DEFLATE=shared`` the transport negotiates it itself
(:func:`~chat_server.transport.deflate.answer_offers`, in the 101's extra headers); a
connection that accepted it is a :class:`PicowsPeer` in ``Framing.SHARED_DEFLATE``: its
data frames are compressed once per broadcast by the coalescer, and its client's
compressed messages are inflated.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from picows import (
    WSAutoPingStrategy,
    WSCloseCode,
    WSFrame,
    WSListener,
    WSMsgType,
    WSTransport,
    WSUpgradeRequest,
    WSUpgradeResponse,
    WSUpgradeResponseWithListener,
)

# picows builds the protocol of a server connection only inside ws_create_server, which
# accepts on its own: at the open-files limit that accept fails (EMFILE) with no answer
# to the client (see chat_server.transport.accept). The server accepts itself and builds
# that protocol as ws_create_server does, with the arguments it passes: WSProtocol and
# its constructor are not picows' public API, so pyproject.toml pins picows below 3.
from picows.picows import WSProtocol

from chat_server.auth import TokenVerifier
from chat_server.codecs.base import Codec
from chat_server.settings import Settings
from chat_server.transport.accept import HANDSHAKE_TIMEOUT_S
from chat_server.transport.base import (
    CLOSE_INVALID_TEXT,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_PROTOCOL_ERROR,
    Admitted,
    ServerTransport,
)
from chat_server.transport.deflate import (
    Framing,
    InflatedTooBig,
    InvalidCompressedData,
    MessageInflater,
    answer_offers,
)
from chat_server.transport.peer import ChatPeer
from chatlab.forwarded import FORWARDED_FOR

if TYPE_CHECKING:
    from chat_server.service import ChatService

# picows logs every connection's open and close at INFO: one line per connection is
# noise under load, so its logger starts at WARNING (LOG_LEVEL=debug shows it).
picows_log = logging.getLogger("chat_server.transport.picows")

#: the read buffer picows allocates per connection at first; it doubles as data needs
#: (a handshake, a long message). Smaller than picows' own default (16 KiB): an idle
#: connection holds one page of it (`python -m bench.memory --transport picows`)
READ_BUFFER_INIT_BYTES = 4 * 1024

TEXT = WSMsgType.TEXT
BINARY = WSMsgType.BINARY
CONTINUATION = WSMsgType.CONTINUATION
CLOSE = WSMsgType.CLOSE
PING = WSMsgType.PING
PONG = WSMsgType.PONG


class PicowsPeer(ChatPeer, WSListener):  # type: ignore[misc]
    """One upgraded connection: picows' callbacks into :class:`ChatPeer`.

    In ``framing`` SHARED_DEFLATE (the handshake negotiated it) a compressed message from
    the client (RSV1 on its first frame) is inflated by an inflater that lives only while
    that message is read."""

    def __init__(self, owner: PicowsTransport, user: str, framing: Framing, client: str) -> None:
        super().__init__(owner)
        self.user = user
        self._client = client
        self._ws: WSTransport | None = None
        self._take_framing(framing)
        self._inflates = framing is Framing.SHARED_DEFLATE
        self._inflater: MessageInflater | None = None

    def on_ws_connected(self, transport: WSTransport) -> None:
        self._ws = transport
        self.tcp = transport.underlying_transport
        self._opened(self.user, self._client)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        kind = frame.msg_type
        if self._inflates and self._compressed(kind, frame):
            return
        if frame.fin and self._fragments is None:
            if kind == TEXT:
                try:
                    payload = frame.get_payload_as_utf8_text()
                except UnicodeDecodeError as exc:
                    self._invalid_text(exc)
                    return
                self._deliver(payload)
                return
            if kind == BINARY:
                self._deliver(frame.get_payload_as_bytes())
                return
        if kind == CLOSE:
            self._on_close(transport, frame)
        elif kind == PONG:
            self._pong()
        elif kind in (TEXT, BINARY):
            self._fragment(kind == TEXT, frame.get_payload_as_memoryview(), frame.fin)
        elif kind == CONTINUATION:
            self._fragment(None, frame.get_payload_as_memoryview(), frame.fin)
        elif kind == PING and self._control_frame_allowed():
            # answered here, not by picows' auto-pong, so that the ping draws a rate-limit
            # token (past the allowance it is not answered) and the pong counts toward
            # MAX_OUTBOUND_BYTES (picows drops it once a close frame was sent)
            transport.send_pong(frame.get_payload_as_bytes())
            self._ponged()

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        self._gone()

    def _send_close_frame(self, code: int, reason: str) -> None:
        assert self._ws is not None
        self._ws.send_close(WSCloseCode(code), reason.encode())

    def _send_ping(self) -> None:
        assert self._ws is not None
        self._ws.send_ping()

    def _on_close(self, transport: WSTransport, frame: WSFrame) -> None:
        """The client's close frame: the end of our closing handshake, or echo it and go."""
        if not transport.is_close_frame_sent:
            self.closing = True
            # the status code and reason, echoed as they came (also when there is none)
            transport.send(CLOSE, frame.get_payload_as_bytes())
            self._drop_later()
        transport.disconnect()

    # ---- Framing.SHARED_DEFLATE: the client's compressed messages ------------------------

    def _compressed(self, kind: WSMsgType, frame: WSFrame) -> bool:
        """Take a frame of a compressed message (True), or leave the frame to the plain path."""
        if frame.rsv1 and kind in (TEXT, BINARY):
            if self._fragments is not None:
                self._fail(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
                return True
            self._inflater = MessageInflater(self.owner.settings.max_frame_bytes)
            self._inflated(kind == TEXT, frame.get_payload_as_memoryview(), frame.fin)
            return True
        if kind == CONTINUATION and self._inflater is not None:
            self._inflated(None, frame.get_payload_as_memoryview(), frame.fin)
            return True
        return False

    def _inflater_held(self) -> bool:
        return self._inflater is not None

    def _release_partial(self) -> None:
        super()._release_partial()
        self._inflater = None  # whole, or given up: its inflater goes with it

    def _inflated(self, text: bool | None, data: memoryview, fin: bool) -> None:
        """A frame of a compressed message: inflated, then delivered or reassembled."""
        if self.closing:
            return
        assert self._inflater is not None
        try:
            message = self._inflater.feed(data, fin)
        except InflatedTooBig:
            self._inflater = None
            self._fail(CLOSE_MESSAGE_TOO_BIG, "message over MAX_FRAME_BYTES")
            return
        except InvalidCompressedData as exc:
            self._inflater = None
            self._fail(CLOSE_INVALID_TEXT, exc.reason)
            return
        if fin:
            self._inflater = None
        if fin and self._fragments is None:
            if text:
                self._deliver_text(message)
            else:
                self._deliver(message)
        else:
            self._fragment(text, message, fin)


class PicowsTransport(ServerTransport):
    """Serves ``/ws`` (and ``/healthz``, ``/stats``, the web page) with picows."""

    def __init__(
        self,
        settings: Settings,
        service: ChatService,
        verifier: TokenVerifier,
        codec: Codec,
        listen_socket: socket.socket | None = None,
    ) -> None:
        super().__init__(settings, service, verifier, codec, listen_socket)
        self._headers = dict(self.worker_headers)
        self._shared_deflate = self.negotiated_framing is Framing.SHARED_DEFLATE

    def connection_protocol(self, peer: str) -> asyncio.BufferedProtocol:
        """picows' server protocol for a connection from ``peer``, with :meth:`_route` as
        its router."""
        return server_protocol(partial(self._route, peer), self.settings.max_frame_bytes)

    def _route(self, peer: str, request: WSUpgradeRequest) -> WSUpgradeResponseWithListener:
        """picows' listener factory: an HTTP answer, or the upgrade with its listener."""
        headers = request.headers
        decision = self.admission.decide(
            request.path.decode("latin-1"),
            headers.get("Authorization"),
            headers.getall("Sec-WebSocket-Protocol", ()),
            request.method.decode("latin-1"),
            peer=peer,
            forwarded_for=headers.getall(FORWARDED_FOR, ()),
        )
        if isinstance(decision, Admitted):
            extra = self._headers
            if decision.subprotocol is not None:
                extra = {**extra, "Sec-WebSocket-Protocol": decision.subprotocol}
            deflate = (
                answer_offers(headers.getall("Sec-WebSocket-Extensions", ()))
                if self._shared_deflate
                else None
            )
            framing = Framing.PLAIN
            if deflate is not None:
                extra = {**extra, "Sec-WebSocket-Extensions": deflate}
                framing = self.negotiated_framing
            listener = PicowsPeer(self, decision.user, framing, decision.client)
            return WSUpgradeResponseWithListener(
                WSUpgradeResponse.create_101_response(extra), listener
            )
        extra = {**self._headers, "Content-Type": decision.content_type, **dict(decision.headers)}
        body = decision.body.encode()
        response = (
            WSUpgradeResponse.create_ok_response(body, extra)
            if decision.status < 400
            else WSUpgradeResponse.create_error_response(decision.status, body, extra)
        )
        return WSUpgradeResponseWithListener(response, None)


def server_protocol(
    route: Callable[[WSUpgradeRequest], Any], max_frame_bytes: int
) -> asyncio.BufferedProtocol:
    """picows' protocol for one accepted connection, as ``ws_create_server`` builds it:
    ``route`` answers the request, frames over ``max_frame_bytes`` close it, its own
    keepalive is off (:class:`ChatPeer`'s closes with 1011) and so is its auto-pong
    (:class:`PicowsPeer` answers pings, so that the pongs count toward the 1013 bound)."""
    return WSProtocol(  # type: ignore[no-any-return]
        None,  # host and port: a client's
        None,  # the path: a client's
        False,  # the server side
        route,
        picows_log,
        True,  # disconnect when a callback raises
        HANDSHAKE_TIMEOUT_S,
        False,  # picows' auto-ping
        20.0,
        20.0,
        WSAutoPingStrategy.PING_WHEN_IDLE,
        False,  # picows' auto-pong: PicowsPeer answers pings, counting the pongs
        max_frame_bytes,
        None,  # extra headers: a client's
        READ_BUFFER_INIT_BYTES,
    )
