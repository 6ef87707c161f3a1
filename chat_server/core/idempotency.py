"""Idempotent sends: a ``send``'s ``ref`` is an idempotency key per user and room.

A client that lost its connection, or got ``unavailable``, cannot know whether its
send was stored; it sends it again with the same ``ref``. :class:`RecentSends`
remembers, for ``SEND_REF_WINDOW_S``, every send with a ``ref``: the key
``(user, room, ref)``, a hash of the body, and the ``seq`` once committed. A send
that repeats one (same key, same body) is not stored or broadcast again: it gets
the original's ``ack`` (same ``seq``), or, while the original is still being
committed, waits for the original's outcome. The same key with another body is a
new message (clients that reuse refs as mere correlation ids keep working); a send
without ``ref`` is never looked up.

No I/O and no clock: times are the messages' ``ts`` (ms); the caller loads the
window's committed sends from the history store at start, so the window holds
across restarts. Bounded: at most ``max_entries`` keys, the oldest forgotten first.
Cost per send with a ``ref``: one dict lookup, and one insertion once submitted.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from chat_server.messages import Message

Key = tuple[str, str, str]


class SendRecord:
    """One remembered send: its body's hash, its ``seq`` (0 while in flight), its time,
    and the contexts (connections) of repeats waiting for it to be committed."""

    __slots__ = ("body_hash", "seq", "ts_ms", "waiting")

    def __init__(self, body_hash: int, seq: int, ts_ms: int) -> None:
        self.body_hash = body_hash
        self.seq = seq
        self.ts_ms = ts_ms
        #: connections of repeats waiting for this send's outcome (None: none)
        self.waiting: list[Any] | None = None

    def wait(self, context: Any) -> None:
        """A repeat arrived while this send is in flight: answer ``context`` with its outcome."""
        if self.waiting is None:
            self.waiting = []
        self.waiting.append(context)


class RecentSends:
    """The sends with a ``ref`` of the last ``window_ms`` (at most ``max_entries``)."""

    def __init__(self, window_ms: int, max_entries: int) -> None:
        self.window_ms = window_ms
        self.max_entries = max_entries
        self._records: OrderedDict[Key, SendRecord] = OrderedDict()
        #: repeats answered from memory since start (for /stats)
        self.repeats = 0

    def __len__(self) -> int:
        return len(self._records)

    def repeat_of(self, message: Message) -> SendRecord | None:
        """The earlier send ``message`` repeats (same key and body, in the window), else None."""
        record = self._records.get((message.user, message.room, message.ref))  # type: ignore[arg-type]
        if record is None or record.body_hash != hash(message.body):
            return None
        self.repeats += 1
        return record

    def submitted(self, message: Message) -> None:
        """Remember a send just submitted to the store (in flight until :meth:`committed`)."""
        self._remember(message, 0)

    def committed(self, message: Message) -> list[Any]:
        """The send was stored (its ``seq`` is set); returns the repeats that waited for it."""
        record = self._records.get((message.user, message.room, message.ref))  # type: ignore[arg-type]
        if record is None or record.seq:
            return []
        record.seq = message.seq
        waiting, record.waiting = record.waiting, None
        return waiting or []

    def failed(self, message: Message) -> list[Any]:
        """The send was not stored: forget it (a retry is new); returns the waiting repeats."""
        key = (message.user, message.room, message.ref)
        record = self._records.get(key)  # type: ignore[arg-type]
        if record is None or record.seq:
            return []
        del self._records[key]  # type: ignore[arg-type]
        return record.waiting or []

    def load(self, message: Message) -> None:
        """Remember a stored send (at start: the window's sends with a ref, oldest first)."""
        self._remember(message, message.seq)

    def _remember(self, message: Message, seq: int) -> None:
        if not self.window_ms:
            return  # SEND_REF_WINDOW_S=0: nothing is remembered, nothing is a repeat
        records = self._records
        key = (message.user, message.room, message.ref)
        records.pop(key, None)  # type: ignore[arg-type]  # a reused ref: the newer one counts
        records[key] = SendRecord(hash(message.body), seq, message.ts)  # type: ignore[index]
        if len(records) > self.max_entries:
            records.popitem(last=False)
        horizon = message.ts - self.window_ms
        while True:  # the oldest first; the one just remembered is always kept
            oldest = next(iter(records.values()))
            if oldest.ts_ms >= horizon or oldest.waiting:
                break
            records.popitem(last=False)
