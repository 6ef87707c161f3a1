"""Idempotent sends: a ``send``'s ``ref`` and body are an idempotency key per user and room.

A client that lost its connection, or got ``unavailable``, cannot know whether its
send was stored; it sends it again with the same ``ref``. :class:`RecentSends`
remembers, for ``SEND_REF_WINDOW_S``, every send with a ``ref``: the key
``(user, room, ref, hash of the body)`` and the ``seq`` once committed. A send that
repeats one (same key) is not stored or broadcast again: it gets that send's own
``ack`` (its ``seq``), or, while that send is still being committed, waits for its
outcome. The same ``ref`` with another body is another message with a key of its own
(clients that reuse refs as mere correlation ids keep working, and a repeat of any
of them is answered with its own message's ``seq``); a send without ``ref`` is never
looked up.

Sends in flight (submitted, not yet committed or failed) are held apart from the
settled ones: the store's queue bounds them, and a repeat waiting on one is always
answered, whatever the window forgets meanwhile. Settled sends are bounded by the
window and by ``max_entries`` (``SEND_REF_MAX``: one entry per ref *and body*), the
oldest forgotten first.

No I/O and no clock: times are the messages' ``ts`` (ms); the caller loads the
window's committed sends from the history store at start, so the window holds
across restarts. Cost per send with a ``ref``: two dict lookups, and one insertion
once submitted.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from chat_server.messages import Message

#: (user, room, ref, hash of the body)
Key = tuple[str, str, str, int]


def key_of(message: Message) -> Key:
    """The idempotency key of a send with a ``ref``."""
    return (message.user, message.room, message.ref, hash(message.body))  # type: ignore[return-value]


class SendRecord:
    """One remembered send: its ``seq`` (0 while in flight), its time, and the contexts
    (connections) of repeats waiting for it to be committed."""

    __slots__ = ("seq", "ts_ms", "waiting")

    def __init__(self, seq: int, ts_ms: int) -> None:
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
    """The sends with a ``ref`` in flight, and the settled ones of the last ``window_ms``
    (at most ``max_entries``)."""

    def __init__(self, window_ms: int, max_entries: int) -> None:
        self.window_ms = window_ms
        self.max_entries = max_entries
        self._in_flight: dict[Key, SendRecord] = {}
        self._settled: OrderedDict[Key, SendRecord] = OrderedDict()
        #: repeats answered from memory since start (for /stats)
        self.repeats = 0

    def __len__(self) -> int:
        return len(self._in_flight) + len(self._settled)

    def repeat_of(self, message: Message) -> SendRecord | None:
        """The earlier send ``message`` repeats (same user, room, ref and body; in flight, or
        settled in the window), else None."""
        key = key_of(message)
        record = self._in_flight.get(key) or self._settled.get(key)
        if record is not None:
            self.repeats += 1
        return record

    def submitted(self, message: Message) -> None:
        """Remember a send just submitted to the store (in flight until :meth:`committed` or
        :meth:`failed`). The caller submits only sends that :meth:`repeat_of` did not find."""
        if self.window_ms:
            self._in_flight[key_of(message)] = SendRecord(0, message.ts)

    def committed(self, message: Message) -> list[Any]:
        """The send was stored (its ``seq`` is set); returns the repeats that waited for it."""
        key = key_of(message)
        record = self._in_flight.pop(key, None)
        if record is None:
            return []
        record.seq = message.seq
        self._settle(key, record)
        waiting, record.waiting = record.waiting, None
        return waiting or []

    def failed(self, message: Message) -> list[Any]:
        """The send was not stored: forget it (a retry is new); returns the waiting repeats."""
        record = self._in_flight.pop(key_of(message), None)
        return (record.waiting or []) if record is not None else []

    def load(self, message: Message) -> None:
        """Remember a stored send (at start: the window's sends with a ref, oldest first)."""
        if self.window_ms:
            self._settle(key_of(message), SendRecord(message.seq, message.ts))

    def _settle(self, key: Key, record: SendRecord) -> None:
        """Keep a committed send for the window; forget the oldest past the window or bound."""
        settled = self._settled
        settled.pop(key, None)
        settled[key] = record
        if len(settled) > self.max_entries:
            settled.popitem(last=False)
        horizon = record.ts_ms - self.window_ms
        while True:  # the oldest first; the one just settled is always kept
            oldest = next(iter(settled.values()))
            if oldest.ts_ms >= horizon:
                break
            settled.popitem(last=False)
