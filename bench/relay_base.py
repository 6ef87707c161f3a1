"""What the relays share: the contract's constants, and the floor relays' coalesced writes.

A relayed message is framed once (server frames are unmasked and no extension is
negotiated, so the same bytes go to every member); :meth:`CoalescedWriter.queue`
appends those bytes to each member's pending output, and the first frame a member
gets in an iteration marks it for :class:`IterationFlush`, which has every marked
member write its pending output in one ``transport.write`` once the iteration's
callbacks have run: one ``loop.call_soon`` per iteration for all of them, one
write per member.

Bound: a member's pending output plus what its transport still buffers may not pass
:data:`MAX_OUTBOUND_BYTES`. The frame that would pass it drops what is pending and
closes the member with 1013 (its close frame queued behind what the transport
buffers); nothing more is queued for it, and it is reset if it is still there
:data:`CLOSE_TIMEOUT_S` later. A member that stops reading costs at most that much
memory.

This is the shape of the chat server's ``WriteCoalescer``
(``chat_server/transport/base.py``), without what a relay does not need (per-codec
opcode, framing cache, statistics).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, TypeVar

_Member = TypeVar("_Member")

#: the websocket path, as on the chat server
WS_PATH = "/ws"
#: close codes: no ``?room=`` (policy violation), relay stopping, a member too far behind
CLOSE_POLICY = 1008
CLOSE_GOING_AWAY = 1001
CLOSE_TRY_AGAIN_LATER = 1013
#: largest message accepted (every relay; a fragmented one counts whole)
MAX_MESSAGE_BYTES = 2**20
#: ``--mode`` values: what each does, and the transports it runs on
MODES: dict[str, tuple[str, tuple[str, ...]]] = {
    "recv-broadcast": (
        "`async for message in conn: broadcast(room, message)`, no bound",
        ("websockets",),
    ),
    "per-frame-send": ("one `transport.send` per frame per member", ("picows",)),
    "coalesced": (
        "each message framed once, one write per member per loop iteration: the floor",
        ("websockets", "picows"),
    ),
}
#: each transport's mode without ``--mode`` (its idiomatic API: the relay it always had)
DEFAULT_MODES = {"websockets": "recv-broadcast", "picows": "per-frame-send"}


#: bytes a member may have pending and buffered in its transport; past it, close 1013.
#: The bare relays' bound (16 MiB), far above what a reading client leaves unread.
MAX_OUTBOUND_BYTES = 16 * 2**20
#: seconds a closing connection has to finish its closing handshake before it is
#: reset (websockets' default ``close_timeout``)
CLOSE_TIMEOUT_S = 10.0
#: the first byte of a final, uncompressed data frame: FIN and the opcode


def leave_room(rooms: dict[str, set[_Member]], room: str, member: _Member) -> None:
    """Take ``member`` out of ``room``, and the room out of ``rooms`` once it is empty."""
    members = rooms.get(room)
    if members is not None and member in members:
        members.discard(member)
        if not members:
            del rooms[room]


class Flushable(Protocol):
    """A connection whose pending output :meth:`flush` writes in one write."""

    def flush(self) -> None:
        """Write everything pending in one write."""


class IterationFlush:
    """Calls :meth:`Flushable.flush` of each connection marked during a loop iteration,
    once the iteration's callbacks have run (one ``call_soon`` per iteration)."""

    __slots__ = ("_loop", "_marked")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._marked: list[Flushable] = []

    def mark(self, connection: Flushable) -> None:
        """``connection`` has output pending: flush it at the end of this iteration."""
        if not self._marked:
            self._loop.call_soon(self.flush_all)
        self._marked.append(connection)

    def flush_all(self) -> None:
        """Flush every marked connection (a connection marked twice flushes nothing more)."""
        marked, self._marked = self._marked, []
        for connection in marked:
            connection.flush()


class CoalescedWriter:
    """The write side of a floor relay's connection: frames pending for one write per
    iteration, bounded by :data:`MAX_OUTBOUND_BYTES` (see the module's docstring).

    A subclass calls :meth:`_init_writes` when it is made, sets ``_tcp`` once
    connected, and says how a member too far behind is closed (:meth:`_close_behind`).
    """

    __slots__ = ()
    _flusher: IterationFlush
    _tcp: asyncio.Transport | None
    _pending: list[bytes]
    _pending_bytes: int
    #: bytes that may still be pending before the bound (the transport's buffer at the
    #: last flush taken off; it only drains until the next one)
    _room_bytes: int
    #: closed with 1013: nothing more is queued
    _behind: bool

    def _init_writes(self, flusher: IterationFlush) -> None:
        """Nothing pending, nothing buffered, not connected yet."""
        self._flusher = flusher
        self._tcp = None
        self._pending = []
        self._pending_bytes = 0
        self._room_bytes = MAX_OUTBOUND_BYTES
        self._behind = False

    def queue(self, wire: bytes) -> None:
        """Append one framed message to this iteration's write, or close 1013 past the bound."""
        pending = self._pending
        if not pending:
            self._flusher.mark(self)
        pending.append(wire)
        self._pending_bytes += len(wire)
        if self._pending_bytes > self._room_bytes:
            self._too_far_behind()

    def flush(self) -> None:
        """Write what is pending in one ``transport.write`` (nothing once the transport closes)."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._pending_bytes = 0
        tcp = self._tcp
        if tcp is None or tcp.is_closing():
            return
        tcp.write(pending[0] if len(pending) == 1 else b"".join(pending))
        self._room_bytes = MAX_OUTBOUND_BYTES - tcp.get_write_buffer_size()

    def _too_far_behind(self) -> None:
        """Drop what is pending; the first time, close with 1013 (see :meth:`_close_behind`)."""
        self._pending.clear()
        self._pending_bytes = 0
        if self._behind:
            return
        self._behind = True
        self._room_bytes = -1  # whatever is still queued this iteration is dropped
        self._close_behind()

    def _close_behind(self) -> None:
        """Leave the room (not during this call: a broadcast may be iterating it), send
        close 1013, and reset the connection if it is still there after ``CLOSE_TIMEOUT_S``."""
        raise NotImplementedError
