"""One process: the service's own commits are delivered and acked at once."""

from __future__ import annotations

import time
from collections import deque

from chat_server.core.chat import Session
from chat_server.delivery.base import Delivery, Payload
from chat_server.messages import Join, Message


class LocalDelivery(Delivery):
    """Every room is here: deliver each committed message, then ack its send.

    Joins never wait and no frame is held.
    """

    def committed(self, items: list[tuple[Message, Session]]) -> None:
        """Deliver each message through the core, then ack it (the sender sees its
        ``message`` before its ``ack``)."""
        deliver = self.core.deliver
        ack = self.core.ack
        observe_ack = self.counters.ack_latency.observe
        observe_delivery = self.counters.delivery_latency.observe
        # the transports write each connection's frames of this batch together, once
        # the loop iteration ends: one clock reading serves the whole batch
        now_ms = time.time_ns() / 1e6
        for message, session in items:
            deliver(message)
            latency_ms = now_ms - message.ts
            observe_delivery(latency_ms)
            observe_ack(latency_ms)
            ack(session, message)

    def join_ready(self, session: Session, message: Join) -> bool:
        """Always: every room is local."""
        return True

    async def prepare(self, room: str) -> None:
        """Nothing to prepare (never awaited: every join is ready)."""

    def joined(self, session: Session, room: str) -> deque[Payload]:
        """Nothing was held."""
        return deque()

    def gate(self, session: Session, payload: Payload) -> bool:
        """Every frame is handled now."""
        return True
