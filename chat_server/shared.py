"""BROKER=redis: what the service does differently when rooms are shared between processes.

The store's commit script publishes, so a committed message reaches this process's
members when the broker hears it back (:meth:`SharedRooms.delivered`). An ack waits
until this process has delivered its message, so the sender sees its ``message``
before its ``ack`` as with one process. Joining a room the broker does not hold yet
waits for it to subscribe; the session's later frames wait behind the join, in order
(:meth:`SharedRooms.hold`). The service builds one of these only with
``BROKER=redis``; with one process none of it exists.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from chat_server.broker.base import Broker
from chat_server.core.chat import ChatCore, Session
from chat_server.core.validation import check_room, check_since
from chat_server.errors import BrokerUnavailable, ErrorCode, ProtocolError
from chat_server.messages import Join, Message
from chat_server.metrics import Counters

log = logging.getLogger("chat_server")

#: frames a session may send while its join waits for the broker; past it: unavailable
HELD_FRAMES_MAX = 256
#: on SIGTERM: how long acks may wait for their message's delivery
ACK_DRAIN_WAIT_S = 2.0
#: a seq above every real one: release every waiting ack of a room
_EVERY_SEQ = 2**63

Frame = bytes | str


class SharedRooms:
    """Acks after delivery, joins after subscribing, held frames, shared presence.

    ``join_now`` and ``dispatch`` are the service's: a join that no longer needs to
    wait, and the handling of one held frame. ``spawn`` runs a background task the
    service owns (cancelled at close).
    """

    def __init__(
        self,
        core: ChatCore,
        broker: Broker,
        counters: Counters,
        *,
        join_now: Callable[[Session, Join], None],
        dispatch: Callable[[Session, Frame], None],
        spawn: Callable[[Awaitable[Any]], asyncio.Task[Any]],
    ) -> None:
        self.core = core
        self.broker = broker
        self.counters = counters
        self._join_now = join_now
        self._dispatch = dispatch
        self._spawn = spawn
        #: room -> sends committed here, waiting for their delivery to be acked (seq order)
        self.pending_acks: dict[str, deque[tuple[Message, Session]]] = {}
        #: sessions whose join waits for the broker -> the frames they sent meanwhile
        self.held: dict[Session, deque[Frame]] = {}

    # ---- what the broker reports (BrokerListener) ------------------------------------------

    def delivered(self, message: Message) -> None:
        """Deliver a message the broker heard, then ack the sends it completes."""
        self.core.deliver(message)
        self.counters.delivery_latency.observe(time.time_ns() / 1e6 - message.ts)
        if self.pending_acks and message.room in self.pending_acks:
            self.jumped(message.room, message.seq)

    def jumped(self, room: str, last_seq: int) -> None:
        """Ack the room's waiting sends with ``seq <= last_seq``."""
        waiting = self.pending_acks.get(room)
        if not waiting:
            return
        ack = self._ack
        while waiting and waiting[0][0].seq <= last_seq:
            message, session = waiting.popleft()
            ack(session, message)
        if not waiting:
            del self.pending_acks[room]

    def announce(self, room: str, user: str, present: bool) -> None:
        """The room's shared member set changed: tell the local members."""
        self.core.remote_presence(room, user, present)

    def local_users(self, room: str) -> Collection[str]:
        """The users this process holds in ``room``."""
        found = self.core.rooms.get(room)
        return () if found is None else found.users.keys()

    def local_rooms(self) -> dict[str, Collection[str]]:
        """Every room this process holds, with its users."""
        return {name: list(room.users) for name, room in self.core.rooms.items()}

    # ---- what the core and the service call --------------------------------------------

    def committed(self, items: list[tuple[Message, Session]]) -> None:
        """Ack what Redis committed once this process delivered it (the store published it)."""
        core = self.core
        last_seq = core.last_seq  # the broker's: what this process delivered
        pending = self.pending_acks
        for message, session in items:
            room = message.room
            waiting = pending.get(room)
            if waiting is not None:
                waiting.append((message, session))
            elif room in core.rooms and last_seq(room) < message.seq:
                pending[room] = deque([(message, session)])
            else:
                self._ack(session, message)

    def room_closed(self, room: str) -> None:
        """The room's last local member left: stop hearing it, ack what waited for it."""
        self.broker.unsubscribe(room)
        self.jumped(room, _EVERY_SEQ)

    def join(self, session: Session, message: Join) -> None:
        """Join now if the broker holds the room; else subscribe first, holding later frames."""
        check_since(message.since)
        check_room(message.room)
        if self.broker.is_ready(message.room):
            self._join_now(session, message)
            return
        self.held[session] = deque()
        self._spawn(self._join_when_ready(session, message))

    def hold(self, session: Session, frame: Frame) -> None:
        """Keep a frame sent while the session's join waits (``unavailable`` past the bound)."""
        held = self.held[session]
        if len(held) >= HELD_FRAMES_MAX:
            self.core.fail(
                session, ProtocolError(ErrorCode.UNAVAILABLE, "too many frames in a join")
            )
            return
        held.append(frame)

    def forget(self, session: Session) -> None:
        """The session closed: drop what it held."""
        self.held.pop(session, None)

    async def drain(self) -> None:
        """On SIGTERM: give committed messages a moment to be heard back, then ack them."""
        deadline = time.monotonic() + ACK_DRAIN_WAIT_S
        while self.pending_acks and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for room in list(self.pending_acks):
            self.jumped(room, _EVERY_SEQ)

    def stats(self) -> dict[str, Any]:
        """The broker's counters and the acks waiting for their delivery."""
        return {
            "broker": self.broker.stats(),
            "pending_acks": sum(map(len, self.pending_acks.values())),
        }

    # ---- internals -------------------------------------------------------------------

    def _ack(self, session: Session, message: Message) -> None:
        """Ack a durable message and count its latency from accept (``ts``) to now."""
        self.counters.observe_ack_latency_ms(time.time_ns() / 1e6 - message.ts)
        self.core.ack(session, message)

    async def _join_when_ready(self, session: Session, message: Join) -> None:
        room = message.room
        try:
            await self.broker.prepare(room)
            if not session.closed:
                self._join_now(session, message)
        except BrokerUnavailable as exc:
            log.info("join of %s by %s refused: %s", room, session.user, exc)
            if not session.closed:
                self.core.fail(session, ProtocolError(ErrorCode.UNAVAILABLE, f"cannot join: {exc}"))
        except ProtocolError as exc:
            self.core.fail(session, exc)
        except Exception:
            log.exception("internal error while %s joined %s", session.user, room)
            self.core.fail(session, ProtocolError(ErrorCode.INTERNAL, "the server failed"))
        finally:
            if room not in self.core.rooms:
                self.broker.release(room)
            self._release_held(session)

    def _release_held(self, session: Session) -> None:
        """Handle the frames that waited behind a join, in order, until another join waits."""
        held = self.held.pop(session, None)
        while held and not session.closed:
            self._dispatch(session, held.popleft())
            again = self.held.get(session)
            if again is not None:
                again.extend(held)
                return
