"""The websockets transport: handshake auth, subprotocols, limits and slow consumers.

Built on ``websockets.asyncio.server``. The handshake (``process_request``)
answers ``/healthz`` and ``/stats``, refuses a bad token with 401 before a wrong
subprotocol with 400, and admits at most ``MAX_CONNECTIONS``. Outgoing frames are
written without waiting (like ``websockets.broadcast``, which has no
backpressure), so the outbound accounting is ours: after each write the
connection's transport write-buffer size is checked, and past
``MAX_OUTBOUND_BYTES`` the connection gets close 1013 "slow consumer" and is
dropped if it does not finish the closing handshake within ``CLOSE_TIMEOUT_S``.
Nobody else waits for it. Replays use :meth:`WebsocketsPeer.send_paced`, which
waits for the client to read instead.

A request with another method than GET gets 405 with ``Allow: GET``, also when
it has a body (which websockets' own parser refuses without a word: see
:class:`AnyMethodProtocol`). Every HTTP response, the websocket handshake's included, carries
``X-Chatlab-Worker: <pid>``, so a client (or a test) can tell which of several
``WORKERS`` served it. With ``WORKERS`` > 1 the listening socket is the one the
supervisor bound and handed down (see :mod:`chat_server.supervisor`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Generator
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidMessage
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response, parse_headers, parse_line
from websockets.protocol import CONNECTING, OPEN, Event, State
from websockets.server import ServerProtocol

from chat_server.regressions import Regression
from chat_server.settings import Settings
from chat_server.transport.base import (
    CLOSE_GOING_AWAY,
    CLOSE_TRY_AGAIN_LATER,
    WORKER_HEADER,
    Admitted,
    CoalescedPeer,
    OutboundStats,
    Reply,
    ServerTransport,
    WriteCoalescer,
    bound_send_buffer,
    reset_on_abort,
)

# websockets logs every connection's open and close at INFO: one line per connection
# is noise under load, so its own logger starts at WARNING (LOG_LEVEL=debug shows it).
ws_log = logging.getLogger("chat_server.transport.websockets")


class WebsocketsPeer(CoalescedPeer):
    """One connection's write side: frames coalesced per loop iteration, outbound accounting.

    :meth:`send` only appends to the connection's list; the transport's
    :class:`~chat_server.transport.base.WriteCoalescer` has :meth:`flush` write the
    list in one write at the end of the iteration. Without permessage-deflate the
    frames' framing is built once per broadcast for every recipient; with it, each
    frame goes through the connection's own compressor, still in one flush.
    """

    __slots__ = (
        "_coalescer",
        "_conn",
        "_max",
        "_out",
        "_out_bytes",
        "_plain",
        "_protocol",
        "_room",
        "_stats",
        "_timeout",
        "_transport",
        "_write",
    )

    def __init__(
        self,
        conn: ServerConnection,
        *,
        binary: bool,
        max_outbound_bytes: int,
        close_timeout_s: float,
        stats: OutboundStats,
        coalescer: WriteCoalescer,
    ) -> None:
        self._conn = conn
        self._protocol = conn.protocol
        self._write = conn.protocol.send_binary if binary else conn.protocol.send_text
        self._transport = conn.transport
        self._max = max_outbound_bytes
        self._timeout = close_timeout_s
        self._stats = stats
        self._coalescer = coalescer
        #: no extension negotiated: the coalescer's shared framing fits this connection
        self._plain = not conn.protocol.extensions
        self._out: list[bytes] | None = None
        self._out_bytes = 0
        #: what may still be queued this iteration before the bound is passed
        self._room = max_outbound_bytes

    def _writable(self) -> bool:
        # a peer that reset is still OPEN to the protocol until its reader sees EOF, but
        # its transport is closing: writing there makes asyncio log a warning per frame
        return self._protocol.state is OPEN and not self._transport.is_closing()

    def _room_now(self) -> int | None:
        if not self._writable():
            return None
        return self._max - self._transport.get_write_buffer_size()

    def flush(self) -> None:
        """Write the frames queued in one write; close 1013 when the buffer passes the bound."""
        frames, self._out = self._out, None
        if not frames or not self._writable():
            return
        if self._plain:
            framed = self._coalescer.framed
            self._transport.write(b"".join([framed(frame) for frame in frames]))
        else:
            write = self._write
            for frame in frames:
                write(frame)
            self._transport.write(b"".join(self._protocol.data_to_send()))
        stats = self._stats
        stats.frames_out += len(frames)
        buffered = self._transport.get_write_buffer_size()
        stats.peak_outbound_bytes = max(stats.peak_outbound_bytes, buffered)
        if buffered > self._max:
            stats.slow_consumer_closes += 1
            self.close(CLOSE_TRY_AGAIN_LATER, "slow consumer")

    async def send_paced(self, frame: bytes) -> None:
        """Write one frame and wait until the client has read enough (replay pacing)."""
        if self._out:
            self.flush()  # what was sent before goes first
        if self._protocol.state is not OPEN:
            raise ConnectionError("connection is closing")
        self._stats.frames_out += 1
        try:
            await self._conn.send(frame, text=self._write == self._protocol.send_text)
        except ConnectionClosed as exc:
            raise ConnectionError(str(exc)) from None

    def close(self, code: int, reason: str) -> None:
        """Start the closing handshake now; drop the connection if it is not done in time.

        Frames queued before the close go out before it.
        """
        if self._protocol.state is not OPEN:
            return
        if self._out:
            self.flush()
            if self._protocol.state is not OPEN:  # the flush closed it (1013)
                return
        self._protocol.send_close(code, reason)
        self._conn.send_data()
        asyncio.get_running_loop().call_later(self._timeout, self._drop_if_open)

    def _drop_if_open(self) -> None:
        if self._protocol.state is not State.CLOSED:
            reset_on_abort(self._transport)
            self._transport.abort()


class AnyMethodProtocol(ServerProtocol):
    """websockets' server protocol, except that a request whose method is not GET reaches
    ``process_request`` even with a body, so it is answered (405) instead of dropped.

    A GET request goes through websockets' own parser unchanged. Another method's
    request line and headers are parsed here; its body is discarded until the answer
    (sent by the handshake, as for any refused request) ends the connection.
    """

    def parse(self) -> Generator[None]:
        reader = self.reader
        if self.state is CONNECTING:
            while len(reader.buffer) < 4 and not reader.eof:
                yield
            if reader.buffer[:4] != b"GET ":
                yield from self._parse_other_method()
                return
        yield from super().parse()

    def _parse_other_method(self) -> Generator[None]:
        reader = self.reader
        try:
            line = yield from parse_line(reader.read_line, ValueError)
            method, path, protocol = line.decode("ascii").split(" ", 2)
            if protocol not in ("HTTP/1.1", "HTTP/1.0"):
                raise ValueError(f"unsupported protocol {protocol[:16]!r}")
            headers = yield from parse_headers(reader.read_line)
        except Exception as exc:  # websockets' own parse refuses any bad head this way
            self.handshake_exc = InvalidMessage("did not receive a valid HTTP request")
            self.handshake_exc.__cause__ = exc
            self.send_eof()
            self.parser = self.discard()
            next(self.parser)
            yield
            return
        self.events.append(Request(path, headers, method, protocol))
        # the body: dropped until the handshake's answer replaces this parser
        while not (yield from reader.at_eof()):
            reader.discard()
        yield


class ChatConnection(ServerConnection):
    """A websockets server connection whose protocol is :class:`AnyMethodProtocol`, and
    whose messages go straight to a callback.

    websockets hands each message to ``recv()`` through its ``Assembler``: a queue, a
    future and a wake-up of the handler's task per message. Here :meth:`process_event`
    assembles data frames itself (fragments included; the protocol has already bounded
    the message by ``max_size`` and inflated it with permessage-deflate) and calls the
    callback given to :meth:`deliver_to`, in order, from ``data_received``: one less
    loop iteration per message. Messages complete before :meth:`deliver_to` wait for it.
    A text message that is not UTF-8 fails the connection with 1007, as ``recv()``
    would; a callback that raises fails it with 1011 (logged), as a handler that raises
    does. ``recv()`` is not used (it would wait forever).

    Its own fields are slots: added to the instance's ``__dict__`` they pushed it past
    the 30 keys a class's instances can share, and every connection then carried a
    dict of its own (``docs/decisions/0008-messages-from-data-received.md``).
    """

    __slots__ = ("_early", "_fragmented_text", "_fragments", "_on_message", "chat_user")

    def __init__(self, protocol: ServerProtocol, *args: Any, **kwargs: Any) -> None:
        protocol.__class__ = AnyMethodProtocol
        protocol.parser = protocol.parse()  # no data was received yet: restart the parser
        next(protocol.parser)
        super().__init__(protocol, *args, **kwargs)
        self._on_message: Callable[[str | bytes], None] | None = None
        #: messages complete before deliver_to (None after it); a message's fragments so far
        #: (None between messages)
        self._early: list[str | bytes] | None = []
        self._fragments: list[bytes] | None = None
        self._fragmented_text = False

    def deliver_to(self, on_message: Callable[[str | bytes], None]) -> None:
        """From now on call ``on_message`` with each message (text as str, binary as
        bytes); the ones that arrived before go first."""
        early, self._early = self._early or [], None
        self._on_message = on_message
        for message in early:
            self._deliver(message)

    def process_event(self, event: Event) -> None:
        if self.request is None or not isinstance(event, Frame):
            super().process_event(event)  # the handshake request
            return
        opcode = event.opcode
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            if not event.fin:
                self._fragments = [event.data]
                self._fragmented_text = opcode is Opcode.TEXT
                return
            data, text = event.data, opcode is Opcode.TEXT
        elif opcode is Opcode.CONT:
            # websockets refuses a continuation frame that starts no message (1002)
            assert self._fragments is not None
            self._fragments.append(event.data)
            if not event.fin:
                return
            data, text = b"".join(self._fragments), self._fragmented_text
            self._fragments = None
        else:
            super().process_event(event)  # control frames: pongs acknowledge pings
            return
        if text:
            try:
                message: str | bytes = data.decode()
            except UnicodeDecodeError as exc:
                self.protocol.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
                self.send_data()
                return
        else:
            message = bytes(data)
        if self._early is not None:
            self._early.append(message)
        else:
            self._deliver(message)

    def _deliver(self, message: str | bytes) -> None:
        if self.protocol.state is not OPEN:
            return  # failed or closing: what follows is not read
        assert self._on_message is not None
        try:
            self._on_message(message)
        except Exception:
            ws_log.error("message handler failed", exc_info=True)
            self.protocol.fail(CloseCode.INTERNAL_ERROR)
            self.send_data()


class WebsocketsTransport(ServerTransport):
    """Serves ``/ws`` (and ``/healthz``, ``/stats``) with the websockets library."""

    _server: Server | None = None

    async def start(self) -> None:
        """Listen on ``CHAT_HOST:CHAT_PORT``, or accept on the socket given (WORKERS > 1)."""
        s = self.settings
        self._server = await serve(
            self._handler,
            **self.listen_on(),
            create_connection=ChatConnection,
            process_request=self._process_request,
            process_response=self._process_response,
            select_subprotocol=self._select_subprotocol,
            compression=None,
            extensions=_deflate_extensions(s),
            max_size=s.max_frame_bytes,
            write_limit=self.paced_high_water_bytes,
            ping_interval=s.ping_interval_s or None,
            ping_timeout=s.ping_timeout_s or None,
            close_timeout=s.close_timeout_s,
            server_header=None,
            logger=ws_log,
        )

    @property
    def port(self) -> int:
        """The port actually bound."""
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def stop_accepting(self) -> None:
        """Close the listening socket; open connections stay."""
        if self._server is not None:
            self._server.server.close()

    async def close_all(self, code: int = CLOSE_GOING_AWAY, reason: str = "") -> None:
        """Close every connection with ``code`` and wait until their handlers returned.

        Frames queued in this iteration are written first.
        """
        self.coalescer.flush()
        if self._server is not None:
            # websockets aborts a connection whose closing handshake is not done in
            # CLOSE_TIMEOUT_S: make those aborts resets (see reset_on_abort)
            reset_later = asyncio.get_running_loop().call_later(
                self.settings.close_timeout_s * 0.9, self._reset_unclosed
            )
            self._server.close(close_connections=True, code=code, reason=reason)
            await self._server.wait_closed()
            reset_later.cancel()

    def _reset_unclosed(self) -> None:
        assert self._server is not None
        for connection in self._server.connections:
            if connection.protocol.state is not State.CLOSED:
                reset_on_abort(connection.transport)

    # ---- handshake -------------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        decision = self.admission.decide(
            request.path,
            request.headers.get("Authorization"),
            request.headers.get_all("Sec-WebSocket-Protocol"),
            request.method,
        )
        if isinstance(decision, Admitted):
            connection.chat_user = decision.user  # type: ignore[attr-defined]
            return None
        return _respond(connection, decision)

    def _process_response(
        self, connection: ServerConnection, request: Request, response: Response
    ) -> None:
        response.headers[WORKER_HEADER] = self.worker

    def _select_subprotocol(self, connection: ServerConnection, subprotocols: Any) -> Any:
        ours = self.codec.subprotocol
        return ours if ours in subprotocols else None

    def metrics_snapshot(self) -> dict[str, Any]:
        """What the metrics collector reads at scrape time."""
        connections = self._server.connections if self._server is not None else set()
        return self.admission.metrics_snapshot(
            sum(c.transport.get_write_buffer_size() for c in connections if c.transport)
        )

    # ---- connection --------------------------------------------------------------------

    async def _handler(self, connection: ServerConnection) -> None:
        s = self.settings
        bound_send_buffer(connection.transport, s.socket_send_buffer_bytes)
        peer = WebsocketsPeer(
            connection,
            binary=self.codec.binary,
            max_outbound_bytes=s.max_outbound_bytes,
            close_timeout_s=s.close_timeout_s,
            stats=self.stats,
            coalescer=self.coalescer,
        )
        service = self.service
        session = service.open(connection.chat_user, peer.send, peer.send_paced, peer.close)  # type: ignore[attr-defined]
        on_frame = service.on_frame
        try:
            connection.deliver_to(functools.partial(on_frame, session))  # type: ignore[attr-defined]
            await connection.wait_closed()
        finally:
            service.disconnect(session)


def permessage_deflate(window_bits: int = 12, mem_level: int = 5) -> ServerPerMessageDeflateFactory:
    """The server's permessage-deflate offer answer: window ``2^window_bits`` both ways."""
    return ServerPerMessageDeflateFactory(
        server_max_window_bits=window_bits,
        client_max_window_bits=window_bits,
        compress_settings={"memLevel": mem_level},
    )


def _deflate_extensions(settings: Settings) -> list[ServerPerMessageDeflateFactory] | None:
    """permessage-deflate as ``WS_DEFLATE`` says: websockets' memory-frugal defaults.

    On: window 2^12 both ways and zlib memLevel 5, since even these cost several times
    the memory per idle connection of deflate off
    (``docs/decisions/0009-permessage-deflate.md``).
    REGRESSION=deflate_max_window: window 2^15 and memLevel 9, zlib's maximum
    (its memory cost is for the lab to measure).
    """
    if not settings.ws_deflate:
        return None
    window_bits, mem_level = Regression.of(settings).deflate_window()
    return [permessage_deflate(window_bits=window_bits, mem_level=mem_level)]


def _respond(connection: ServerConnection, reply: Reply) -> Response:
    """A websockets response carrying ``reply``'s status, body and content type."""
    response = connection.respond(reply.status, reply.body)
    if reply.content_type != response.headers["Content-Type"]:
        del response.headers["Content-Type"]  # Headers append on assignment
        response.headers["Content-Type"] = reply.content_type
    for name, value in reply.headers:
        response.headers[name] = value
    return response
