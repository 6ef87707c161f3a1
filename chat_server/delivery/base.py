"""The delivery contract the service calls for every commit, join and frame."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Any

from chat_server.core.chat import ChatCore, Session
from chat_server.messages import Join, Message
from chat_server.metrics import Counters

#: what a transport hands over: a binary or a text frame's payload
Payload = bytes | str


class Delivery(ABC):
    """Deliver committed messages, ack their sends, and gate frames behind waiting joins.

    The service calls every method; none calls the service back. What the service
    must do next is returned: whether a join may happen now (:meth:`join_ready`),
    whether a frame is handled now (:meth:`gate`), the frames a finished join
    released (:meth:`joined`).
    """

    def __init__(self, core: ChatCore, counters: Counters) -> None:
        self.core = core
        self.counters = counters

    @abstractmethod
    def committed(self, items: list[tuple[Message, Session]]) -> None:
        """A batch the store committed (each room's in commit order): deliver and ack what can
        be now."""

    @abstractmethod
    def join_ready(self, session: Session, message: Join) -> bool:
        """True when ``message``'s room can be joined now; False when the join must
        wait for :meth:`prepare` (the session's later frames are held meanwhile)."""

    @abstractmethod
    async def prepare(self, room: str) -> None:
        """Make ``room`` joinable; ``BrokerUnavailable`` when it cannot be."""

    @abstractmethod
    def joined(self, session: Session, room: str) -> deque[Payload]:
        """A waiting join ended (joined or not): the frames it held, to handle in order."""

    @abstractmethod
    def gate(self, session: Session, payload: Payload) -> bool:
        """True when the frame is handled now; False when it waits behind a join.
        Raises :class:`~chat_server.errors.Unavailable` when too many wait."""

    def rooms_closed(self, rooms: list[str]) -> None:  # noqa: B027 (nothing waits by default)
        """The core closed ``rooms`` (their last local member left): settle what waited
        for them."""

    def forget(self, session: Session) -> None:  # noqa: B027 (nothing held by default)
        """The session closed: drop what was kept for it."""

    async def drain(self) -> None:  # noqa: B027 (nothing waits by default)
        """On shutdown, after the store's last commit: ack what still waits."""

    def stats(self) -> dict[str, Any]:
        """Counters for /stats (empty when there is nothing to count)."""
        return {}

    def ack(self, session: Session, message: Message) -> None:
        """Ack a durable message and count its latency from accept (``ts``) to now."""
        self.counters.ack_latency.observe(time.time_ns() / 1e6 - message.ts)
        self.core.ack(session, message)
