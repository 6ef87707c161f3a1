"""Rooms, membership, presence, rate limits and delivery order, with no I/O.

The core owns the state of every connection (a :class:`Session`) and every room
(a :class:`Room`). It writes frames through the ``send`` callable each session
was opened with and closes connections through ``close``; it never awaits, never
touches a socket and never imports asyncio, so tests drive it with plain lists.
Durable storage and the history reads are the caller's (``chat_server.service``):
the core validates a ``send`` into a :class:`~chat_server.messages.Message`,
and delivers a message once the caller reports it committed.

Delivery order: a room's messages are delivered in ``seq`` order because the
store reports commits in order and :meth:`ChatCore.deliver` runs synchronously.
A member joining with ``since`` is *replaying* until the caller has sent it every
stored message up to the room's last committed ``seq``; only then does
:meth:`ChatCore.replay_caught_up` make it live, with no await in between, so the
seam has no gap and no duplicate.

The rooms' seam to the broker is one object, a :class:`RoomSeam`: the core tells it
a room opened here (a room closed is returned to the caller instead, by
:meth:`ChatCore.leave` and :meth:`ChatCore.close_session`), reads a room's
``last_seq`` from it (what this process delivered), and, with several processes
(``BROKER=redis``), reads the room's users other processes hold (``members``, as its
broker last heard it) and tells it of a user's first connection in a room here and
its last one leaving (``presence_changed``, so the broker can write it). Each member sees
the *view* of a room: the users other processes hold plus the users connected
here. A presence event goes to the local members exactly when that view changes,
whether the change comes from a local join or leave or from the broker
(:meth:`ChatCore.remote_presence`). With one process the remote set is empty,
the view is the local users, and presence is what it always was.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol

from chat_server.core.validation import check_room, check_send, check_since, history_limit
from chat_server.errors import UNCOUNTED_CODES, ChatError, ErrorCode, ProtocolError
from chat_server.messages import (
    Ack,
    Error,
    HistoryRequest,
    Join,
    Joined,
    Leave,
    Message,
    Presence,
    Send,
    Welcome,
)

if TYPE_CHECKING:
    from chat_server.codecs.base import Codec

SendFrame = Callable[[bytes], None]
CloseConnection = Callable[[int, str], None]

CLOSE_POLICY_VIOLATION = 1008
#: rooms one connection may be in at once (``MAX_ROOMS_PER_CONNECTION``): Centrifugo's
#: channels-per-connection default is 128, and each room a connection is in costs this
#: process a subscription and a presence lease renewal with BROKER=redis
MAX_ROOMS_PER_CONNECTION_DEFAULT = 128


class RoomSeam(Protocol):
    """What the core asks of the broker about its rooms (both brokers keep it)."""

    def last_seq(self, room: str) -> int:
        """The room's last ``seq`` delivered in this process (0 when none)."""

    def subscribe(self, room: str) -> None:
        """The room opened here (its first member joined)."""

    def members(self, room: str) -> Collection[str]:
        """The room's users other processes hold (none with one process)."""

    def presence_changed(self, room: str, user: str) -> None:
        """``user``'s first connection arrived in ``room`` here, or its last left."""


class Session:
    """One connection's state: its user, rooms, rate-limit allowance and error count."""

    __slots__ = (
        "close",
        "closed",
        "errors",
        "limited_at",
        "rate_allowance",
        "rooms",
        "send",
        "stamp",
        "user",
    )

    def __init__(
        self, user: str, send: SendFrame, close: CloseConnection, burst: int, now: float
    ) -> None:
        self.user = user
        self.send = send
        self.close = close
        #: the rooms joined, live or replaying (the :class:`Room` knows which)
        self.rooms: set[str] = set()
        self.errors = 0
        #: the rate limit's bucket: frames this session may still send now (a float)
        self.rate_allowance = float(burst)
        self.stamp = now
        self.limited_at: deque[float] = deque(maxlen=burst)
        self.closed = False


class Room:
    """One room's members: live ones get messages, replaying ones wait for their replay."""

    __slots__ = ("live", "name", "replaying", "users")

    def __init__(self, name: str) -> None:
        self.name = name
        #: live member sessions -> their send callable (iterated per message)
        self.live: dict[Session, SendFrame] = {}
        self.replaying: set[Session] = set()
        #: user -> how many of the user's connections are in the room, in order of first join
        self.users: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.live) + len(self.replaying)

    def sessions(self) -> list[Session]:
        """Every member session, live or replaying."""
        return [*self.live, *self.replaying]


class ChatCore:
    """The chat protocol's state machine over sessions and rooms."""

    def __init__(
        self,
        codec: Codec,
        rooms: RoomSeam,
        *,
        max_body_chars: int,
        max_protocol_errors: int,
        rate_limit_per_s: float,
        rate_limit_burst: int,
        max_rooms_per_connection: int = MAX_ROOMS_PER_CONNECTION_DEFAULT,
    ) -> None:
        self.codec = codec
        #: the broker seam (see the module docstring), its methods bound once
        self.room_opened = rooms.subscribe
        self.remote_members = rooms.members
        self.presence_changed = rooms.presence_changed
        self.last_seq = rooms.last_seq
        self.encode = codec.encode_server
        self.max_body_chars = max_body_chars
        self.max_protocol_errors = max_protocol_errors
        self.rate = rate_limit_per_s
        self.burst = rate_limit_burst
        self.flood_window_s = rate_limit_burst / rate_limit_per_s
        self.max_rooms_per_connection = max_rooms_per_connection
        self.rooms: dict[str, Room] = {}
        self.sessions: set[Session] = set()
        #: error frames sent, by code (for metrics)
        self.errors_sent: Counter[str] = Counter()

    # ---- connections ---------------------------------------------------------------

    def open_session(
        self, user: str, send: SendFrame, close: CloseConnection, now: float
    ) -> Session:
        """Register a new connection and send its ``welcome``."""
        session = Session(user, send, close, self.burst, now)
        self.sessions.add(session)
        send(self.encode(Welcome(user=user, codec=self.codec.name)))
        return session

    def close_session(self, session: Session) -> list[str]:
        """Forget a connection: leave every room (presence ``leave`` where it was the last);
        the rooms that closed (their last local member left)."""
        session.closed = True
        closed = [room for room in list(session.rooms) if self._remove_member(session, room)]
        self.sessions.discard(session)
        return closed

    # ---- rate limit and errors -------------------------------------------------------

    def allow_frame(self, session: Session, now: float) -> bool:
        """Spend one frame of the session's rate allowance; False when none is left."""
        allowance = session.rate_allowance + (now - session.stamp) * self.rate
        allowance = min(allowance, self.burst)
        session.stamp = now
        if allowance >= 1.0:
            session.rate_allowance = allowance - 1.0
            return True
        session.rate_allowance = allowance
        return False

    def rate_limited(self, session: Session, now: float, ref: str | None = None) -> None:
        """Answer ``rate_limited`` (with the refused send's ``ref``); close 1008 on a flood."""
        self._send_error(session, ErrorCode.RATE_LIMITED, "too many frames", ref)
        self._note_limited(session, now, "rate_limited: flood")

    def control_frame_limited(self, session: Session, now: float) -> None:
        """A ping (or a pong nobody asked for) past the session's allowance: no answer and
        no error frame (either would be output a flooder makes the server write); it
        counts toward the flood close like a refused data frame."""
        self._note_limited(session, now, "rate_limited: control frame flood")

    def _note_limited(self, session: Session, now: float, reason: str) -> None:
        """Close 1008 once ``burst`` frames were refused within the flood window."""
        limited_at = session.limited_at
        limited_at.append(now)
        if len(limited_at) == self.burst and now - limited_at[0] <= self.flood_window_s:
            self._close(session, CLOSE_POLICY_VIOLATION, reason)

    def fail(self, session: Session, error: ChatError) -> None:
        """Answer an error frame; close 1008 once the counted errors reach the limit."""
        self._send_error(session, error.code, error.detail, error.ref)
        if error.code in UNCOUNTED_CODES:
            return
        session.errors += 1
        if session.errors >= self.max_protocol_errors:
            self._close(session, CLOSE_POLICY_VIOLATION, f"too many protocol errors ({error.code})")

    def _send_error(self, session: Session, code: ErrorCode, detail: str, ref: str | None) -> None:
        self.errors_sent[code.value] += 1
        session.send(self.encode(Error(code=code.value, detail=detail, ref=ref)))

    def _close(self, session: Session, code: int, reason: str) -> None:
        if not session.closed:
            session.closed = True
            session.close(code, reason)

    # ---- join / leave ----------------------------------------------------------------

    def check_join(self, session: Session, message: Join) -> None:
        """Raise the error a ``join`` gets, in the contract's order: ``bad_request`` (a
        negative ``since``), ``invalid_room``, ``too_many_rooms`` (a room not joined yet
        while the session is in ``max_rooms_per_connection`` already; joining a room it
        is in again is always allowed)."""
        check_since(message.since)
        check_room(message.room)
        rooms = session.rooms
        if len(rooms) >= self.max_rooms_per_connection and message.room not in rooms:
            raise ProtocolError(
                ErrorCode.TOO_MANY_ROOMS,
                f"in {len(rooms)} rooms already (MAX_ROOMS_PER_CONNECTION="
                f"{self.max_rooms_per_connection}): leave one first",
            )

    def join(self, session: Session, message: Join) -> bool:
        """Join a room and answer ``joined``; True when the caller must replay from ``since``.

        Presence ``join`` goes to the other members on the user's first connection
        in the room. Without ``since`` the member is live at once. Refused as
        :meth:`check_join` says.
        """
        room_name = message.room
        self.check_join(session, message)
        room = self.rooms.get(room_name)
        if room is None:
            room = self.rooms[room_name] = Room(room_name)
            self.room_opened(room_name)
        replay = message.since is not None
        if room_name not in session.rooms:
            count = room.users.get(session.user, 0)
            room.users[session.user] = count + 1
            if count == 0:
                if session.user not in self.remote_members(room_name):
                    self._presence(room, session.user, "join")
                self.presence_changed(room_name, session.user)
        else:
            room.live.pop(session, None)
            room.replaying.discard(session)
        joined = Joined(
            room=room_name, members=self._members(room), last_seq=self.last_seq(room_name)
        )
        session.send(self.encode(joined))
        session.rooms.add(room_name)
        if replay:
            room.replaying.add(session)
        else:
            room.live[session] = session.send
        return replay

    def replay_caught_up(self, session: Session, room_name: str, cursor: int) -> bool:
        """Make a replaying member live if ``cursor`` reached the room's last ``seq``.

        Returns True when the replay is over (caught up, or the member left or
        disconnected meanwhile); False when more stored messages must be sent first.
        """
        room = self.rooms.get(room_name)
        if session.closed or room is None or session not in room.replaying:
            return True
        if cursor < self.last_seq(room_name):
            return False
        room.replaying.discard(session)
        room.live[session] = session.send
        return True

    def leave(self, session: Session, message: Leave) -> bool:
        """Leave a room (no reply); ``not_in_room`` when not joined. True when the room
        closed (its last local member left)."""
        check_room(message.room)
        if message.room not in session.rooms:
            raise ProtocolError(ErrorCode.NOT_IN_ROOM, f"not in room {message.room}")
        return self._remove_member(session, message.room)

    def _remove_member(self, session: Session, room_name: str) -> bool:
        """Take ``session`` out of the room; True when that closed the room."""
        session.rooms.discard(room_name)
        room = self.rooms.get(room_name)
        if room is None:
            return False
        room.live.pop(session, None)
        room.replaying.discard(session)
        count = room.users.get(session.user, 0) - 1
        if count > 0:
            room.users[session.user] = count
            return False
        room.users.pop(session.user, None)
        closed = len(room) == 0
        if closed:
            del self.rooms[room_name]
        elif session.user not in self.remote_members(room_name):
            self._presence(room, session.user, "leave")
        self.presence_changed(room_name, session.user)
        return closed

    def _members(self, room: Room) -> list[str]:
        """The room's view: the shared member set, then local users not in it, each once."""
        remote = self.remote_members(room.name)
        if not remote:
            return list(room.users)
        return [*remote, *(user for user in room.users if user not in remote)]

    def remote_presence(self, room_name: str, user: str, present: bool) -> None:
        """The broker heard ``user`` join (True) or leave the room's shared set: tell members.

        Nothing is sent when the user is connected here, since the view did not change.
        """
        room = self.rooms.get(room_name)
        if room is None or user in room.users:
            return
        self._presence(room, user, "join" if present else "leave")

    def _presence(self, room: Room, user: str, event: str) -> None:
        frame = self.encode(Presence(room=room.name, user=user, event=event))
        for member in room.sessions():
            if member.user != user:
                member.send(frame)

    # ---- messages --------------------------------------------------------------------

    def accept_send(self, session: Session, message: Send, now_ms: int) -> Message:
        """Validate a ``send`` and return the message to store (``seq`` 0, ``ts`` now)."""
        room, body, ref = message.room, message.body, message.ref
        check_send(room, body, ref, self.max_body_chars)
        if room not in session.rooms:
            raise ProtocolError(ErrorCode.NOT_IN_ROOM, f"not in room {room}", ref)
        return Message(room=room, seq=0, user=session.user, body=body, ts=now_ms, ref=ref)

    def deliver(self, message: Message) -> None:
        """Send a committed message to the room's live members, encoded once."""
        room = self.rooms.get(message.room)
        if room is None or not room.live:
            return
        frame = self.encode(message)
        for send in room.live.values():
            send(frame)

    def ack(self, session: Session, message: Message) -> None:
        """Acknowledge a committed message to its sender."""
        if not session.closed:
            session.send(self.encode(Ack(room=message.room, seq=message.seq, ref=message.ref)))

    def store_failed(self, session: Session, message: Message, error: ChatError) -> None:
        """Tell a sender its message was not stored (``unavailable`` or ``internal``)."""
        if not session.closed:
            self._send_error(session, error.code, error.detail, message.ref)

    @staticmethod
    def check_history(message: HistoryRequest) -> int:
        """Validate a ``history`` request; return its page size."""
        limit = history_limit(message.limit)
        check_room(message.room)
        return limit


class EncodingPerRecipientCore(ChatCore):
    """REGRESSION=encode_per_recipient: the core, but a broadcast is encoded per member."""

    def deliver(self, message: Message) -> None:
        """:meth:`ChatCore.deliver` re-encoding the message for every live member."""
        room = self.rooms.get(message.room)
        if room is None:
            return
        encode = self.encode
        for send in room.live.values():
            send(encode(message))
