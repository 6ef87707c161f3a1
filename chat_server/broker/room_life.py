"""A shared room's lifecycle in this process, as a table (``BROKER=redis``), with no I/O.

A room the broker holds goes ``SUBSCRIBING`` (a join asked for it: ``SSUBSCRIBE`` on its
node, waiting for the confirmation) -> ``SNAPSHOT`` (reading the room's seq, presence
version and members; the first one makes the feed start) -> ``LIVE`` (joins need no
wait; messages are delivered as heard) and back to ``SNAPSHOT`` when the feed must be
read again (its subscription came back after it was lost, or a presence version was
skipped); ``SNAPSHOT_STALE`` is a snapshot being read when the subscription came back
*again*: another is read after it. ``CLOSED`` is the end (the room released, or its
opening failed). Reading a gap of messages runs beside any of these (the feed asks for
it, :class:`~chat_server.broker.feed.RoomFeed`), as does the subscription's own
lifecycle on the node serving the room (:data:`SUB_TRANSITIONS`: wanted -> requested ->
confirmed, back to wanted when dropped); a subscription confirmed again after it was
lost is the room's ``RESUBSCRIBED``.

:func:`room_step` and :func:`sub_step` are the whole decision: the room's owner
(:class:`~chat_server.broker.shared_room.SharedRoom`) applies an event and returns what
follows (start reading a snapshot, or nothing), the way h11 keeps a connection's states;
:class:`~chat_server.broker.shards.ShardedSubscriptions` reports the subscription's
events to it.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "ROOM_TRANSITIONS",
    "SUB_TRANSITIONS",
    "RoomEvent",
    "RoomState",
    "SubEvent",
    "SubState",
    "Then",
    "room_step",
    "sub_step",
]


class RoomState(enum.Enum):
    """Where a shared room stands in this process."""

    #: a join asked for it: its SSUBSCRIBE is not confirmed yet
    SUBSCRIBING = "subscribing"
    #: a snapshot is being read (or retried, after a backoff, after a failed read)
    SNAPSHOT = "snapshot"
    #: a snapshot is being read and the subscription came back meanwhile: one more follows
    SNAPSHOT_STALE = "snapshot, stale"
    #: the feed is synced and no snapshot is being read
    LIVE = "live"
    #: released, or its opening failed: nothing more is done for it
    CLOSED = "closed"


class RoomEvent(enum.Enum):
    """What happens to a shared room."""

    #: its first SSUBSCRIBE was confirmed: read its first snapshot
    SUBSCRIBED = "subscribed"
    #: its subscription holds again after it was lost: what was missed must be read back
    RESUBSCRIBED = "resubscribed"
    #: the feed skipped a presence version (with the subscription holding)
    VERSION_SKIPPED = "version skipped"
    #: a read of a snapshot starts (the first, a new one, or a retry after a failed one)
    SNAPSHOT_ASKED = "snapshot asked"
    #: a snapshot was read and applied
    SNAPSHOT_TAKEN = "snapshot taken"
    #: the room was released, or its opening failed
    RELEASED = "released"


class Then(enum.Enum):
    """What the broker does after an event."""

    NOTHING = "nothing"
    #: start reading a snapshot (a task that retries with backoff while the room is held)
    READ_SNAPSHOT = "read a snapshot"
    #: start reading the feed's gap from the room's stream (beside the lifecycle: the
    #: room returns it, :class:`~chat_server.broker.shared_room.SharedRoom`)
    READ_GAP = "read the gap"


_S = RoomState
_E = RoomEvent
_NOTHING = Then.NOTHING
_READ = Then.READ_SNAPSHOT

#: (state, event) -> (next state, what to do); a pair not listed changes nothing
ROOM_TRANSITIONS: Final[dict[tuple[RoomState, RoomEvent], tuple[RoomState, Then]]] = {
    # the first snapshot is read by the opening itself
    (_S.SUBSCRIBING, _E.SUBSCRIBED): (_S.SNAPSHOT, _NOTHING),
    (_S.SNAPSHOT, _E.RESUBSCRIBED): (_S.SNAPSHOT_STALE, _NOTHING),
    (_S.SNAPSHOT, _E.SNAPSHOT_TAKEN): (_S.LIVE, _NOTHING),
    (_S.SNAPSHOT_STALE, _E.SNAPSHOT_TAKEN): (_S.SNAPSHOT, _READ),
    # a read that starts after the resubscription (a retry) covers it
    (_S.SNAPSHOT_STALE, _E.SNAPSHOT_ASKED): (_S.SNAPSHOT, _NOTHING),
    (_S.LIVE, _E.RESUBSCRIBED): (_S.SNAPSHOT, _READ),
    (_S.LIVE, _E.VERSION_SKIPPED): (_S.SNAPSHOT, _READ),
    (_S.SUBSCRIBING, _E.RELEASED): (_S.CLOSED, _NOTHING),
    (_S.SNAPSHOT, _E.RELEASED): (_S.CLOSED, _NOTHING),
    (_S.SNAPSHOT_STALE, _E.RELEASED): (_S.CLOSED, _NOTHING),
    (_S.LIVE, _E.RELEASED): (_S.CLOSED, _NOTHING),
}


def room_step(state: RoomState, event: RoomEvent) -> tuple[RoomState, Then]:
    """The room's next state after ``event``, and what the broker does then."""
    return ROOM_TRANSITIONS.get((state, event), (state, _NOTHING))


# ---- the room's subscription, on the node its link goes to --------------------------------


class SubState(enum.Enum):
    """Where one room's subscription stands on the node its link goes to."""

    #: placed on a node's link, no SSUBSCRIBE on its current connection (yet, or any more)
    WANTED = "wanted"
    #: an SSUBSCRIBE went out on the link's current connection
    REQUESTED = "requested"
    #: the node confirmed it: the room's messages are heard
    CONFIRMED = "confirmed"


class SubEvent(enum.Enum):
    """What happens to a subscription."""

    #: an SSUBSCRIBE was sent on the link's current connection
    SENT = "sent"
    #: the node confirmed the SSUBSCRIBE
    CONFIRMED = "confirmed"
    #: it ended without being asked to: the connection failed, the slot moved, or the room
    #: is placed on another node
    DROPPED = "dropped"


#: (state, event) -> the next state. Every pair is listed: a late confirmation counts, and
#: a drop from any state leaves the subscription wanted again
SUB_TRANSITIONS: dict[tuple[SubState, SubEvent], SubState] = {
    (SubState.WANTED, SubEvent.SENT): SubState.REQUESTED,
    (SubState.WANTED, SubEvent.CONFIRMED): SubState.CONFIRMED,
    (SubState.WANTED, SubEvent.DROPPED): SubState.WANTED,
    (SubState.REQUESTED, SubEvent.SENT): SubState.REQUESTED,
    (SubState.REQUESTED, SubEvent.CONFIRMED): SubState.CONFIRMED,
    (SubState.REQUESTED, SubEvent.DROPPED): SubState.WANTED,
    (SubState.CONFIRMED, SubEvent.SENT): SubState.CONFIRMED,
    (SubState.CONFIRMED, SubEvent.CONFIRMED): SubState.CONFIRMED,
    (SubState.CONFIRMED, SubEvent.DROPPED): SubState.WANTED,
}


def sub_step(state: SubState, lost: bool, event: SubEvent) -> tuple[SubState, bool, bool]:
    """One subscription event: the next state, whether what was published meanwhile must
    be read back (``lost``: it held once and was dropped since), and whether the owner is
    told the room holds again (it was lost and is confirmed now)."""
    after = SUB_TRANSITIONS[state, event]
    if event is SubEvent.DROPPED:
        return after, lost or state is SubState.CONFIRMED, False
    resubscribed = lost and state is not SubState.CONFIRMED and after is SubState.CONFIRMED
    return after, lost and not resubscribed, resubscribed
