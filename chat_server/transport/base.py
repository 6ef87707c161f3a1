"""The transport seam: what the server needs from a websocket implementation.

A transport accepts connections (handshake auth and subprotocol per the
contract), hands each connection's frames to ``ChatService.on_frame`` (a text
frame as ``str``, a binary one as ``bytes``: the codec decides what it accepts)
and writes the frames the core gives it, with its own outbound accounting. The
core, codecs, store and broker never know which transport runs.

What both transports do alike lives here and beside it: :class:`ServerTransport`
accepts (:mod:`chat_server.transport.accept`), closes every connection on
shutdown and reports the metrics; :class:`Admission` answers every HTTP request on
the websocket port (``/healthz``, ``/stats``, and the upgrade's 503, 401 and 400 in
the contract's order), free of I/O; :class:`WriteCoalescer` batches each
connection's writes per loop iteration; :class:`OutboundStats` holds the outbound
counters ``/stats`` and the metrics report. A connection's own side (its bound,
closing, keepalive, reassembly) is :class:`~chat_server.transport.peer.ChatPeer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import socket
import ssl
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlsplit

from websockets.frames import Frame, Opcode

from chat_server.auth import InvalidToken, TokenVerifier
from chat_server.codecs.base import Codec
from chat_server.settings import Settings
from chat_server.transport.accept import Acceptor, MethodGate, listening_socket
from chat_server.transport.deflate import Framing, SharedCompressor, deflated_frame
from chat_server.web import WebSite
from chatlab.forwarded import client_address
from chatlab.tls import server_context

if TYPE_CHECKING:
    from chat_server.service import ChatService
    from chat_server.transport.peer import ChatPeer

log = logging.getLogger("chat_server.transport")

CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_INVALID_TEXT = 1007
CLOSE_POLICY_VIOLATION = 1008
CLOSE_MESSAGE_TOO_BIG = 1009
CLOSE_INTERNAL_ERROR = 1011
CLOSE_TRY_AGAIN_LATER = 1013
#: with EXPOSE_INTERNALS=on, the header every HTTP response carries (the websocket
#: handshake's included): the pid of the process that answered
WORKER_HEADER = "X-Chatlab-Worker"
WS_PATH = "/ws"
#: the write buffer's high-water mark at most: paced sends (replay) wait below it
PACED_HIGH_WATER_BYTES = 2**15


class ServerTransport(ABC):
    """A websocket server: what both transports share, and the one method each adds.

    It accepts with its own :class:`~chat_server.transport.accept.Acceptor` (on
    ``CHAT_HOST:CHAT_PORT``, or the socket the supervisor handed down with
    ``WORKERS`` > 1). Every connection passes a
    :class:`~chat_server.transport.accept.MethodGate` (405 for a method but GET),
    then goes on to the protocol :meth:`connection_protocol` builds, which answers
    HTTP requests with :attr:`admission`'s decisions, :attr:`worker_headers` on each
    (``X-Chatlab-Worker: <pid>`` with ``EXPOSE_INTERNALS=on``), and keeps its upgraded
    connections (:class:`~chat_server.transport.peer.ChatPeer`) in :attr:`peers`.
    """

    def __init__(
        self,
        settings: Settings,
        service: ChatService,
        verifier: TokenVerifier,
        codec: Codec,
        listen_socket: socket.socket | None = None,
    ) -> None:
        self.settings = settings
        self.service = service
        self.codec = codec
        self.stats = OutboundStats()
        self.coalescer = WriteCoalescer(codec.binary, settings.ws_deflate == "shared")
        #: the framing a connection that negotiated permessage-deflate takes (WS_DEFLATE)
        self.negotiated_framing = Framing.of(settings.ws_deflate)
        self.admission = Admission(settings, service, verifier, codec, self.stats)
        #: the headers every HTTP response carries: this process' pid with
        #: EXPOSE_INTERNALS=on, none otherwise
        self.worker_headers: tuple[tuple[str, str], ...] = (
            ((WORKER_HEADER, str(os.getpid())),) if settings.expose_internals else ()
        )
        self.max_outbound_bytes = settings.max_outbound_bytes
        #: paced sends (replay) wait while a connection's buffer is above this, well
        #: under the 1013 bound, so a replay never trips it
        self.paced_high_water_bytes = min(PACED_HIGH_WATER_BYTES, settings.max_outbound_bytes // 4)
        #: the upgraded connections
        self.peers: set[ChatPeer] = set()
        #: set when the last of :attr:`peers` is gone
        self.all_gone = asyncio.Event()
        #: the loop it serves on (set by :meth:`start`); connections' timers run on it
        self.loop: asyncio.AbstractEventLoop
        self._listen_socket = listen_socket
        #: the server's TLS context with TLS_CERT_FILE set (wss://, https://), else None
        self.ssl_context: ssl.SSLContext | None = (
            server_context(settings.tls_cert_file, settings.tls_key_file)
            if settings.tls_cert_file
            else None
        )
        self._acceptor: Acceptor | None = None

    @abstractmethod
    def connection_protocol(self, peer: str) -> asyncio.BaseProtocol:
        """The protocol a connection from ``peer`` whose request is a GET goes on to."""

    async def start(self) -> None:
        """Listen and accept; raise OSError if the address cannot be bound."""
        self.loop = asyncio.get_running_loop()
        sock = self._listen_socket
        if sock is None:
            sock = listening_socket(self.settings.host, self.settings.port)
        self._acceptor = Acceptor(sock, self._gate, self.ssl_context)
        self._acceptor.start()

    def _gate(self, peer: str) -> MethodGate:
        return MethodGate(self.connection_protocol, self._refuse_method, peer)

    def _refuse_method(self, method: str, target: str) -> bytes:
        """The HTTP answer (405, as Admission decides it) to a request that is not a GET."""
        reply = self.admission.decide(target, None, (), method)
        assert isinstance(reply, Reply)
        return reply.encode(self.worker_headers)

    @property
    def port(self) -> int:
        """The port actually bound."""
        assert self._acceptor is not None
        return int(self._acceptor.sock.getsockname()[1])

    def announce_stop(self) -> None:
        """From now on ``/healthz`` answers 503 "draining" (the listener still accepts), so
        a proxy that checks it stops sending connections here before the listener closes."""
        self.admission.stopping = True

    def stop_accepting(self) -> None:
        """Close the listening socket; open connections stay."""
        if self._acceptor is not None:
            self._acceptor.close()

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
            await asyncio.wait_for(self.all_gone.wait(), self.settings.close_timeout_s + 1)
        except TimeoutError:
            log.warning("%d connections outlived their closing handshake: dropped", len(self.peers))
            for peer in list(self.peers):
                peer.abort()

    def metrics_snapshot(self) -> dict[str, Any]:
        """What the metrics collector reads at scrape time."""
        return self.admission.metrics_snapshot(sum(p.buffered_bytes() for p in self.peers))


class Corked(Protocol):
    """A connection whose frames wait in its own list until :meth:`flush` writes them."""

    def flush(self) -> None:
        """Write every frame waiting, in one write."""


class FrameCache:
    """The wire bytes of server data frames (unmasked, final) in one :class:`Framing`,
    each frame's built once per loop iteration for all the connections a broadcast goes
    to."""

    __slots__ = ("_build", "_wire")

    def __init__(self, build: Callable[[bytes], bytes]) -> None:
        self._build = build
        self._wire: dict[bytes, bytes] = {}

    def framed(self, frame: bytes) -> bytes:
        """``frame`` on the wire, built once per iteration (the coalescer's flush forgets it)."""
        wire = self._wire.get(frame)
        if wire is None:
            wire = self._wire[frame] = self._build(frame)
        return wire

    def alone(self, frame: bytes) -> bytes:
        """``frame`` on the wire, not kept for others (a replay's)."""
        return self._build(frame)

    def forget(self) -> None:
        """Drop the frames built this iteration."""
        self._wire.clear()


class WriteCoalescer:
    """One write per connection per event-loop iteration.

    A connection sent frames during an iteration (a batch's messages for its rooms,
    its own ack, presence, errors) keeps them in a list of its own and is
    :meth:`mark`-ed once; at the end of the iteration :meth:`flush` has every marked
    connection write its list in one ``transport.write`` (one syscall where the
    kernel takes it all), instead of one per frame. The list lives only until then:
    what it holds is written into the connection's transport buffer, whose size
    decides the 1013 close, within the same iteration.

    Its frame caches build each frame's wire bytes once per iteration for every
    connection a broadcast goes to, one per :class:`Framing` a connection may take
    (:meth:`frames`): plain (no extension), and with ``WS_DEFLATE=shared`` deflated
    (permessage-deflate without context takeover: compressed once,
    :mod:`chat_server.transport.deflate`).
    """

    def __init__(self, binary: bool, shared_deflate: bool = False) -> None:
        opcode = Opcode.BINARY if binary else Opcode.TEXT
        self._dirty: list[Corked] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        plain = FrameCache(lambda frame: Frame(opcode, frame).serialize(mask=False))
        #: each framing's cache; PER_CONNECTION_DEFLATE's frames are the extension's
        #: (never built here), its entry only keeps the map total
        self._caches = {Framing.PLAIN: plain, Framing.PER_CONNECTION_DEFLATE: plain}
        if shared_deflate:
            compress = SharedCompressor().compress
            self._caches[Framing.SHARED_DEFLATE] = FrameCache(
                lambda frame: deflated_frame(opcode, compress(frame))
            )
        self._framings = list(dict.fromkeys(self._caches.values()))

    def frames(self, framing: Framing) -> FrameCache:
        """The cache that frames data for a connection in ``framing`` (KeyError: a
        framing this process does not offer)."""
        return self._caches[framing]

    def mark(self, peer: Corked) -> None:
        """``peer`` has frames waiting: have it flush at the end of this iteration."""
        if not self._dirty:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self.flush)
        self._dirty.append(peer)

    def flush(self) -> None:
        """Have every marked connection write what waits (also before closing them all)."""
        dirty, self._dirty = self._dirty, []
        try:
            for peer in dirty:
                peer.flush()
        finally:
            for framing in self._framings:
                framing.forget()


class OutboundStats:
    """The transport's accounting across connections (exposed on /stats for tests and the
    lab): outbound buffers, and the partial messages held against ``MAX_PARTIAL_BYTES``."""

    __slots__ = (
        "frames_out",
        "partial_bytes",
        "partial_closes",
        "peak_outbound_bytes",
        "peak_partial_bytes",
        "slow_consumer_closes",
    )

    def __init__(self) -> None:
        self.frames_out = 0
        self.peak_outbound_bytes = 0
        self.slow_consumer_closes = 0
        #: bytes every connection's partial message holds now (inflaters included)
        self.partial_bytes = 0
        self.peak_partial_bytes = 0
        #: connections closed for a partial message: over time (1008) or over the bound (1013)
        self.partial_closes = 0


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer given instead of a websocket upgrade (one line of text, or JSON)."""

    status: HTTPStatus
    body: str
    content_type: str = "text/plain; charset=utf-8"
    #: further headers (``Allow`` on a 405, ``WWW-Authenticate`` on a 401)
    headers: tuple[tuple[str, str], ...] = ()

    def encode(self, extra: Iterable[tuple[str, str]] = ()) -> bytes:
        """The whole HTTP/1.1 response, ``extra`` headers first, ending the connection."""
        body = self.body.encode()
        headers = [
            *extra,
            ("Content-Type", self.content_type),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            *self.headers,
        ]
        head = "".join(f"{name}: {value}\r\n" for name, value in headers)
        status = f"HTTP/1.1 {self.status.value} {self.status.phrase}\r\n"
        return (status + head + "\r\n").encode("latin-1") + body


@dataclass(frozen=True, slots=True)
class Admitted:
    """An upgrade to accept: the token's user and the subprotocol to answer (None: none)."""

    user: str
    subprotocol: str | None
    #: the client's address: the peer's, or behind a trusted proxy the forwarded one
    client: str = ""


class Admission:
    """Decides each HTTP request on the websocket port, the same way for every transport.

    Every resource here is GET only: another method is 405 with ``Allow: GET``.
    ``/healthz`` answers 200 (with ``WORKERS`` > 1, 503 naming how many workers are
    ready until all are), ``/stats`` the counters as JSON (with
    ``EXPOSE_INTERNALS=on`` only: they name the host and its pids), ``/`` and its files the
    web chat page (:mod:`chat_server.web`); any other path but ``/ws`` is 404. From a stop
    signal on (:attr:`stopping`) ``/healthz`` answers 503 "draining". An
    upgrade on ``/ws`` is refused with 503 while draining, past ``MAX_CONNECTIONS``, or
    when its client address (the peer's, or behind a proxy in ``TRUSTED_PROXIES`` the one
    its ``X-Forwarded-For`` names) holds ``MAX_CONNECTIONS_PER_ADDRESS`` already,
    then with 401 for a missing or bad token (from ``Authorization: Bearer`` or
    ``?token=``), then with 400 when the client offers subprotocols and none is the
    codec's: 401 is decided before 400.
    """

    def __init__(
        self,
        settings: Settings,
        service: ChatService,
        verifier: TokenVerifier,
        codec: Codec,
        outbound: OutboundStats,
    ) -> None:
        self.settings = settings
        self.service = service
        self.verifier = verifier
        self.subprotocol = codec.subprotocol
        self.outbound = outbound
        #: WORKERS > 1: what keeps ``/healthz`` from 200 (workers not ready), else None
        self.unready: Callable[[], str | None] = _ready
        #: the web chat page's files (``GET /`` and what it loads)
        self.site = WebSite(settings.auth_public_url, codec.subprotocol)
        #: set at a stop signal: ``/healthz`` answers 503 from then on
        self.stopping = False
        #: open connections by client address, against MAX_CONNECTIONS_PER_ADDRESS
        self.addresses = ConnectionsPerAddress(settings.max_connections_per_address)
        self._trusted_proxies = settings.trusted_proxies

    def decide(
        self,
        target: str,
        authorization: str | None,
        offered: Iterable[str],
        method: str = "GET",
        *,
        peer: str = "",
        forwarded_for: Iterable[str] = (),
    ) -> Reply | Admitted:
        """Answer a request for ``target`` (path and query) with these headers' values.

        ``offered`` holds the values of every ``Sec-WebSocket-Protocol`` header,
        each possibly a comma-separated list; ``method`` is the request's; ``peer`` is
        the address the connection came from and ``forwarded_for`` the values of every
        ``X-Forwarded-For`` header (believed from ``TRUSTED_PROXIES`` only).
        """
        if method != "GET":
            return Reply(
                HTTPStatus.METHOD_NOT_ALLOWED,
                "method not allowed: only GET is served here\n",
                headers=(("Allow", "GET"),),
            )
        url = urlsplit(target)
        if url.path == "/healthz":
            if self.stopping:
                return Reply(HTTPStatus.SERVICE_UNAVAILABLE, "draining: shutting down\n")
            unready = self.unready()
            if unready is not None:
                return Reply(HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {unready}\n")
            keys = self.verifier.health()  # the JWK set's age; stale keys still serve
            return Reply(HTTPStatus.OK, f"ok; {keys}\n" if keys else "ok\n")
        if url.path == "/stats" and self.settings.expose_internals:
            body = json.dumps(self.stats_snapshot()) + "\n"
            return Reply(HTTPStatus.OK, body, "application/json")
        page = self.site.answer(url.path)
        if page is not None:
            return Reply(HTTPStatus.OK, page.body, page.content_type, page.headers)
        if url.path != WS_PATH:
            return Reply(HTTPStatus.NOT_FOUND, f"not found: the websocket is {WS_PATH}\n")
        if self.service.draining:
            return Reply(HTTPStatus.SERVICE_UNAVAILABLE, "server shutting down\n")
        if self.service.connections >= self.settings.max_connections:
            return Reply(
                HTTPStatus.SERVICE_UNAVAILABLE,
                "too many connections (MAX_CONNECTIONS, or the open-files limit)\n",
            )
        client = client_address(peer, forwarded_for, self._trusted_proxies)
        if self.addresses.full(client):
            return Reply(
                HTTPStatus.SERVICE_UNAVAILABLE,
                "too many connections from your address (MAX_CONNECTIONS_PER_ADDRESS)\n",
            )
        token = _bearer_token(authorization) or _query_token(url.query)
        if token is None:
            return Reply(
                HTTPStatus.UNAUTHORIZED,
                "missing token: send Authorization: Bearer <jwt>, or ?token=<jwt> from a browser\n",
                headers=_BEARER_CHALLENGE,
            )
        try:
            user = self.verifier.verify(token)
        except InvalidToken as exc:
            return Reply(HTTPStatus.UNAUTHORIZED, f"{exc}\n", headers=_INVALID_TOKEN_CHALLENGE)
        protocols = [p.strip() for value in offered for p in value.split(",") if p.strip()]
        if protocols and self.subprotocol not in protocols:
            return Reply(
                HTTPStatus.BAD_REQUEST,
                f"unsupported subprotocol: this server speaks {self.subprotocol}\n",
            )
        return Admitted(user, self.subprotocol if protocols else None, client)

    def stats_snapshot(self) -> dict[str, Any]:
        """The service's counters plus the transport's outbound accounting."""
        return {
            **self.service.stats(),
            "max_outbound_bytes": self.settings.max_outbound_bytes,
            "peak_outbound_bytes": self.outbound.peak_outbound_bytes,
            "slow_consumer_closes": self.outbound.slow_consumer_closes,
            "max_partial_bytes": self.settings.max_partial_bytes,
            "partial_bytes": self.outbound.partial_bytes,
            "peak_partial_bytes": self.outbound.peak_partial_bytes,
            "partial_closes": self.outbound.partial_closes,
            "address_refusals": self.addresses.refusals,
        }

    def metrics_snapshot(self, outbound_bytes: int) -> dict[str, Any]:
        """The metrics collector's view, given the bytes buffered for every connection now."""
        service = self.service
        return {
            "connections": service.connections,
            "rooms": service.room_count,
            "frames_out": self.outbound.frames_out,
            "errors": service.errors_sent(),
            "outbound_bytes": outbound_bytes,
            "slow_consumer_closes": self.outbound.slow_consumer_closes,
            "address_refusals": self.addresses.refusals,
            "store": dataclasses.asdict(service.store_stats()),
        }


class ConnectionsPerAddress:
    """Open connections by client address, bounded by ``MAX_CONNECTIONS_PER_ADDRESS``
    (0: no bound). A connection counts from its upgrade (:meth:`opened`) until it is
    gone (:meth:`closed`); an address with none is forgotten, so it holds at most one
    entry per open connection."""

    __slots__ = ("_open", "bound", "refusals")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._open: dict[str, int] = {}
        #: upgrades refused because their address was full
        self.refusals = 0

    def full(self, client: str) -> bool:
        """Whether ``client`` holds the bound already (counted as a refusal when so)."""
        if self.bound and self._open.get(client, 0) >= self.bound:
            self.refusals += 1
            return True
        return False

    def opened(self, client: str) -> None:
        """A connection from ``client`` was upgraded."""
        self._open[client] = self._open.get(client, 0) + 1

    def closed(self, client: str) -> None:
        """A connection :meth:`opened` from ``client`` is gone."""
        left = self._open[client] - 1
        if left:
            self._open[client] = left
        else:
            del self._open[client]

    def count(self, client: str) -> int:
        """Connections open from ``client``."""
        return self._open.get(client, 0)


#: RFC 6750's challenge on a 401: no token, or a token refused
_BEARER_CHALLENGE = (("WWW-Authenticate", 'Bearer realm="chatlab"'),)
_INVALID_TOKEN_CHALLENGE = (("WWW-Authenticate", 'Bearer realm="chatlab", error="invalid_token"'),)


def _ready() -> None:
    """One process: ready whenever it answers."""
    return


#: SO_LINGER on with a zero timeout: close() resets the connection and frees its buffers
_LINGER_ZERO = struct.pack("ii", 1, 0)


def bound_send_buffer(transport: Any, size_bytes: int) -> None:
    """Bound the kernel's send buffer of a connection (``SOCKET_SEND_BUFFER_BYTES``; 0: leave it).

    Without it Linux grows a loopback send buffer to megabytes for a peer that does
    not read, before the transport's own buffer (``MAX_OUTBOUND_BYTES``) even fills.
    """
    sock = transport.get_extra_info("socket")
    if size_bytes and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size_bytes)


def reset_on_abort(transport: Any) -> None:
    """Make the transport's coming ``abort()`` a TCP reset.

    A plain close of a socket whose peer stopped reading leaves it in FIN-WAIT-1
    holding its unsent bytes (kernel memory RSS does not show) for as long as the
    peer keeps its window shut; a reset frees them at once.
    """
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)


def _bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <jwt>`` header value (None: no bearer token)."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _query_token(query: str) -> str | None:
    """The ``token`` parameter of a URL's query string, if any."""
    values = parse_qs(query).get("token")
    return values[0] if values else None
