"""One subscribed room's feed from a shared broker, in order, with no I/O.

A process that shares rooms with other processes (``BROKER=redis``) hears of a
room's committed messages and presence changes from the broker, which may lose
some (a dropped pub/sub connection) or repeat some (a message published while
the subscription was being set up is also in the room's snapshot). A
:class:`RoomFeed` turns what arrives into what the core may act on, and *returns* it
as values (:data:`FeedAction`: :class:`Deliver`, :class:`Jumped`, :class:`Announce`, in
the order they happen); it calls nothing:

- messages are delivered in ``seq`` order, each exactly once: ``seq <=
  last_seq`` is a duplicate and dropped; a ``seq`` beyond ``last_seq + 1``
  opens a *gap*, and everything after it is held until the caller has read the
  gap from the durable store (:meth:`fill_page`, then :meth:`fill_done`); past
  :data:`HELD_MAX` held messages the feed lets them go and widens the gap over them
  instead (they are durable: published only once they were), so a gap that takes
  long to read holds a bounded amount of memory;
- presence changes carry the room's presence ``version``: old ones are
  dropped, one that skips a version makes the feed ask for a new snapshot
  (:attr:`needs_snapshot`), and a snapshot replaces the member set, announcing
  the differences;
- until the first :meth:`snapshot` nothing is delivered: the snapshot fixes the
  ``seq`` the feed starts from.

``last_seq`` is always the last ``seq`` delivered in this process, which is what
``joined.last_seq`` and the replay seam need. The feed is one part of a shared room's
state; its owner, :class:`~chat_server.broker.shared_room.SharedRoom`, settles the acks
waiting for what it delivers, and the broker does the I/O (subscribing, snapshots,
reading gaps) and applies the actions.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from chat_server.messages import Message

log = logging.getLogger("chat_server.broker")

#: messages a synced feed holds behind a gap at most; past it they are read back instead
HELD_MAX = 10_000


@dataclass(frozen=True, slots=True)
class Deliver:
    """Deliver ``message`` to the room's local members (returned in ``seq`` order)."""

    message: Message


@dataclass(frozen=True, slots=True)
class Jumped:
    """The room's ``last_seq`` moved to ``last_seq`` without a delivery (trimmed history,
    a reset)."""

    last_seq: int


@dataclass(frozen=True, slots=True)
class Announce:
    """``user`` appeared in (``present``) or vanished from the members held elsewhere."""

    user: str
    present: bool


#: what the feed returns: what the room's local members must hear, in order
FeedAction = Deliver | Jumped | Announce


class RoomFeed:
    """A room's messages and shared member set, as one process has applied them."""

    __slots__ = (
        "_held",
        "_held_presence",
        "counts",
        "fill_upto",
        "last_seq",
        "members",
        "mine",
        "needs_snapshot",
        "room",
        "synced",
        "version",
    )

    def __init__(self, room: str) -> None:
        self.room = room
        #: False until the first snapshot: everything that arrives is held
        self.synced = False
        #: the last seq delivered in this process
        self.last_seq = 0
        #: the gap to read from the store is (last_seq, fill_upto] while fill_upto > last_seq
        self.fill_upto = 0
        #: the shared member set as of ``version``: for each user, how many processes
        #: hold it, and the users Redis has this process holding
        self.counts: dict[str, int] = {}
        self.mine: set[str] = set()
        #: the users some *other* process holds (``counts`` less this process' own
        #: holding): what the core adds to its local users to make the room's view.
        #: Counting this process' own holding too would let the echo of its own
        #: presence write, heard after the user already left here, show the user again.
        self.members: dict[str, None] = {}
        self.version = 0
        #: a presence change skipped a version: the caller should take a new snapshot
        self.needs_snapshot = False
        self._held: list[Message] = []
        self._held_presence: list[tuple[int, str, bool, int, bool]] = []

    @property
    def gap(self) -> tuple[int, int] | None:
        """``(after, upto)``: the seqs the caller must read from the store, or None."""
        if self.synced and self.fill_upto > self.last_seq:
            return self.last_seq, self.fill_upto
        return None

    @property
    def held(self) -> int:
        """Messages held (behind a gap, or before the first snapshot): at most
        :data:`HELD_MAX` once synced."""
        return len(self._held)

    # ---- snapshots ---------------------------------------------------------------------

    def position(self) -> tuple[int, int]:
        """``(last_seq, version)`` applied so far: what a snapshot asked for now must reach."""
        return self.last_seq, self.version

    def snapshot(
        self,
        last_seq: int,
        version: int,
        counts: Mapping[str, int],
        mine: Collection[str],
        stored_seq: int | None = None,
        *,
        asked_at: tuple[int, int] | None = None,
    ) -> list[FeedAction]:
        """Apply the room's state read after subscribing (or resubscribing); what follows.

        ``last_seq`` is the room's durable seq, ``stored_seq`` (default: the same) its
        last stored one. The first snapshot sets where delivery starts; a later one
        opens a gap up to ``last_seq`` if messages were missed. The member set is
        replaced and its differences announced.

        ``asked_at`` is :meth:`position` when the snapshot was asked for (None: now).
        The snapshot was read at some moment after that, so it holds at least that
        much; the feed may have gone further meanwhile on what the subscription
        heard, and a snapshot behind that is older, not a loss: its ``seq`` then opens
        no gap and its member set does not replace the newer one. A durable seq below
        what was delivered here (a durable mark lost in a failover) opens no gap
        either. Only a stored seq behind ``asked_at`` means the room went back (Redis
        lost data): delivery continues from the durable seq.
        """
        out: list[FeedAction] = []
        stored = last_seq if stored_seq is None else stored_seq
        asked_seq, asked_version = self.position() if asked_at is None else asked_at
        if not self.synced:
            self.synced = True
            self.last_seq = self.fill_upto = last_seq
        elif stored < asked_seq:
            log.error(
                "room %s: the shared store's seq went back from %d to %d (Redis lost data?); "
                "continuing from %d",
                self.room,
                asked_seq,
                stored,
                last_seq,
            )
            jumped_from = self.last_seq
            self.last_seq = self.fill_upto = last_seq
            self._held.clear()
            out.append(Jumped(jumped_from))
        else:
            self.fill_upto = max(self.fill_upto, last_seq)
        if not asked_version <= version < self.version:  # else the live set is newer
            self._replace_members(version, counts, mine, out)
        self.needs_snapshot = False
        held, self._held_presence = self._held_presence, []
        for change in held:
            self._presence(change, out)
        self._release_held(out)
        return out

    def _replace_members(
        self,
        version: int,
        counts: Mapping[str, int],
        mine: Collection[str],
        out: list[FeedAction],
    ) -> None:
        """Take a snapshot's member set as of ``version``, announcing the differences."""
        old = self.members
        self.counts = {user: count for user, count in counts.items() if count > 0}
        self.mine = set(mine)
        self.members = dict.fromkeys(user for user in self.counts if self._elsewhere(user))
        self.version = version
        for user in old:
            if user not in self.members:
                out.append(Announce(user, False))
        for user in self.members:
            if user not in old:
                out.append(Announce(user, True))

    # ---- messages --------------------------------------------------------------------

    def messages(self, batch: list[Message]) -> list[FeedAction]:
        """Deliver what follows ``last_seq`` in order; drop duplicates; hold after a gap."""
        out: list[FeedAction] = []
        if not self.synced or self.fill_upto > self.last_seq:
            self._held.extend(batch)
            if self.synced and len(self._held) > HELD_MAX:
                self.fill_upto = max(self.fill_upto, *(m.seq for m in self._held))
                self._held.clear()
            return out
        self._run(batch, out)
        return out

    def durable(self, seq: int) -> None:
        """Messages up to ``seq`` became durable without being published: read them back."""
        if self.synced and seq > self.fill_upto:
            self.fill_upto = seq

    def fill_page(self, page: list[Message]) -> list[FeedAction]:
        """Deliver messages read from the store for the gap (ascending; trimmed ones missing)."""
        out: list[FeedAction] = []
        for message in page:
            if self.last_seq < message.seq <= self.fill_upto:
                self.last_seq = message.seq
                out.append(Deliver(message))
        return out

    def fill_done(self, upto: int) -> list[FeedAction]:
        """The store holds nothing more up to ``upto``: close the gap, release what was held."""
        out: list[FeedAction] = []
        if upto > self.last_seq:
            self.last_seq = upto
            out.append(Jumped(upto))
        self._release_held(out)
        return out

    def _release_held(self, out: list[FeedAction]) -> None:
        if self._held and self.fill_upto <= self.last_seq:
            held, self._held = self._held, []
            self._run(held, out)

    def _run(self, batch: list[Message], out: list[FeedAction]) -> None:
        for i, message in enumerate(batch):
            seq = message.seq
            if seq <= self.last_seq:
                continue
            if seq != self.last_seq + 1:
                self.fill_upto = seq - 1
                self._held.extend(batch[i:])
                return
            self.last_seq = self.fill_upto = seq
            out.append(Deliver(message))

    # ---- presence ---------------------------------------------------------------------

    def presence(
        self, version: int, user: str, arrived: bool, count: int, by_me: bool
    ) -> list[FeedAction]:
        """Apply one change of the shared member set, in version order: a process
        (``by_me``: this one) began (``arrived``) or stopped holding ``user``, leaving
        ``count`` processes holding it. Announced when that changes whether some other
        process holds the user."""
        out: list[FeedAction] = []
        self._presence((version, user, arrived, count, by_me), out)
        return out

    def _presence(self, change: tuple[int, str, bool, int, bool], out: list[FeedAction]) -> None:
        version, user, arrived, count, by_me = change
        if not self.synced or self.needs_snapshot:
            self._held_presence.append(change)
            return
        if version <= self.version:
            return
        if version != self.version + 1:
            self.needs_snapshot = True
            self._held_presence.append(change)
            return
        self.version = version
        if count > 0:
            self.counts[user] = count
        else:
            self.counts.pop(user, None)
        if by_me:
            if arrived:
                self.mine.add(user)
            else:
                self.mine.discard(user)
        elsewhere = self._elsewhere(user)
        if elsewhere and user not in self.members:
            self.members[user] = None
            out.append(Announce(user, True))
        elif not elsewhere and user in self.members:
            del self.members[user]
            out.append(Announce(user, False))

    def _elsewhere(self, user: str) -> bool:
        """True when a process other than this one holds ``user``."""
        return self.counts.get(user, 0) - (user in self.mine) > 0
