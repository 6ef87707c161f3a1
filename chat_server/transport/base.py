"""The transport seam: what the server needs from a websocket implementation.

A transport accepts connections (handshake auth and subprotocol per the
contract), hands each connection's frames to ``ChatService.on_frame`` and writes
the frames the core gives it, with its own outbound accounting. The core, codecs,
store and broker never know which transport runs.
"""

from __future__ import annotations

from typing import Any, Protocol


class Transport(Protocol):
    """A running websocket server."""

    async def start(self) -> None:
        """Listen; raise OSError if the address cannot be bound."""

    @property
    def port(self) -> int:
        """The port actually bound."""

    def stop_accepting(self) -> None:
        """Stop accepting connections; open ones stay."""

    async def close_all(self, code: int = 1001, reason: str = "") -> None:
        """Close every connection with ``code`` and wait until they are gone."""

    def stats_snapshot(self) -> dict[str, Any]:
        """Counters of the service and of the transport's outbound accounting."""
