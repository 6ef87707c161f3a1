"""One shared room's state in this process, in one owner, with no I/O (``BROKER=redis``).

A :class:`SharedRoom` is everything this process knows of a room it shares with other
processes, in one place:

- its lifecycle (:mod:`~chat_server.broker.room_life`: subscribing -> snapshot -> live,
  back to snapshot when what was missed must be read again, closed at the end);
- its subscription's, on the node serving it (wanted -> requested -> confirmed, dropped;
  and whether it was lost since it last held): the room is *live* while it is confirmed;
- who holds it: the core's members (``in_use``, between the core opening and closing
  it) and the joins preparing it (``waiters``); a room neither holds is released;
- its feed (:class:`~chat_server.broker.feed.RoomFeed`: ``seq`` order, duplicates, gaps,
  presence versions), and whether a gap is being read (with the wait after a failed read);
- the acks of the sends committed here that wait for their message's delivery.

Every method takes what happened (messages or a presence change heard, a snapshot read,
a page of a gap read, a send committed, an event of its subscription, the core closing
the room) and *returns* what happens next, in order, as values (:data:`Action`):
:class:`~chat_server.broker.feed.Deliver`, :class:`Ack`,
:class:`~chat_server.broker.feed.Announce`, or a read to start
(:attr:`Then.READ_GAP <chat_server.broker.room_life.Then.READ_GAP>`,
:attr:`Then.READ_SNAPSHOT <chat_server.broker.room_life.Then.READ_SNAPSHOT>`). The
broker applies them in one place, the way h11's ``Connection`` returns events and its
user does the I/O. The ack and its message meet here: an :class:`Ack` comes right
after the :class:`~chat_server.broker.feed.Deliver` of its message, or once the room's
``last_seq`` passed it without one (trimmed history), or when the core closed the room
(nothing more of it is heard) -- never before. A room closed returns nothing more.

A gap or a new snapshot is read only while the room is live (heard): what the
subscription missed meanwhile is read once it holds again.
:class:`~chat_server.broker.shards.ShardedSubscriptions` places the subscription on
its node and reports its events here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from chat_server.broker.feed import Announce, Deliver, FeedAction, Jumped, RoomFeed
from chat_server.broker.room_life import (
    RoomEvent,
    RoomState,
    SubEvent,
    SubState,
    Then,
    room_step,
    sub_step,
)
from chat_server.messages import Message

__all__ = ["Ack", "Action", "Announce", "Deliver", "SharedRoom", "Then"]


@dataclass(frozen=True, slots=True)
class Ack:
    """Ack ``message`` to ``sender`` (the session that sent it; opaque here)."""

    message: Message
    sender: object


#: what a shared room returns: deliver, ack, announce, or start a read of the store
Action = Deliver | Ack | Announce | Then


class SharedRoom:
    """A room shared with other processes, as this process holds it."""

    __slots__ = (
        "_acks",
        "feed",
        "fill_delay_s",
        "filling",
        "in_use",
        "name",
        "state",
        "sub_lost",
        "sub_state",
        "waiters",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.feed = RoomFeed(name)
        self.state = RoomState.SUBSCRIBING
        #: its subscription on the node serving it
        self.sub_state = SubState.WANTED
        #: the subscription held once and was dropped since: what was missed must be read
        self.sub_lost = False
        #: joins waiting for the room to be ready
        self.waiters = 0
        #: the core holds members here (between :meth:`opened` and :meth:`closed_by_core`)
        self.in_use = False
        #: a gap is being read (beside whatever the state is)
        self.filling = False
        #: the wait before reading a gap again after a read failed (0: none failed)
        self.fill_delay_s = 0.0
        #: sends committed here, waiting for their message's delivery (``seq`` order)
        self._acks: deque[tuple[Message, object]] = deque()

    # ---- what the broker reads ----------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once released: nothing more is done for it."""
        return self.state is RoomState.CLOSED

    @property
    def live(self) -> bool:
        """True while its subscription is confirmed: the room's messages are heard."""
        return self.sub_state is SubState.CONFIRMED

    @property
    def ready(self) -> bool:
        """True once its first snapshot is applied: a join needs no wait."""
        return self.feed.synced

    @property
    def releasable(self) -> bool:
        """True when neither the core's members nor a waiting join hold it."""
        return not self.in_use and not self.waiters

    @property
    def acks_waiting(self) -> int:
        """Acks waiting for their message's delivery."""
        return len(self._acks)

    # ---- lifecycle ----------------------------------------------------------------------

    def subscribed(self) -> None:
        """Its first SSUBSCRIBE was confirmed: the opening reads the first snapshot."""
        self._step(RoomEvent.SUBSCRIBED)

    def subscription(self, event: SubEvent) -> list[Action]:
        """An event of its subscription; confirmed again after it was lost, what was missed
        must be read (a new snapshot opens the gap)."""
        self.sub_state, self.sub_lost, resubscribed = sub_step(self.sub_state, self.sub_lost, event)
        if not resubscribed or self.closed:
            return []
        then = self._step(RoomEvent.RESUBSCRIBED)
        return [then] if then is Then.READ_SNAPSHOT else []

    def snapshot_asked(self) -> tuple[int, int]:
        """A read of a snapshot starts: the feed's position, for :meth:`snapshot_taken`."""
        self._step(RoomEvent.SNAPSHOT_ASKED)
        return self.feed.position()

    def snapshot_taken(
        self,
        durable_seq: int,
        version: int,
        counts: Mapping[str, int],
        mine: Collection[str],
        stored_seq: int,
        *,
        asked_at: tuple[int, int],
    ) -> list[Action]:
        """Apply a snapshot read (see :meth:`RoomFeed.snapshot`); what follows."""
        if self.closed:
            return []
        out = self._settle(
            self.feed.snapshot(durable_seq, version, counts, mine, stored_seq, asked_at=asked_at)
        )
        then = self._step(RoomEvent.SNAPSHOT_TAKEN)
        self._after_feed(out)
        if then is Then.READ_SNAPSHOT:
            out.append(then)
        return out

    def released(self) -> None:
        """The broker dropped it (nothing holds it, or its opening failed)."""
        self._step(RoomEvent.RELEASED)

    def opened(self) -> None:
        """The core opened the room (its first member joined): keep it while it has members."""
        self.in_use = True

    def closed_by_core(self) -> list[Action]:
        """The core closed the room (its last member left; nothing more of it is delivered
        here): the waiting acks, all of them."""
        self.in_use = False
        return self.release_acks()

    def release_acks(self) -> list[Action]:
        """Every waiting ack, now (the room closed here, or the process is stopping)."""
        acks: list[Action] = [Ack(message, sender) for message, sender in self._acks]
        self._acks.clear()
        return acks

    # ---- what the subscription hears -----------------------------------------------------

    def messages(self, batch: list[Message]) -> list[Action]:
        """Messages heard on the room's channel."""
        if self.closed:
            return []
        out = self._settle(self.feed.messages(batch))
        self._after_heard(out)
        return out

    def durable(self, seq: int) -> list[Action]:
        """Messages up to ``seq`` became durable without being published."""
        if self.closed:
            return []
        self.feed.durable(seq)
        out: list[Action] = []
        self._after_heard(out)
        return out

    def presence(
        self, version: int, user: str, arrived: bool, count: int, by_me: bool
    ) -> list[Action]:
        """A change of the room's shared member set (see :meth:`RoomFeed.presence`)."""
        if self.closed:
            return []
        out = self._settle(self.feed.presence(version, user, arrived, count, by_me))
        self._after_heard(out)
        return out

    # ---- reading a gap --------------------------------------------------------------------

    @property
    def gap(self) -> tuple[int, int] | None:
        """``(after, upto)``: the seqs to read from the store, or None."""
        return self.feed.gap

    def fill_page(self, page: list[Message]) -> list[Action]:
        """A page of the gap read from the store (ascending; trimmed ones missing)."""
        if self.closed:
            return []
        return self._settle(self.feed.fill_page(page))

    def fill_done(self, upto: int) -> list[Action]:
        """The store holds nothing more up to ``upto``: close the gap."""
        if self.closed:
            return []
        return self._settle(self.feed.fill_done(upto))

    def fill_ended(self, delay_s: float) -> list[Action]:
        """A read of the gap ended (``delay_s``: the wait before the next one; 0 when it
        succeeded): start the next read the feed needs."""
        self.filling = False
        self.fill_delay_s = delay_s
        if self.closed:
            return []
        out: list[Action] = []
        self._after_feed(out)
        return out

    # ---- acks ----------------------------------------------------------------------------

    def committed(self, message: Message, sender: object) -> list[Action]:
        """A send of this room committed here: its ack now (the room is not delivered here,
        or its message already was), or once its message is delivered."""
        acks = self._acks
        if acks or (self.in_use and self.feed.last_seq < message.seq):
            acks.append((message, sender))
            return []
        return [Ack(message, sender)]

    # ---- inside ---------------------------------------------------------------------------

    def _step(self, event: RoomEvent) -> Then:
        self.state, then = room_step(self.state, event)
        return then

    def _settle(self, feed_actions: list[FeedAction]) -> list[Action]:
        """The feed's actions with the acks they complete, each right after its message
        (or after a jump past it); the jumps themselves are the room's own business."""
        acks = self._acks
        out: list[Action] = []
        for action in feed_actions:
            if isinstance(action, Deliver):
                out.append(action)
                if acks:
                    self._ack_upto(action.message.seq, out)
            elif isinstance(action, Jumped):
                if acks:
                    self._ack_upto(action.last_seq, out)
            else:
                out.append(action)
        return out

    def _ack_upto(self, seq: int, out: list[Action]) -> None:
        acks = self._acks
        while acks and acks[0][0].seq <= seq:
            message, sender = acks.popleft()
            out.append(Ack(message, sender))

    def _after_heard(self, out: list[Action]) -> None:
        if self.feed.gap is not None or self.feed.needs_snapshot:
            self._after_feed(out)

    def _after_feed(self, out: list[Action]) -> None:
        """The reads the feed asks for: its gap, or a new snapshot (while it is heard)."""
        feed = self.feed
        if self.sub_state is not SubState.CONFIRMED:
            return
        if feed.gap is not None and not self.filling:
            self.filling = True
            out.append(Then.READ_GAP)
        if feed.needs_snapshot and self._step(RoomEvent.VERSION_SKIPPED) is Then.READ_SNAPSHOT:
            out.append(Then.READ_SNAPSHOT)
