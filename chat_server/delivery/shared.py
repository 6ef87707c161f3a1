"""Rooms shared between processes through a broker (``BROKER=redis``).

The store's commit script publishes, so a committed message reaches this process's
members when the broker hears it back (:meth:`SharedDelivery.delivered`). An ack
waits until this process has delivered its message, so the sender sees its
``message`` before its ``ack`` as with one process: the two meet in the room's one
owner, :class:`~chat_server.broker.shared_room.SharedRoom`, which returns each ack
right after its message. Joining a room the broker does
not hold yet waits for it to subscribe; the session's later frames wait behind the
join, in order (:meth:`SharedDelivery.gate`).

It is the broker's listener: the broker reports the messages to deliver, the acks to
send, and presence. The rooms the core closed come from the service
(:meth:`SharedDelivery.rooms_closed`), after the core returned them, and go to the
broker from here: nothing the core calls leads back into it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from chat_server.core.chat import ChatCore, Session
from chat_server.delivery.base import Delivery, Payload
from chat_server.errors import Unavailable
from chat_server.messages import Join, Message
from chat_server.metrics import Counters

if TYPE_CHECKING:
    from chat_server.broker.redis import RedisBroker

#: frames a session may send while its join waits for the broker; past it: unavailable
HELD_FRAMES_MAX = 256
#: on SIGTERM: how long acks may wait for their message's delivery
ACK_DRAIN_WAIT_S = 2.0


class SharedDelivery(Delivery):
    """Acks after delivery, joins after subscribing, held frames, shared presence."""

    def __init__(self, core: ChatCore, counters: Counters, broker: RedisBroker) -> None:
        super().__init__(core, counters)
        self.broker = broker
        #: sessions whose join waits for the broker -> the frames they sent meanwhile
        self.held: dict[Session, deque[Payload]] = {}
        broker.report_to(self)

    # ---- what the service calls ---------------------------------------------------------

    def committed(self, items: list[tuple[Message, Session]]) -> None:
        """Ack what Redis committed once this process delivered it (the store published it):
        the broker's rooms keep the acks until then."""
        self.broker.committed(items)

    def join_ready(self, session: Session, message: Join) -> bool:
        """True when the broker holds the room; else hold the session's later frames.

        A join the core refuses raises its error here, before the broker subscribes
        to anything for it."""
        self.core.check_join(session, message)
        if self.broker.is_ready(message.room):
            return True
        self.held[session] = deque()
        return False

    async def prepare(self, room: str) -> None:
        """Subscribe to ``room`` and apply its snapshot; ``BrokerUnavailable`` if that fails."""
        await self.broker.prepare(room)

    def joined(self, session: Session, room: str) -> deque[Payload]:
        """The join ended: let the broker drop an unused room; return the held frames."""
        if room not in self.core.rooms:
            self.broker.release(room)
        return self.held.pop(session, None) or deque()

    def gate(self, session: Session, payload: Payload) -> bool:
        """Hold a frame sent while the session's join waits; :class:`Unavailable` past the
        bound."""
        held = self.held.get(session)
        if held is None:
            return True
        if len(held) >= HELD_FRAMES_MAX:
            raise Unavailable("too many frames in a join")
        held.append(payload)
        return False

    def rooms_closed(self, rooms: list[str]) -> None:
        """The core closed ``rooms`` (their last local member left; nothing more is heard
        of them): the broker acks what waited for their delivery and stops hearing them."""
        for room in rooms:
            self.broker.unsubscribe(room)

    def forget(self, session: Session) -> None:
        """The session closed: drop what it held."""
        self.held.pop(session, None)

    async def drain(self) -> None:
        """On SIGTERM: give committed messages a moment to be heard back, then ack them."""
        deadline = time.monotonic() + ACK_DRAIN_WAIT_S
        while self.broker.acks_waiting() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.broker.release_acks()

    def stats(self) -> dict[str, Any]:
        """The broker's counters and the acks waiting for their delivery."""
        return {
            "broker": self.broker.stats(),
            "pending_acks": self.broker.acks_waiting(),
        }

    # ---- what the broker reports (BrokerListener) ------------------------------------------

    def delivered(self, message: Message) -> None:
        """Deliver a message the broker heard to the room's local members."""
        self.core.deliver(message)
        self.counters.delivery_latency.observe(time.time_ns() / 1e6 - message.ts)

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
