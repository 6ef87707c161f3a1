"""The history-store interface: durable, ordered, per-room message history.

The store assigns each room's ``seq`` when it commits, so a batch that fails
consumes none and a shared store can number messages for many processes. Writes
are submitted without waiting; the store reports each committed (or failed)
batch back on the event loop through the ``on_batch`` callback it was built with.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple

from chat_server.errors import StoreError
from chat_server.messages import Message


class BatchResult(NamedTuple):
    """One group commit's outcome, delivered on the event loop.

    ``items`` are the submitted ``(message, context)`` pairs in submission order.
    On success ``error`` is None and every message has its ``seq`` set; on failure
    ``error`` says why and no message got a ``seq`` (it stays 0).
    """

    items: list[tuple[Message, Any]]
    error: StoreError | None


BatchCallback = Callable[[BatchResult], None]


class HistoryStore(ABC):
    """Durable history. All methods are called from the event loop thread."""

    @abstractmethod
    async def start(self) -> None:
        """Open the store and learn every room's last ``seq``; raise StoreError if it cannot."""

    @abstractmethod
    def submit(self, message: Message, context: Any) -> None:
        """Queue ``message`` (``seq`` 0) for the next group commit; never blocks.

        Raises ``StoreUnavailable`` when the bounded queue is full or the store is
        closing: then nothing was queued. The outcome arrives later via ``on_batch``.
        """

    @abstractmethod
    def last_seq(self, room: str) -> int:
        """The last committed ``seq`` of ``room`` (0 when it has none)."""

    @abstractmethod
    async def history(self, room: str, before: int | None, limit: int) -> list[Message]:
        """The latest ``limit`` messages with ``seq < before`` (all when None), ascending."""

    @abstractmethod
    async def after(self, room: str, after_seq: int, limit: int) -> list[Message]:
        """Up to ``limit`` messages with ``seq > after_seq``, ascending (for replay)."""

    @abstractmethod
    async def flush(self) -> None:
        """Return once everything submitted so far is committed and reported."""

    @abstractmethod
    async def close(self) -> None:
        """Flush, then release the database; later submits raise ``StoreUnavailable``."""
