"""The broker contract: which rooms this process hears, and fan-out between processes.

Both backends keep it. :class:`~chat_server.broker.memory.MemoryBroker` (one process)
has no other process to reach: every room is ready at once and a committed message
is delivered by :class:`~chat_server.delivery.local.LocalDelivery` when the store
reports its batch. :class:`~chat_server.broker.redis.RedisBroker`
carries each message, the store's commit script having published it, to every
process subscribed to the room, and reports it to the listener given to
:meth:`Broker.report_to`, in ``seq`` order per room.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import Any, Protocol

from chat_server.messages import Message


class BrokerListener(Protocol):
    """What a broker reports to (the shared delivery): messages heard, room state."""

    def delivered(self, message: Message) -> None:
        """A subscribed room's next message, in ``seq`` order."""

    def ack(self, sender: Any, message: Message) -> None:
        """Ack ``message`` to the session that sent it (after its delivery here)."""

    def announce(self, room: str, user: str, present: bool) -> None:
        """The room's shared member set gained (True) or lost ``user``."""

    def local_users(self, room: str) -> Collection[str]:
        """The users this process holds in ``room``."""

    def local_rooms(self) -> dict[str, Collection[str]]:
        """Every room this process holds, with its users."""


class Broker(ABC):
    """Subscriptions, readiness and shared presence of the rooms this process serves."""

    def report_to(self, listener: BrokerListener) -> None:  # noqa: B027 (optional)
        """Report what the broker hears to ``listener`` (before :meth:`start`)."""

    @abstractmethod
    async def start(self) -> None:
        """Connect; raise BrokerUnavailable if the broker cannot be reached."""

    @abstractmethod
    def is_ready(self, room: str) -> bool:
        """True when a join of ``room`` needs no wait."""

    @abstractmethod
    async def prepare(self, room: str) -> None:
        """Make ``room`` ready (subscribe, snapshot); BrokerUnavailable if that fails."""

    @abstractmethod
    def release(self, room: str) -> None:
        """A join that prepared ``room`` is over: drop it if nothing else needs it."""

    @abstractmethod
    def subscribe(self, room: str) -> None:
        """The core opened ``room`` (its first member joined, after :meth:`prepare`
        subscribed to it): keep it while it has members."""

    @abstractmethod
    def unsubscribe(self, room: str) -> None:
        """The core closed ``room`` (its last member left; the service tells, once the core
        returned it): stop receiving its messages unless a join is preparing it again."""

    @abstractmethod
    def last_seq(self, room: str) -> int:
        """The last ``seq`` of ``room`` delivered in this process (0 when none)."""

    @abstractmethod
    def members(self, room: str) -> Collection[str]:
        """The room's users other processes hold (none with one process)."""

    @abstractmethod
    def presence_changed(self, room: str, user: str) -> None:
        """``user``'s first connection arrived in ``room`` here, or its last left."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters for /stats (empty when there is nothing to count)."""

    @abstractmethod
    async def close(self) -> None:
        """Disconnect."""
