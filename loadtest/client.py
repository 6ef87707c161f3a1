"""The load test's client side, without Locust: names, failures, websocket sessions, counts.

The auth service's client is :mod:`loadtest.auth`.

Nothing here imports Locust (whose import monkey-patches the standard library for
gevent), so ``python -m loadtest.seed`` and the tests can import it. Under Locust the
same blocking sockets are cooperative: each :class:`Session` reads its connection in
its own greenlet while the user's greenlet sends.

The websocket protocol is websockets' sans-I/O ``ClientProtocol`` (the library the
chat server is built on) over a plain socket: one ``recv`` takes every frame the
kernel holds, and the per-frame path is parse, decode once, one statistics event.

Statistics are reported through ``report``: a callable with the keyword arguments
of Locust's ``events.request.fire`` (``request_type``, ``name``, ``response_time``
in ms or None, ``response_length``, ``exception``, ``context``).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from threading import Lock
from typing import Any

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidState, InvalidStatus
from websockets.extensions.permessage_deflate import enable_client_permessage_deflate
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import SEND_EOF, State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from chat_server.codecs.base import Codec
from chat_server.errors import CodecError
from chat_server.messages import Ack, Error, Join, Joined, Message, Send
from chatlab.tls import shared_client_context

Report = Callable[..., None]

#: request_type of websocket entries and of HTTP (auth) entries
WS = "WS"
HTTP = "HTTP"
#: the statistics entries: names exactly as users see them in Locust
FANOUT, ACK, CONNECT, LOGIN, REGISTER = "fanout", "ack", "connect", "login", "register"
REFRESH = "refresh"

#: auth answers that say "later": retried after their Retry-After, counted apart
RETRIED_STATUSES = (429, 503)

_CONTEXT: dict[str, Any] = {}
_RECV_BYTES = 65536


# ---- names ----------------------------------------------------------------------


def username(prefix: str, index: int) -> str:
    """The load-test user with this global index, e.g. ``load17``."""
    return f"{prefix}{index}"


def password_for(name: str) -> str:
    """The password of a load-test user: derived from the name (throwaway accounts only)."""
    return f"chatlab-load-{name}"


def global_index(slot: int, processes: int, process_index: int) -> int:
    """The user index of a process's ``slot``: unique across processes, dense from 0."""
    return slot * processes + process_index


def room_name(prefix: str, process_index: int, slot: int, room_size: int) -> str:
    """The room of a process's ``slot``: rooms never span Locust processes."""
    return f"{prefix}-{process_index}-{slot // room_size}"


# ---- failures ---------------------------------------------------------------------


class LoadTestFailure(Exception):
    """A failure reported into the statistics; its text groups failures in Locust's table.

    What the server answered is data on the exception (``status``, ``code``), so callers
    decide by it, never by parsing the text.
    """


class AuthError(LoadTestFailure):
    """An auth call that did not give what was asked; ``status`` None: no HTTP answer."""

    def __init__(self, status: int | None, code: str, detail: str = "") -> None:
        super().__init__(f"HTTP {status} {code}" if status is not None else code)
        self.status = status
        self.code = code
        self.detail = detail


class HandshakeFailed(LoadTestFailure):
    """The websocket handshake was refused: ``status`` is the HTTP status (None: no HTTP
    answer), the text the status and the server's one-line reason."""

    def __init__(self, text: str, status: int | None = None) -> None:
        super().__init__(text)
        self.status = status


class ServerClosed(LoadTestFailure):
    """The server closed a connection the user had not asked to close."""


class ServerError(LoadTestFailure):
    """An ``error`` frame; the text is its code, so that failures group by code."""


class MissingDelivery(LoadTestFailure):
    """A message the room's member should have received and did not."""


class MissingAck(LoadTestFailure):
    """A send never acknowledged, though the run went quiet long enough for it."""


class BadFrame(LoadTestFailure):
    """A frame the codec could not decode, or a duplicate delivery."""


# ---- one websocket connection ------------------------------------------------------


class WsConnection:
    """A client websocket: websockets' sans-I/O protocol over one TCP socket.

    Construction connects and completes the handshake or raises
    :class:`HandshakeFailed` (refused) or ``OSError`` (no connection). Frames that
    arrived with the handshake reply are in ``early``. ``send`` may be called from
    one greenlet while another blocks in ``receive``: writes are serialised by a lock.
    ``deflate=True`` offers permessage-deflate as browsers do (websockets' client
    settings); the server compresses only when its ``WS_DEFLATE`` is on or shared.
    A ``wss://`` URL is spoken over TLS inside ``timeout_s`` too, the server's certificate
    and name verified with ``ssl_context`` (None: the system's CAs); a certificate that
    does not verify is an ``ssl.SSLError`` (an ``OSError``).
    """

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        subprotocol: str | None = None,
        timeout_s: float = 10.0,
        max_size: int = 2**20,
        deflate: bool = False,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        uri = parse_uri(url)
        self.protocol = ClientProtocol(
            uri,
            subprotocols=[Subprotocol(subprotocol)] if subprotocol else None,
            extensions=enable_client_permessage_deflate(None) if deflate else None,
            max_size=max_size,
        )
        sock = socket.create_connection((uri.host, uri.port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if uri.secure:
            context = ssl_context or shared_client_context()
            try:
                sock = context.wrap_socket(sock, server_hostname=uri.host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self._write_lock = Lock()
        self.closing = False
        self.ended = False
        self.early: list[Frame] = []
        try:
            self._handshake(headers or {})
        except BaseException:
            self.sock.close()
            raise
        self.sock.settimeout(None)

    def _handshake(self, headers: dict[str, str]) -> None:
        request = self.protocol.connect()
        for name, value in headers.items():
            request.headers[name] = value
        self.protocol.send_request(request)
        self._flush()
        while True:
            data = self.sock.recv(_RECV_BYTES)
            if not data:
                raise HandshakeFailed("connection closed during the handshake")
            self.protocol.receive_data(data)
            events = self.protocol.events_received()
            if events:
                break
        response = events[0]
        exc = self.protocol.handshake_exc
        if exc is not None:
            if isinstance(exc, InvalidStatus):
                status = exc.response.status_code
                reason = (
                    exc.response.body.decode(errors="replace").strip()[:120]
                    if exc.response.body
                    else ""
                )
                raise HandshakeFailed(f"HTTP {status} {reason}".strip(), status)
            raise HandshakeFailed(f"bad handshake: {exc}")
        assert isinstance(response, Response)
        self.early = [e for e in events[1:] if isinstance(e, Frame)]

    @property
    def subprotocol(self) -> str | None:
        """The subprotocol the server chose."""
        return self.protocol.subprotocol

    def send(self, payload: bytes, text: bool) -> None:
        """Send one message frame (``text``: a text frame of UTF-8 ``payload``).

        Raises ``ConnectionError`` (an ``OSError``) once the connection is closing.
        """
        try:
            if text:
                self.protocol.send_text(payload)
            else:
                self.protocol.send_binary(payload)
        except InvalidState:
            raise ConnectionError("the websocket is closing") from None
        self._flush()

    def receive(self) -> list[Frame]:
        """Block for the next bytes; return the frames they complete (maybe none).

        Pings are answered and a server's close is echoed here. After the TCP
        connection ends, ``ended`` is True and this returns what was left.
        """
        data = self.sock.recv(_RECV_BYTES)
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()
            self.ended = True
        events = self.protocol.events_received()
        if self.protocol.writes:  # a pong or a close echo: rare, so skip the lock otherwise
            self._flush()
        return events  # type: ignore[return-value]

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame (if still open) and close the socket; never raises OSError."""
        self.closing = True
        try:
            if self.protocol.state is State.OPEN:
                self.protocol.send_close(code, reason)
                self._flush()
        except OSError:
            pass
        finally:
            self.sock.close()
            self.ended = True

    def _flush(self) -> None:
        with self._write_lock:
            for chunk in self.protocol.data_to_send():
                if chunk is SEND_EOF or not chunk:
                    self.sock.shutdown(socket.SHUT_WR)
                else:
                    self.sock.sendall(chunk)


# ---- per-process accounting ----------------------------------------------------------


@dataclass
class Ledger:
    """One Locust process's delivery and pacing counts; all of its rooms' members are its own.

    ``missing`` counts messages that a connection joined to the room never received:
    gaps in ``seq`` as they happen, and at the end of a quiet tail the messages after
    the last one it saw. ``late_sends`` counts sends later than their schedule by more
    than ``late_threshold_s``.
    """

    late_threshold_s: float = 0.1
    sent: int = 0
    acked: int = 0
    delivered: int = 0
    missing: int = 0
    unacked: int = 0
    duplicates: int = 0
    server_errors: int = 0
    unexpected_closes: int = 0
    connects: int = 0
    #: sends sent again with their ref (after ``unavailable`` or a lost connection)
    retried: int = 0
    #: of those, acked (each send is stored once however often it is retried)
    acked_after_retry: int = 0
    #: auth calls answered 429 or 503 and tried again after Retry-After (not failures)
    auth_retried: int = 0
    late_sends: int = 0
    max_lateness_s: float = 0.0
    room_top_seq: dict[str, int] = field(default_factory=dict)

    def note_send_lateness(self, lateness_s: float) -> None:
        """Count one send ``lateness_s`` after its scheduled time."""
        if lateness_s > self.late_threshold_s:
            self.late_sends += 1
        self.max_lateness_s = max(self.max_lateness_s, lateness_s)

    def counts(self) -> dict[str, Any]:
        """The counters as a plain dict (for reports and the master)."""
        return {
            "sent": self.sent,
            "acked": self.acked,
            "delivered": self.delivered,
            "missing": self.missing,
            "unacked": self.unacked,
            "duplicates": self.duplicates,
            "server_errors": self.server_errors,
            "unexpected_closes": self.unexpected_closes,
            "connects": self.connects,
            "retried": self.retried,
            "acked_after_retry": self.acked_after_retry,
            "auth_retried": self.auth_retried,
            "late_sends": self.late_sends,
            "max_lateness_ms": round(self.max_lateness_s * 1000, 1),
        }


# ---- sessions ----------------------------------------------------------------------


class Session:
    """One user's connection to the chat server: connect, join, send, and receive every frame.

    The receiver (:meth:`receive_forever`) reports ``fanout`` for every chat message
    (now minus the send time the body carries), ``ack`` for every ack (now minus the
    send time kept for its ``ref``), and failures: error frames (``ack``, or ``connect``
    before the join), seq gaps and duplicates (``fanout``), unexpected closes
    (``connect``). The body is ``"{send time_ns}|{user}|{n}"``, the ``ref``
    ``"{ref_prefix}{n}"``.

    Retries: a send answered ``unavailable`` is sent again with the same ``ref`` and
    body (:meth:`resend_due`), as is every send left unacked by a connection that
    ended (:meth:`unacked_sends`, carried to the next session by
    :meth:`carry_over`): the server stores each once, so the ledger counts
    ``retried`` and ``acked_after_retry`` and never a duplicate.
    """

    def __init__(
        self,
        codec: Codec,
        ledger: Ledger,
        report: Report,
        user: str,
        room: str,
        *,
        ref_prefix: str = "",
    ) -> None:
        self.ref_prefix = ref_prefix
        #: each unacked send's body, by ref (what a retry sends again)
        self.bodies: dict[str, str] = {}
        #: refs to send again (answered ``unavailable``, or carried over)
        self.retry_due: list[str] = []
        self.retried: set[str] = set()
        self.codec = codec
        self.ledger = ledger
        self.report = report
        self.user = user
        self.room = room
        self.conn: WsConnection | None = None
        self.join_seq: int | None = None
        self.last_seq = 0
        self.pending_acks: dict[str, int] = {}
        self.unmatched_send_errors = 0
        self.sent = 0
        self.on_joined: Callable[[], None] = _nothing
        self._decode = codec.decode_server
        self._text = not codec.binary

    def connect(
        self,
        url: str,
        token: str,
        timeout_s: float = 10.0,
        deflate: bool = False,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """Open the connection (reporting ``connect``: TCP connect to the handshake's end,
        the TLS handshake included for ``wss://``, verified with ``ssl_context``)."""
        self._open(
            url,
            headers={"Authorization": f"Bearer {token}"},
            subprotocol=self.codec.subprotocol,
            timeout_s=timeout_s,
            deflate=deflate,
            ssl_context=ssl_context,
        )

    def _open(self, url: str, **kwargs: Any) -> None:
        """Open ``self.conn`` and report ``connect``; a refusal is reported and raised."""
        start = time.perf_counter()
        error: LoadTestFailure | None = None
        try:
            self.conn = WsConnection(url, **kwargs)
        except LoadTestFailure as exc:
            error = exc
        except OSError as exc:
            error = HandshakeFailed(type(exc).__name__)
        else:
            self.ledger.connects += 1
        self.report(
            request_type=WS,
            name=CONNECT,
            response_time=(time.perf_counter() - start) * 1000,
            response_length=0,
            exception=error,
            context=_CONTEXT,
        )
        if error is not None:
            raise error

    def join(self) -> None:
        """Ask to join the room (``joined`` arrives on the receiver and calls ``on_joined``)."""
        assert self.conn is not None
        self.conn.send(self.codec.encode_client(Join(room=self.room)), self._text)

    def send_chat(self) -> None:
        """Send one chat message whose body carries the send time; remember it for its ack."""
        assert self.conn is not None
        n = self.sent
        self.sent = n + 1
        ref = f"{self.ref_prefix}{n}"
        now_ns = time.time_ns()
        body = f"{now_ns}|{self.user}|{n}"
        frame = self.codec.encode_client(Send(room=self.room, body=body, ref=ref))
        self.pending_acks[ref] = now_ns  # before sending: the ack may come back at once
        self.bodies[ref] = body
        try:
            self.conn.send(frame, self._text)
        except OSError:
            del self.pending_acks[ref]
            del self.bodies[ref]
            raise
        self.ledger.sent += 1

    def resend_due(self) -> None:
        """Send again, with the same ref and body, every send due for a retry."""
        assert self.conn is not None
        due, self.retry_due = self.retry_due, []
        for ref in due:
            body = self.bodies.get(ref)
            if body is None:
                continue  # acked meanwhile
            if ref not in self.pending_acks:
                self.pending_acks[ref] = int(body[: body.index("|")])
            frame = self.codec.encode_client(Send(room=self.room, body=body, ref=ref))
            # counted before it goes: its ack is read on the receiving thread, which may
            # see it before this one returns from send (and would not count it a retry's)
            self.retried.add(ref)
            self.ledger.retried += 1
            self.conn.send(frame, self._text)

    def unacked_sends(self) -> dict[str, str]:
        """The bodies of the sends this session never saw acked, by ref."""
        return dict(self.bodies)

    def carry_over(self, unacked: dict[str, str]) -> None:
        """Take a previous session's unacked sends: retried once this one has joined."""
        self.bodies.update(unacked)
        self.retry_due.extend(unacked)

    def receive_forever(self) -> None:
        """Read and account for every frame until the connection ends.

        The time of arrival is taken right after each ``recv``, for every frame it
        completed. An end the user did not ask for (a close frame from the server, EOF,
        a reset) is reported once as a ``connect`` failure naming the close code and
        reason.
        """
        conn = self.conn
        assert conn is not None
        frames = conn.early
        try:
            while True:
                self._account(frames, time.time_ns())
                if conn.ended:
                    break
                frames = conn.receive()
        except OSError as exc:
            if not conn.closing:
                self._closed(type(exc).__name__)
            return
        if not conn.closing:
            code = conn.protocol.close_code
            reason = conn.protocol.close_reason or ""
            self._closed(f"{code} {reason}".strip() if code is not None else "no close frame")

    def _account(self, frames: list[Frame], now_ns: int) -> None:
        """Decode each data frame once; time deliveries and acks; check ``seq`` order."""
        ledger = self.ledger
        decode = self._decode
        pending = self.pending_acks
        room_top = ledger.room_top_seq
        room = self.room
        for frame in frames:
            opcode = frame.opcode
            if opcode is not Opcode.TEXT and opcode is not Opcode.BINARY:
                continue
            data = frame.data
            try:
                message = decode(data.decode() if opcode is Opcode.TEXT else data)
            except (CodecError, UnicodeDecodeError):
                self._fail(FANOUT, BadFrame("undecodable frame"))
                continue
            kind = message.__class__
            if kind is Message:
                seq = message.seq  # type: ignore[union-attr]
                last = self.last_seq
                if seq == last + 1 or self.join_seq is None:
                    pass
                elif seq > last + 1:
                    self._missing(seq - last - 1, "seq gap: never delivered")
                elif seq <= self.join_seq:
                    continue  # committed before the join: not this member's message
                else:
                    ledger.duplicates += 1
                    self._fail(FANOUT, BadFrame("duplicate or out-of-order delivery"))
                    continue
                self.last_seq = seq
                ledger.delivered += 1
                if seq > room_top.get(room, 0):
                    room_top[room] = seq
                body = message.body  # type: ignore[union-attr]
                try:
                    sent_ns = int(body[: body.index("|")])
                except ValueError:
                    continue  # not a load-test body: delivered, no latency to take
                self._timed(FANOUT, now_ns - sent_ns, len(data))
            elif kind is Ack:
                sent_ns = pending.pop(message.ref, 0)  # type: ignore[union-attr,arg-type]
                if not sent_ns:
                    continue
                self.bodies.pop(message.ref, None)  # type: ignore[union-attr,arg-type]
                if self.retried and message.ref in self.retried:  # type: ignore[union-attr]
                    ledger.acked_after_retry += 1
                ledger.acked += 1
                seq = message.seq  # type: ignore[union-attr]
                if seq > room_top.get(room, 0):
                    room_top[room] = seq
                self._timed(ACK, now_ns - sent_ns, len(data))
            elif kind is Error:
                self._error(message)  # type: ignore[arg-type]
            elif kind is Joined:
                self.join_seq = self.last_seq = message.last_seq  # type: ignore[union-attr]
                self.on_joined()

    def _timed(self, name: str, elapsed_ns: int, length: int) -> None:
        self.report(
            request_type=WS,
            name=name,
            response_time=elapsed_ns / 1e6,
            response_length=length,
            exception=None,
            context=_CONTEXT,
        )

    def finish(self, tail_settled: bool) -> None:
        """Account for the end of this session; with ``tail_settled`` also for its tail.

        ``tail_settled`` means the run has been quiet long enough for every message
        in flight to arrive: then messages after the last one this member saw, and
        sends never acked, are reported missing.
        """
        if tail_settled and self.join_seq is not None:
            top = self.ledger.room_top_seq.get(self.room, 0)
            if top > self.last_seq:
                self._missing(top - self.last_seq, "not delivered by the end of the quiet tail")
            count = len(self.pending_acks) - self.unmatched_send_errors
            if count > 0:
                self.ledger.unacked += count
                for _ in range(count):
                    self._fail(ACK, MissingAck("no ack by the end of the quiet tail"))
        self.pending_acks.clear()

    def close(self) -> None:
        """Close the connection normally (1000)."""
        if self.conn is not None:
            self.conn.close()

    def _missing(self, count: int, why: str) -> None:
        self.ledger.missing += count
        error = MissingDelivery(why)
        for _ in range(count):
            self._fail(FANOUT, error)

    def _error(self, message: Error) -> None:
        """An error frame: before ``joined`` it failed the connection, after it a send.

        An error without a ``ref`` (``rate_limited`` is decided before the frame is
        decoded) answers one of the pending sends, which one is unknown: it is counted so
        that the tail check does not report that send a second time.
        """
        self.ledger.server_errors += 1
        if self.join_seq is None:
            self._fail(CONNECT, ServerError(message.code))
            return
        if message.code == "unavailable" and message.ref in self.bodies:
            self.retry_due.append(message.ref)  # type: ignore[arg-type]  # safe: same ref
        elif message.ref is None or self.pending_acks.pop(message.ref, None) is None:
            self.unmatched_send_errors += 1
        else:
            self.bodies.pop(message.ref, None)
        self._fail(ACK, ServerError(message.code))

    def _closed(self, why: str) -> None:
        self.ledger.unexpected_closes += 1
        self._fail(CONNECT, ServerClosed(f"closed by the server: {why}"))

    def _fail(self, name: str, error: Exception) -> None:
        self.report(
            request_type=WS,
            name=name,
            response_time=None,
            response_length=0,
            exception=error,
            context=_CONTEXT,
        )


class RelaySession(Session):
    """A user of ``bench.relay``: no token, no codec, raw ``{time_ns}|{user}|{n}`` frames.

    Only ``connect`` and ``fanout`` are reported; every frame the relay sends back
    (the user's own too) is one delivery.
    """

    def connect(
        self,
        url: str,
        token: str = "",
        timeout_s: float = 10.0,
        deflate: bool = False,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """Open ``url?room=ROOM`` (reporting ``connect``); the relay has no join."""
        sep = "&" if "?" in url else "?"
        self._open(
            f"{url}{sep}room={self.room}",
            timeout_s=timeout_s,
            deflate=deflate,
            ssl_context=ssl_context,
        )
        self.join_seq = 0

    def join(self) -> None:
        """Nothing to ask: the room is in the URL."""
        self.on_joined()

    def send_chat(self) -> None:
        """Send one binary frame carrying the send time."""
        assert self.conn is not None
        n = self.sent
        self.sent = n + 1
        self.conn.send(f"{time.time_ns()}|{self.user}|{n}".encode(), False)
        self.ledger.sent += 1

    def _account(self, frames: list[Frame], now_ns: int) -> None:
        """Time every data frame as one delivery."""
        ledger = self.ledger
        for frame in frames:
            if frame.opcode is not Opcode.BINARY and frame.opcode is not Opcode.TEXT:
                continue
            ledger.delivered += 1
            data = frame.data
            try:
                sent_ns = int(data[: data.index(b"|")])
            except ValueError:
                continue  # not a load-test frame: delivered, no latency to take
            self._timed(FANOUT, now_ns - sent_ns, len(data))

    def finish(self, tail_settled: bool) -> None:
        """The relay has no seq and no acks: nothing to check at the end."""


def _nothing() -> None:
    return None
