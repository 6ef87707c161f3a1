"""The embedded broker for one process: no other process, so nothing to carry."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from chat_server.broker.base import Broker
from chat_server.store.base import HistoryStore


class MemoryBroker(Broker):
    """One process: every room is ready, no member is elsewhere, and a room's last
    delivered ``seq`` is the last its ``store`` reported (delivered as reported)."""

    def __init__(self, store: HistoryStore) -> None:
        self._store = store

    async def start(self) -> None:
        """Nothing to connect."""

    def is_ready(self, room: str) -> bool:
        """Always: there is nothing to subscribe to."""
        return True

    async def prepare(self, room: str) -> None:
        """Nothing to prepare."""

    def release(self, room: str) -> None:
        """Nothing held."""

    def subscribe(self, room: str) -> None:
        """Every room is local; nothing to do."""

    def unsubscribe(self, room: str) -> None:
        """Every room is local; nothing to do."""

    def last_seq(self, room: str) -> int:
        """The last ``seq`` the store reported for ``room``: delivered in the same call."""
        return self._store.last_seq(room)

    def members(self, room: str) -> Collection[str]:
        """No other process holds anyone."""
        return ()

    def presence_changed(self, room: str, user: str) -> None:
        """No other process to tell."""

    def stats(self) -> dict[str, Any]:
        """Nothing to count."""
        return {}

    async def close(self) -> None:
        """Nothing to disconnect."""
