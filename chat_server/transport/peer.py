"""One connection's chatlab side, the same on both transports: what the contract asks of a
connection that neither websocket library does for us.

- **Writes.** :meth:`ChatPeer.send` only queues a frame; the transport's
  :class:`~chat_server.transport.base.WriteCoalescer` has :meth:`ChatPeer.flush`
  write the queue in one write at the end of the loop iteration.
- **Slow consumers.** After every flush the connection's asyncio write buffer is
  measured (its peak goes to ``/stats``); past ``MAX_OUTBOUND_BYTES`` the connection
  gets close 1013 "slow consumer". Frames queued count toward the bound with what
  the buffer holds, so the close comes after the same frame as without coalescing.
  Pongs count too (:meth:`ChatPeer._ponged`, after each read that held pings): a client
  that pings and never reads meets the same 1013, and one still pinging past the bound
  once its close frame is written is dropped at once. Only the close frame is exempt.
- **Replays** (:meth:`ChatPeer.send_paced`) wait while the write buffer is above its
  high-water mark, so a replay is paced by the client's reading and never trips 1013.
- **Closing.** :meth:`ChatPeer.close` sends the close frame after what was queued;
  a connection whose closing handshake is not done ``CLOSE_TIMEOUT_S`` later is
  dropped with a TCP reset (:func:`~chat_server.transport.base.reset_on_abort`).
- **Keepalive.** A ping every ``PING_INTERVAL_S``; no pong within ``PING_TIMEOUT_S``
  closes with 1011.
- **Reading.** A message sent in several frames is reassembled (bounded by
  ``MAX_FRAME_BYTES``: 1009); a text message that is not UTF-8 closes with 1007; a
  frame handler that raises is logged and closes with 1011. Frames that arrive once
  the connection is closing are dropped.
- **Partial messages.** A message sent in several frames must be whole within
  ``PARTIAL_MESSAGE_TIMEOUT_S`` of its first frame (else close 1008), and what every
  connection's partial message holds (its bytes, plus :data:`INFLATER_BYTES` while a
  compressed one keeps its inflater) counts toward the process' ``MAX_PARTIAL_BYTES``:
  the frame that would pass it closes its connection with 1013.

A transport's connection class derives from :class:`ChatPeer`, says how frames,
close frames and pings reach the wire (:meth:`ChatPeer._send_close_frame`,
:meth:`ChatPeer._send_ping`, and :meth:`ChatPeer._write_frames` for data frames when an
extension with context takeover is negotiated) and reports what
its library tells it (:meth:`ChatPeer._opened`, :meth:`ChatPeer._deliver`,
:meth:`ChatPeer._fragment`, :meth:`ChatPeer._pong`, :meth:`ChatPeer._gone`), and
calls :meth:`ChatPeer._ponged` once it has answered pings.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from chat_server.transport.base import (
    CLOSE_INTERNAL_ERROR,
    CLOSE_INVALID_TEXT,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_POLICY_VIOLATION,
    CLOSE_PROTOCOL_ERROR,
    CLOSE_TRY_AGAIN_LATER,
    bound_send_buffer,
    reset_on_abort,
)
from chat_server.transport.deflate import Framing

if TYPE_CHECKING:
    from chat_server.core.chat import Session
    from chat_server.transport.base import FrameCache, ServerTransport

PLAIN = Framing.PLAIN
PER_CONNECTION_DEFLATE = Framing.PER_CONNECTION_DEFLATE

log = logging.getLogger("chat_server.transport")

#: what a zlib inflater with a 2^15 window holds once it has inflated (its state and its
#: window: 40,143 bytes measured with tracemalloc, CPython 3.11, zlib 1.2), charged to
#: ``MAX_PARTIAL_BYTES`` while a compressed message in several frames keeps one
INFLATER_BYTES = 40 * 1024

#: every field a connection holds for :class:`ChatPeer` (a subclass with ``__slots__``
#: lists them: slots keep an idle connection small)
PEER_SLOTS = (
    "_drained",
    "_drop",
    "_fragments",
    "_fragments_text",
    "_frames",
    "_keepalive",
    "_out",
    "_out_bytes",
    "_partial_bytes",
    "_partial_timer",
    "_pong_due",
    "_spare_bytes",
    "client",
    "closing",
    "framing",
    "owner",
    "paused",
    "session",
    "tcp",
)


class ChatPeer:
    """chatlab's side of one websocket connection (see the module): its writes and their
    bound, replay pacing, closing, keepalive and message reassembly."""

    __slots__ = ()

    owner: ServerTransport
    #: the service's session, from the upgrade until the connection is gone
    session: Session | None
    #: the TCP transport under the websocket (its write buffer is the one accounted)
    tcp: asyncio.Transport | None
    #: the client's address (its connection counts against MAX_CONNECTIONS_PER_ADDRESS
    #: from the upgrade until it is gone); empty before the upgrade
    client: str
    #: a close frame was sent or received, or the connection is gone: nothing more is
    #: written or delivered
    closing: bool
    #: the write buffer is over its high-water mark
    paused: bool
    #: how this connection's data frames go on the wire, chosen at the handshake
    #: (:meth:`_take_framing`; PLAIN until then)
    framing: Framing
    #: the coalescer's cache for ``framing`` (each frame built once per broadcast); not
    #: used with PER_CONNECTION_DEFLATE, whose extension frames them (:meth:`_write_frames`)
    _frames: FrameCache
    _out: list[bytes] | None
    _out_bytes: int
    #: bytes the write buffer may still take before the bound, when the queue started
    _spare_bytes: int
    _drained: list[asyncio.Future[None]] | None
    _fragments: bytearray | None
    _fragments_text: bool
    #: what this connection's partial message is charged to ``MAX_PARTIAL_BYTES``
    _partial_bytes: int
    #: closes the connection (1008) when its partial message is not whole in time
    _partial_timer: asyncio.TimerHandle | None
    _keepalive: asyncio.TimerHandle | None
    _pong_due: bool
    _drop: asyncio.TimerHandle | None

    def __init__(self, owner: ServerTransport) -> None:
        self.owner = owner
        self.session = None
        self.tcp = None
        self.client = ""
        self.closing = False
        self.paused = False
        self.framing = PLAIN
        self._frames = owner.coalescer.frames(PLAIN)
        self._out = None
        self._out_bytes = 0
        self._spare_bytes = owner.max_outbound_bytes
        self._drained = None
        self._fragments = None
        self._fragments_text = False
        self._partial_bytes = 0
        self._partial_timer = None
        self._keepalive = None
        self._pong_due = False
        self._drop = None

    # ---- what a transport provides ------------------------------------------------------

    def _take_framing(self, framing: Framing) -> None:
        """The handshake chose ``framing`` for this connection's data frames."""
        self.framing = framing
        self._frames = self.owner.coalescer.frames(framing)

    def _write_frames(self, frames: list[bytes]) -> None:
        """Write data frames through the connection's own extension (only called with
        ``PER_CONNECTION_DEFLATE``)."""
        raise NotImplementedError

    def _send_close_frame(self, code: int, reason: str) -> None:
        """Write a close frame with ``code`` and ``reason``."""
        raise NotImplementedError

    def _send_ping(self) -> None:
        """Write a ping frame."""
        raise NotImplementedError

    def _inflater_held(self) -> bool:
        """Whether an inflater is kept for the message being read (only asked while a
        message sent in several frames is open; extensions with context takeover keep
        theirs for the connection's lifetime and answer False)."""
        return False

    # ---- the service's side ---------------------------------------------------------------

    def send(self, frame: bytes) -> None:
        """Queue one frame for this iteration's write (see the module)."""
        out = self._out
        if out is not None:
            out.append(frame)
            self._out_bytes += len(frame)
        else:
            spare = self._spare_now()
            if spare is None:
                return
            self._out = [frame]
            self._out_bytes = len(frame)
            self._spare_bytes = spare
            self.owner.coalescer.mark(self)
        if self._out_bytes > self._spare_bytes:
            self.flush()

    def flush(self) -> None:
        """Write the frames queued in one write; close 1013 when the buffer passes the bound."""
        frames, self._out = self._out, None
        tcp = self.tcp
        if not frames or self.closing or tcp is None or tcp.is_closing():
            return
        if self.framing is not PER_CONNECTION_DEFLATE:  # built once per broadcast
            framed = self._frames.framed
            tcp.write(b"".join([framed(frame) for frame in frames]))
        else:
            self._write_frames(frames)
        stats = self.owner.stats
        stats.frames_out += len(frames)
        buffered = tcp.get_write_buffer_size()
        stats.peak_outbound_bytes = max(stats.peak_outbound_bytes, buffered)
        if buffered > self.owner.max_outbound_bytes:
            stats.slow_consumer_closes += 1
            self.close(CLOSE_TRY_AGAIN_LATER, "slow consumer")

    async def send_paced(self, frame: bytes) -> None:
        """Write one frame and wait until the client has read enough (replay pacing)."""
        if self._out:
            self.flush()  # what was sent before goes first
        if self._spare_now() is None:
            raise ConnectionError("connection is closing")
        if self.framing is not PER_CONNECTION_DEFLATE:
            assert self.tcp is not None
            self.tcp.write(self._frames.alone(frame))
        else:
            self._write_frames([frame])
        self.owner.stats.frames_out += 1
        if self.paused:
            drained = self.owner.loop.create_future()
            if self._drained is None:
                self._drained = []
            self._drained.append(drained)
            await drained

    def close(self, code: int, reason: str) -> None:
        """Start the closing handshake now; drop the connection if it is not done in time.

        Frames queued before the close go out before it.
        """
        if self.closing or self.tcp is None:
            return
        if self._out:
            self.flush()
            if self.closing:  # the flush closed it (1013)
                return
        self.closing = True
        self._send_close_frame(code, reason)
        self._drop_later()

    def abort(self) -> None:
        """Drop the connection now, without (or without finishing) a closing handshake."""
        self._drop = None
        if self.tcp is not None:
            reset_on_abort(self.tcp)
            self.tcp.abort()

    def buffered_bytes(self) -> int:
        """Bytes the connection's write buffer holds now."""
        return 0 if self.tcp is None else self.tcp.get_write_buffer_size()

    # ---- what the transport reports -----------------------------------------------------

    def _opened(self, user: str, client: str) -> None:
        """The upgrade is done (``tcp`` is set): the connection joins the service and
        counts against ``client``'s address."""
        owner = self.owner
        tcp = self.tcp
        assert tcp is not None
        tcp.set_write_buffer_limits(high=owner.paced_high_water_bytes)
        bound_send_buffer(tcp, owner.settings.socket_send_buffer_bytes)
        owner.peers.add(self)
        self.session = owner.service.open(user, self.send, self.send_paced, self.close)
        # counted with the session: _gone releases both
        self.client = client
        owner.admission.addresses.opened(client)
        log.debug("connection from %s opened for %s", client, user)
        if owner.settings.ping_interval_s:
            self._keepalive = owner.loop.call_later(owner.settings.ping_interval_s, self._ping)

    def _deliver(self, message: str | bytes) -> None:
        """One whole message (text as str, binary as bytes) to the service."""
        if self.closing:
            return
        try:
            self.owner.service.on_frame(self.session, message)  # type: ignore[arg-type]
        except Exception:
            log.error("message handler failed", exc_info=True)
            self._fail(CLOSE_INTERNAL_ERROR, "internal error")

    def _deliver_text(self, data: bytes | bytearray) -> None:
        """A whole text message's bytes: delivered as str, or 1007 when not UTF-8."""
        try:
            message = data.decode()
        except UnicodeDecodeError as exc:
            self._invalid_text(exc)
            return
        self._deliver(message)

    def _invalid_text(self, exc: UnicodeDecodeError) -> None:
        """A text message that is not UTF-8: close 1007."""
        self._fail(CLOSE_INVALID_TEXT, f"invalid UTF-8: {exc.reason} at position {exc.start}")

    def _fragment(self, text: bool | None, data: bytes | memoryview, fin: bool) -> None:
        """A frame of a message sent in several: ``text`` True or False starts the message
        (a text or binary frame), None continues it."""
        if self.closing:
            return  # the rest of a message refused (1009, 1007) or sent after a close
        fragments = self._fragments
        if text is None:
            if fragments is None:
                self._fail(CLOSE_PROTOCOL_ERROR, "continuation frame without a message")
                return
        elif fragments is not None:
            self._fail(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
            return
        else:
            fragments = self._fragments = bytearray()
            self._fragments_text = text
            owner = self.owner
            self._partial_timer = owner.loop.call_later(
                owner.settings.partial_message_timeout_s, self._partial_expired
            )
        if len(fragments) + len(data) > self.owner.settings.max_frame_bytes:
            self._fail(CLOSE_MESSAGE_TOO_BIG, "message over MAX_FRAME_BYTES")
            return
        fragments += data
        if not fin:
            held = len(fragments) + (INFLATER_BYTES if self._inflater_held() else 0)
            self._hold_partial(held)
            return
        self._release_partial()
        self._fragments = None
        if self._fragments_text:
            self._deliver_text(fragments)
        else:
            self._deliver(bytes(fragments))

    def _hold_partial(self, held_bytes: int) -> None:
        """Charge this connection's partial message ``held_bytes`` in all to the process'
        ``MAX_PARTIAL_BYTES``; close 1013 if that would pass it."""
        stats = self.owner.stats
        total = stats.partial_bytes + held_bytes - self._partial_bytes
        if total > self.owner.settings.max_partial_bytes:
            stats.partial_closes += 1
            self._fail(CLOSE_TRY_AGAIN_LATER, "partial messages over MAX_PARTIAL_BYTES")
            return
        stats.partial_bytes = total
        stats.peak_partial_bytes = max(stats.peak_partial_bytes, total)
        self._partial_bytes = held_bytes

    def _release_partial(self) -> None:
        """The partial message is whole or given up: its charge and its timer go."""
        if self._partial_timer is not None:
            self._partial_timer.cancel()
            self._partial_timer = None
        if self._partial_bytes:
            self.owner.stats.partial_bytes -= self._partial_bytes
            self._partial_bytes = 0

    def _partial_expired(self) -> None:
        self._partial_timer = None
        self.owner.stats.partial_closes += 1
        self._fail(CLOSE_POLICY_VIOLATION, "message not whole within PARTIAL_MESSAGE_TIMEOUT_S")

    def _control_frame_allowed(self) -> bool:
        """A ping, or a pong nobody asked for, draws a rate-limit token like a data frame,
        so that control frames cost a client what data frames cost (its pings are answered
        within its allowance; a flood of them is closed 1008)."""
        session = self.session
        return session is None or self.owner.service.on_control_frame(session)

    def _pong(self) -> None:
        """A pong: the keepalive's answer (an unsolicited one draws a rate-limit token and
        is otherwise ignored)."""
        if not self._pong_due or self.closing:
            if not self.closing:
                self._control_frame_allowed()
            return
        self._pong_due = False
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._keepalive = self.owner.loop.call_later(
            self.owner.settings.ping_interval_s, self._ping
        )

    def _ponged(self) -> None:
        """Pongs were written (only after a read that held pings): everything the peer has
        not read counts toward ``MAX_OUTBOUND_BYTES``, as after a flush.

        Past the bound an open connection gets 1013 "slow consumer"; one already closing
        (its close frame, which is exempt, is written) that still pings without reading
        is dropped now, instead of piling pongs behind its close frame until
        ``CLOSE_TIMEOUT_S``.
        """
        tcp = self.tcp
        if tcp is None:
            return
        owner = self.owner
        buffered = tcp.get_write_buffer_size()
        stats = owner.stats
        stats.peak_outbound_bytes = max(stats.peak_outbound_bytes, buffered)
        if buffered <= owner.max_outbound_bytes:
            return
        if self.closing:
            self.abort()
            return
        stats.slow_consumer_closes += 1
        self.close(CLOSE_TRY_AGAIN_LATER, "slow consumer")

    def _owes_past_bound(self) -> bool:
        """A read held pings although this connection is closing: drop it now (True) if
        what it has not read is past ``MAX_OUTBOUND_BYTES`` already, before its library
        writes the pongs (websockets answers pings while closing; picows does not)."""
        tcp = self.tcp
        if tcp is None or tcp.get_write_buffer_size() <= self.owner.max_outbound_bytes:
            return False
        self.abort()
        return True

    def pause_writing(self) -> None:
        """The write buffer passed its high-water mark: paced sends wait."""
        self.paused = True

    def resume_writing(self) -> None:
        """The write buffer drained below its low-water mark: paced sends go on."""
        self.paused = False
        self._wake_paced(None)

    def _gone(self) -> None:
        """The connection is closed: it leaves the service, its timers stop."""
        self.closing = True
        self._fragments = None
        self._release_partial()
        for handle in (self._keepalive, self._drop):
            if handle is not None:
                handle.cancel()
        self._keepalive = self._drop = None
        self._wake_paced(ConnectionError("connection closed"))
        owner = self.owner
        if self.session is not None:
            owner.peers.discard(self)
            owner.admission.addresses.closed(self.client)
            log.debug("connection from %s for %s closed", self.client, self.session.user)
            owner.service.disconnect(self.session)
            self.session = None
            if not owner.peers:
                owner.all_gone.set()

    # ---- internals ----------------------------------------------------------------------

    def _spare_now(self) -> int | None:
        """Bytes that may still be queued before the bound (None: not writable now)."""
        tcp = self.tcp
        if self.closing or tcp is None or tcp.is_closing():
            # a peer that reset is still open to the library until its EOF is read, but its
            # transport is closing: writing there makes asyncio log a warning per write
            return None
        return self.owner.max_outbound_bytes - tcp.get_write_buffer_size()

    def _fail(self, code: int, reason: str) -> None:
        """Close with ``code`` for something the client did; its later frames are dropped.

        The socket is not shut at once: a close with the client's unread frames still in
        the receive buffer would go out as a TCP reset, and the client could lose the
        close frame (and its code). The closing handshake, or the drop after
        ``CLOSE_TIMEOUT_S``, ends the connection, as for every other close.
        """
        self._fragments = None
        self._release_partial()
        self.close(code, reason)

    def _drop_later(self) -> None:
        """Drop the connection if it is still there after ``CLOSE_TIMEOUT_S``."""
        if self._drop is None:
            self._drop = self.owner.loop.call_later(self.owner.settings.close_timeout_s, self.abort)

    def _ping(self) -> None:
        if self.closing or self.tcp is None:
            return
        self._send_ping()
        self._pong_due = True
        timeout_s = self.owner.settings.ping_timeout_s
        if timeout_s:
            self._keepalive = self.owner.loop.call_later(timeout_s, self._no_pong)
        else:
            self._keepalive = self.owner.loop.call_later(
                self.owner.settings.ping_interval_s, self._ping
            )

    def _no_pong(self) -> None:
        self._keepalive = None
        self._fail(CLOSE_INTERNAL_ERROR, "keepalive ping timeout")

    def _wake_paced(self, error: Exception | None) -> None:
        drained, self._drained = self._drained, None
        for waiter in drained or ():
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)
