"""The picows transport (``TRANSPORT=picows``): the same contract as websockets, cheaper per frame.

picows calls back per frame from the event loop, with no task or queue per
connection. What it does not do for us is done here, the way the websockets
transport does it:

- The handshake is :class:`~chat_server.transport.base.Admission`'s, run in
  picows' listener factory: ``/healthz``, ``/stats``, 404, 503, 401 before 400,
  the chosen subprotocol and ``X-Chatlab-Worker`` on every response.
- Writes: the frames one connection gets during a loop iteration are written
  together, in one write, at its end (the transport's
  :class:`~chat_server.transport.base.WriteCoalescer`, as on websockets); a
  broadcast's framing is built once for all its recipients.
- Outbound accounting: the connection's asyncio write buffer (picows writes
  straight to the socket while that buffer is empty and leaves the rest there).
  Its high-water mark is set below ``MAX_OUTBOUND_BYTES``, so the buffer is only
  measured while picows reports writing paused; past the bound the connection
  gets close 1013 "slow consumer" and is dropped if it does not finish the
  closing handshake within ``CLOSE_TIMEOUT_S``. Replays (:meth:`PicowsPeer.send_paced`)
  wait for writing to resume instead, so they never trip 1013.
- Keepalive: a ping every ``PING_INTERVAL_S``; no pong within ``PING_TIMEOUT_S``
  closes with 1011 (picows' own auto-ping closes with 1001).
- Closing handshakes (echoing the client's close, dropping after
  ``CLOSE_TIMEOUT_S``), messages sent in several frames (reassembled, bounded by
  ``MAX_FRAME_BYTES``) and text frames that are not UTF-8 (1007).

picows has no permessage-deflate: ``WS_DEFLATE=on`` is refused at start with this
transport (see :mod:`chat_server.settings`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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

from chat_server.auth import TokenVerifier
from chat_server.codecs.base import Codec
from chat_server.settings import Settings
from chat_server.transport.base import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL_ERROR,
    CLOSE_INVALID_TEXT,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_PROTOCOL_ERROR,
    CLOSE_TRY_AGAIN_LATER,
    WORKER_HEADER,
    Admitted,
    CoalescedPeer,
    Reply,
    ServerTransport,
    bound_send_buffer,
    reset_on_abort,
)

if TYPE_CHECKING:
    from chat_server.core.chat import Session
    from chat_server.service import ChatService

# picows logs every connection's open and close at INFO: one line per connection is
# noise under load, so its logger starts at WARNING (LOG_LEVEL=debug shows it).
picows_log = logging.getLogger("chat_server.transport.picows")
log = logging.getLogger("chat_server.transport")

#: seconds a client has to send its upgrade request (websockets' open_timeout)
HANDSHAKE_TIMEOUT_S = 10.0

TEXT = WSMsgType.TEXT
BINARY = WSMsgType.BINARY
CONTINUATION = WSMsgType.CONTINUATION
CLOSE = WSMsgType.CLOSE
PONG = WSMsgType.PONG


class PicowsPeer(CoalescedPeer, WSListener):  # type: ignore[misc]
    """One connection: its frames to the service, the service's frames out, with accounting."""

    def __init__(self, owner: PicowsTransport, user: str) -> None:
        super().__init__()
        self.owner = owner
        self.user = user
        self.session: Session | None = None
        #: a close frame was sent or the connection is gone: nothing more is written
        self.closing = False
        #: the write buffer is over its high-water mark (picows says so)
        self.paused = False
        #: the TCP transport under the websocket (its write buffer is the one accounted)
        self.tcp: asyncio.Transport | None = None
        self._ws: WSTransport | None = None
        self._kind = BINARY if owner.codec.binary else TEXT
        self._coalescer = owner.coalescer
        self._out: list[bytes] | None = None
        self._out_bytes = 0
        #: what may still be queued this iteration before the bound is passed
        self._room = owner.max_outbound_bytes
        self._stats = owner.stats
        self._on_frame = owner.service.on_frame
        self._drained: list[asyncio.Future[None]] = []
        self._fragments: bytearray | None = None
        self._fragments_kind = TEXT
        self._keepalive: asyncio.TimerHandle | None = None
        self._pong_due = False
        self._drop: asyncio.TimerHandle | None = None

    # ---- picows callbacks ---------------------------------------------------------------

    def on_ws_connected(self, transport: WSTransport) -> None:
        owner = self.owner
        self._ws = transport
        self._write = transport.send
        self.tcp = tcp = transport.underlying_transport
        tcp.set_write_buffer_limits(high=owner.paced_high_water_bytes)
        bound_send_buffer(tcp, owner.settings.socket_send_buffer_bytes)
        owner.peers.add(self)
        self.session = owner.service.open(self.user, self.send, self.send_paced, self.close)
        if owner.ping_interval_s:
            self._keepalive = owner.loop.call_later(owner.ping_interval_s, self._ping)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        kind = frame.msg_type
        if frame.fin and self._fragments is None:
            if kind == TEXT:
                try:
                    payload: bytes | str = frame.get_payload_as_utf8_text()
                except UnicodeDecodeError:
                    self._fail(CLOSE_INVALID_TEXT, "invalid UTF-8 in a text frame")
                    return
                self._on_frame(self.session, payload)
                return
            if kind == BINARY:
                self._on_frame(self.session, frame.get_payload_as_bytes())
                return
        if kind == CLOSE:
            self._on_close(transport, frame)
        elif kind == PONG:
            self._on_pong()
        elif kind in (TEXT, BINARY, CONTINUATION):
            self._on_fragment(frame)

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        self.closing = True
        for handle in (self._keepalive, self._drop):
            if handle is not None:
                handle.cancel()
        self._wake_paced(ConnectionError("connection closed"))
        owner = self.owner
        owner.peers.discard(self)
        if self.session is not None:
            owner.service.disconnect(self.session)
        if not owner.peers:
            owner.all_gone.set()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_paced(None)

    # ---- the service's side -------------------------------------------------------------

    def _room_now(self) -> int | None:
        if self.closing or self.tcp is None:
            return None
        return self.owner.max_outbound_bytes - self.tcp.get_write_buffer_size()

    def flush(self) -> None:
        """Write the frames queued in one write; close 1013 when the buffer passes the bound."""
        frames, self._out = self._out, None
        if not frames or self.closing or self.tcp is None:
            return
        framed = self._coalescer.framed
        # straight to the TCP transport: picows writes there too once it holds data,
        # so frames stay in order
        self.tcp.write(b"".join([framed(frame) for frame in frames]))
        self._stats.frames_out += len(frames)
        self._check_outbound()

    async def send_paced(self, frame: bytes) -> None:
        """Write one frame and wait until the client has read enough (replay pacing)."""
        if self._out:
            self.flush()  # what was sent before goes first
        if self.closing:
            raise ConnectionError("connection is closing")
        self._write(self._kind, frame)
        self._stats.frames_out += 1
        if self.paused:
            drained = self.owner.loop.create_future()
            self._drained.append(drained)
            await drained

    def close(self, code: int, reason: str) -> None:
        """Start the closing handshake now; drop the connection if it is not done in time.

        Frames queued before the close go out before it.
        """
        if self.closing or self._ws is None:
            return
        if self._out:
            self.flush()
            if self.closing:  # the flush closed it (1013)
                return
        self.closing = True
        self._ws.send_close(WSCloseCode(code), reason.encode())
        self._drop_later()

    # ---- internals ----------------------------------------------------------------------

    def _check_outbound(self) -> None:
        stats = self._stats
        assert self.tcp is not None
        buffered = self.tcp.get_write_buffer_size()
        stats.peak_outbound_bytes = max(stats.peak_outbound_bytes, buffered)
        if buffered > self.owner.max_outbound_bytes:
            stats.slow_consumer_closes += 1
            self.close(CLOSE_TRY_AGAIN_LATER, "slow consumer")

    def _wake_paced(self, error: Exception | None) -> None:
        drained, self._drained = self._drained, []
        for waiter in drained:
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def _on_close(self, transport: WSTransport, frame: WSFrame) -> None:
        """The client's close frame: the end of our closing handshake, or echo it and go."""
        if not transport.is_close_frame_sent:
            self.closing = True
            # the status code and reason, echoed as they came (also when there is none)
            transport.send(CLOSE, frame.get_payload_as_bytes())
            self._drop_later()
        transport.disconnect()

    def _on_fragment(self, frame: WSFrame) -> None:
        """A message sent in several frames: reassembled, then handled as one frame."""
        if self.closing:
            return  # the rest of a message refused (1009, 1007) or sent after our close
        kind = frame.msg_type
        if kind == CONTINUATION:
            if self._fragments is None:
                self._fail(CLOSE_PROTOCOL_ERROR, "continuation frame without a message")
                return
        elif self._fragments is not None:
            self._fail(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
            return
        else:
            self._fragments = bytearray()
            self._fragments_kind = kind
        fragments = self._fragments
        if len(fragments) + frame.payload_size > self.owner.max_frame_bytes:
            self._fail(CLOSE_MESSAGE_TOO_BIG, "message over MAX_FRAME_BYTES")
            return
        fragments += frame.get_payload_as_memoryview()
        if not frame.fin:
            return
        self._fragments = None
        if self._fragments_kind == BINARY:
            self._on_frame(self.session, bytes(fragments))
            return
        try:
            text = fragments.decode()
        except UnicodeDecodeError:
            self._fail(CLOSE_INVALID_TEXT, "invalid UTF-8 in a text message")
            return
        self._on_frame(self.session, text)

    def _fail(self, code: int, reason: str) -> None:
        """Close with ``code`` for something the client did wrong; its later frames are dropped.

        The socket is not shut at once: a close with the client's unread frames still in
        our receive buffer would go out as a TCP reset, and the client could lose the
        close frame (and its code). The closing handshake, or the drop after
        ``CLOSE_TIMEOUT_S``, ends the connection, as for every other close.
        """
        self._fragments = None
        self.close(code, reason)

    def _ping(self) -> None:
        if self.closing or self._ws is None:
            return
        self._ws.send_ping()
        self._pong_due = True
        self._keepalive = self.owner.loop.call_later(self.owner.ping_timeout_s, self._no_pong)

    def _on_pong(self) -> None:
        if not self._pong_due or self.closing:
            return  # unsolicited: a client may send pongs as heartbeats
        self._pong_due = False
        assert self._keepalive is not None
        self._keepalive.cancel()
        self._keepalive = self.owner.loop.call_later(self.owner.ping_interval_s, self._ping)

    def _no_pong(self) -> None:
        self._keepalive = None
        self._fail(CLOSE_INTERNAL_ERROR, "keepalive ping timeout")

    def _drop_later(self) -> None:
        """Drop the connection if it is still there after ``CLOSE_TIMEOUT_S``."""
        if self._drop is None:
            self._drop = self.owner.loop.call_later(self.owner.close_timeout_s, self.abort)

    def abort(self) -> None:
        """Drop the connection now, without (or without finishing) a closing handshake."""
        self._drop = None
        if self.tcp is not None:
            reset_on_abort(self.tcp)
            self.tcp.abort()


class PicowsTransport(ServerTransport):
    """Serves ``/ws`` (and ``/healthz``, ``/stats``) with picows."""

    #: the loop it serves on (set by :meth:`start`); connections' timers run on it
    loop: asyncio.AbstractEventLoop
    _server: asyncio.Server | None = None

    def __init__(
        self,
        settings: Settings,
        service: ChatService,
        verifier: TokenVerifier,
        codec: Codec,
        listen_socket: socket.socket | None = None,
    ) -> None:
        super().__init__(settings, service, verifier, codec, listen_socket)
        self.peers: set[PicowsPeer] = set()
        self.all_gone = asyncio.Event()
        self.max_outbound_bytes = settings.max_outbound_bytes
        self.max_frame_bytes = settings.max_frame_bytes
        self.close_timeout_s = settings.close_timeout_s
        self.ping_interval_s = settings.ping_interval_s
        self.ping_timeout_s = settings.ping_timeout_s
        self._headers = {WORKER_HEADER: self.worker}

    async def start(self) -> None:
        """Listen on ``CHAT_HOST:CHAT_PORT``, or accept on the socket given (WORKERS > 1)."""
        self.loop = asyncio.get_running_loop()
        self._server = await ws_create_server(
            self._route,
            **self.listen_on(),
            websocket_handshake_timeout=HANDSHAKE_TIMEOUT_S,
            logger_name=picows_log,
            enable_auto_ping=False,  # ours closes with 1011, as the contract says
            enable_auto_pong=True,
            max_frame_size=self.settings.max_frame_bytes,
            start_serving=False,
        )
        gate_methods(self._server, self._refuse_method)
        await self._server.start_serving()

    def _refuse_method(self, method: str, target: str) -> bytes:
        """The HTTP answer (405, as Admission decides it) to a request that is not a GET."""
        reply = self.admission.decide(target, None, (), method)
        assert isinstance(reply, Reply)
        body = reply.body.encode()
        headers = {
            **self._headers,
            "Content-Type": reply.content_type,
            "Content-Length": str(len(body)),
            "Connection": "close",
            **dict(reply.headers),
        }
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        status = f"HTTP/1.1 {reply.status.value} {reply.status.phrase}\r\n"
        return (status + head + "\r\n").encode("latin-1") + body

    @property
    def port(self) -> int:
        """The port actually bound."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def stop_accepting(self) -> None:
        """Close the listening socket; open connections stay."""
        if self._server is not None:
            self._server.close()

    async def close_all(self, code: int = CLOSE_GOING_AWAY, reason: str = "") -> None:
        """Close every connection with ``code`` and wait until they are gone.

        Frames queued in this iteration are written first. Each connection is
        dropped if its closing handshake is not done within ``CLOSE_TIMEOUT_S``, so
        this returns within about that long.
        """
        self.coalescer.flush()
        self.stop_accepting()
        if not self.peers:
            return
        self.all_gone.clear()
        for peer in list(self.peers):
            peer.close(code, reason)
        try:
            await asyncio.wait_for(self.all_gone.wait(), self.close_timeout_s + 1)
        except TimeoutError:
            log.warning("%d connections outlived their closing handshake: dropped", len(self.peers))
            for peer in list(self.peers):
                peer.abort()

    def metrics_snapshot(self) -> dict[str, Any]:
        """What the metrics collector reads at scrape time."""
        return self.admission.metrics_snapshot(
            sum(p.tcp.get_write_buffer_size() for p in self.peers if p.tcp is not None)
        )

    def _route(self, request: WSUpgradeRequest) -> WSUpgradeResponseWithListener:
        """picows' listener factory: an HTTP answer, or the upgrade with its listener."""
        headers = request.headers
        decision = self.admission.decide(
            request.path.decode("latin-1"),
            headers.get("Authorization"),
            headers.getall("Sec-WebSocket-Protocol", ()),
            request.method.decode("latin-1"),
        )
        if isinstance(decision, Admitted):
            extra = self._headers
            if decision.subprotocol is not None:
                extra = {**extra, "Sec-WebSocket-Protocol": decision.subprotocol}
            return WSUpgradeResponseWithListener(
                WSUpgradeResponse.create_101_response(extra),
                PicowsPeer(self, decision.user),
            )
        extra = {**self._headers, "Content-Type": decision.content_type, **dict(decision.headers)}
        body = decision.body.encode()
        response = (
            WSUpgradeResponse.create_ok_response(body, extra)
            if decision.status < 400
            else WSUpgradeResponse.create_error_response(decision.status, body, extra)
        )
        return WSUpgradeResponseWithListener(response, None)


class MethodGate(asyncio.Protocol):
    """A connection's first bytes, before picows sees them: a GET goes on to picows'
    protocol (which then owns the transport, so this is off the per-frame path); any
    other method gets ``refuse``'s answer (405), not picows' 400 without ``Allow``.

    After the answer the write side is shut and what the client still sends (a
    body) is read and dropped until it closes or ``HANDSHAKE_TIMEOUT_S`` passes, so
    the answer is not lost to a TCP reset.
    """

    def __init__(
        self, websocket: asyncio.BufferedProtocol, refuse: Callable[[str, str], bytes]
    ) -> None:
        self._websocket = websocket
        self._refuse = refuse
        self._head = b""
        self._transport: asyncio.Transport | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        head = self._head = self._head + data
        if len(head) < 4 and b" " not in head:
            return
        transport = self._transport
        assert transport is not None
        if head.startswith(b"GET "):
            websocket = self._websocket
            transport.set_protocol(websocket)
            websocket.connection_made(transport)
            while head:
                buffer = websocket.get_buffer(len(head))
                n = min(len(buffer), len(head))
                buffer[:n] = head[:n]
                websocket.buffer_updated(n)
                head = head[n:]
            return
        if b"\n" not in head and len(head) < 8192:
            return  # wait for the whole request line
        line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        self._refused = True
        transport.write(self._refuse(line[0], line[1] if len(line) > 1 else "/"))
        transport.write_eof()
        asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT_S, transport.close)

    def eof_received(self) -> bool:
        if self._transport is not None:
            self._transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


def gate_methods(server: Any, refuse: Callable[[str, str], bytes]) -> None:
    """Put a :class:`MethodGate` in front of each connection of a picows server not serving yet."""
    make_websocket = server._protocol_factory

    def gated() -> MethodGate:
        return MethodGate(make_websocket(), refuse)

    server._protocol_factory = gated
