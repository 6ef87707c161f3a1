"""The broker interface: fan-out of committed messages to every process serving a room.

With one process the broker hands a message straight back to the local core; a
shared broker (:mod:`chat_server.broker.redis`) carries it to every process
subscribed to the room.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from chat_server.messages import Message

Deliver = Callable[[Message], None]


class Broker(ABC):
    """Publishes committed messages; calls ``deliver`` for each message of a subscribed room."""

    @abstractmethod
    async def start(self) -> None:
        """Connect; raise if the broker cannot be reached."""

    @abstractmethod
    def subscribe(self, room: str) -> None:
        """Receive the room's messages in this process (called when its first member joins)."""

    @abstractmethod
    def unsubscribe(self, room: str) -> None:
        """Stop receiving the room's messages (called when its last member leaves)."""

    @abstractmethod
    def publish(self, message: Message) -> None:
        """Send a committed message to every subscribed process, in ``seq`` order per room."""

    @abstractmethod
    async def close(self) -> None:
        """Disconnect."""
