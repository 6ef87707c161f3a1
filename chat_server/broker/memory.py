"""The embedded broker for one process: publish is a direct, synchronous delivery."""

from __future__ import annotations

from chat_server.broker.base import Broker, Deliver
from chat_server.messages import Message


class MemoryBroker(Broker):
    """In-process fan-out: ``publish`` calls ``deliver`` at once, so order is commit order."""

    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver

    async def start(self) -> None:
        """Nothing to connect."""

    def subscribe(self, room: str) -> None:
        """Every room is local; nothing to do."""

    def unsubscribe(self, room: str) -> None:
        """Every room is local; nothing to do."""

    def publish(self, message: Message) -> None:
        """Deliver to the local room now."""
        self._deliver(message)

    async def close(self) -> None:
        """Nothing to disconnect."""
