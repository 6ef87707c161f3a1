"""A shared room's one owner, driven with plain values: what it returns, and its invariants
over random interleavings of subscription, messages, acks and closing."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from chat_server.broker.room_life import RoomState, SubEvent
from chat_server.broker.shared_room import Ack, Action, Announce, Deliver, SharedRoom, Then
from chat_server.messages import Message


def msg(seq: int) -> Message:
    return Message(room="r", seq=seq, user="u", body=f"m{seq}", ts=1)


def live_room(last_seq: int = 0) -> SharedRoom:
    """A room subscribed, its first snapshot at ``last_seq`` applied, opened by the core."""
    room = SharedRoom("r")
    assert room.subscription(SubEvent.SENT) == []
    assert room.subscription(SubEvent.CONFIRMED) == []  # the first: nothing was missed
    room.subscribed()
    asked_at = room.snapshot_asked()
    assert room.snapshot_taken(last_seq, 0, {}, (), last_seq, asked_at=asked_at) == []
    room.opened()
    assert room.state is RoomState.LIVE and room.ready and room.live
    return room


def seqs(actions: list[Action]) -> list[tuple[str, int]]:
    """The actions as ("deliver" | "ack", seq) pairs, reads and announcements by name."""
    out: list[tuple[str, int]] = []
    for action in actions:
        if isinstance(action, Deliver):
            out.append(("deliver", action.message.seq))
        elif isinstance(action, Ack):
            out.append(("ack", action.message.seq))
        elif isinstance(action, Announce):
            out.append((f"announce {action.user} {action.present}", 0))
        else:
            out.append((action.value, 0))
    return out


def test_an_ack_waits_for_its_message_and_comes_right_after_it():
    room = live_room(3)
    assert room.committed(msg(4), "alice") == []  # committed here, not heard back yet
    assert room.acks_waiting == 1
    assert seqs(room.messages([msg(4), msg(5)])) == [
        ("deliver", 4),
        ("ack", 4),
        ("deliver", 5),
    ]
    assert room.acks_waiting == 0


def test_an_ack_is_returned_at_once_when_its_message_was_heard_first_or_the_core_has_no_members():
    room = live_room(3)
    room.messages([msg(4)])
    assert room.committed(msg(4), "alice") == [Ack(msg(4), "alice")]  # heard before reported
    closed_here = SharedRoom("s")  # prepared, but the core holds no member there
    assert closed_here.committed(msg(1), "bob") == [Ack(msg(1), "bob")]


def test_acks_behind_a_gap_come_with_the_messages_read_back_from_the_store():
    room = live_room(2)
    room.committed(msg(4), "alice")
    assert seqs(room.messages([msg(5)])) == [("read the gap", 0)]  # 3, 4 missed
    assert room.filling and room.gap == (2, 4)
    assert seqs(room.messages([msg(6)])) == []  # held; the gap is being read
    assert seqs(room.fill_page([msg(3), msg(4)])) == [("deliver", 3), ("deliver", 4), ("ack", 4)]
    assert seqs(room.fill_done(4)) == [("deliver", 5), ("deliver", 6)]
    assert room.fill_ended(0.0) == [] and not room.filling


def test_a_gap_the_store_no_longer_holds_acks_what_it_jumped_over():
    room = live_room(1)
    room.committed(msg(3), "alice")
    room.messages([msg(5)])
    assert seqs(room.fill_page([])) == []  # 2..4 trimmed (HISTORY_MAX)
    assert seqs(room.fill_done(4)) == [("ack", 3), ("deliver", 5)]


def test_no_gap_is_read_while_the_subscription_is_lost():
    room = live_room(2)
    assert room.subscription(SubEvent.DROPPED) == [] and not room.live
    assert room.messages([msg(5)]) == []  # heard from the old node a moment after the drop
    assert not room.filling
    # the subscription holds again: a snapshot first, then the gap
    assert room.subscription(SubEvent.SENT) == []
    assert room.subscription(SubEvent.CONFIRMED) == [Then.READ_SNAPSHOT]
    asked_at = room.snapshot_asked()
    taken = room.snapshot_taken(6, 0, {}, (), 6, asked_at=asked_at)
    assert taken == [Then.READ_GAP] and room.gap == (2, 6)


def test_a_failed_gap_read_is_tried_again_with_its_wait_kept():
    room = live_room(2)
    room.messages([msg(5)])
    assert room.fill_ended(0.5) == [Then.READ_GAP]
    assert room.filling and room.fill_delay_s == 0.5


def test_a_skipped_presence_version_reads_a_snapshot_and_announces_from_it():
    room = live_room(0)
    assert seqs(room.presence(1, "bob", True, 1, False)) == [("announce bob True", 0)]
    assert room.presence(3, "carol", True, 1, False) == [Then.READ_SNAPSHOT]
    asked_at = room.snapshot_asked()
    taken = room.snapshot_taken(0, 3, {"bob": 1, "carol": 1}, (), 0, asked_at=asked_at)
    assert seqs(taken) == [("announce carol True", 0)]
    assert room.state is RoomState.LIVE


def test_the_core_closing_the_room_returns_every_waiting_ack_and_a_released_room_is_silent():
    room = live_room(1)
    room.committed(msg(2), "alice")
    room.committed(msg(3), "bob")
    assert room.closed_by_core() == [Ack(msg(2), "alice"), Ack(msg(3), "bob")]
    assert room.releasable and room.acks_waiting == 0
    room.released()
    assert room.closed
    assert room.messages([msg(2)]) == []
    room.subscription(SubEvent.DROPPED)
    room.subscription(SubEvent.CONFIRMED)
    assert room.fill_done(9) == [] and room.gap is None


def test_a_room_a_join_still_waits_for_is_not_releasable():
    room = live_room(1)
    room.waiters = 1
    room.closed_by_core()
    assert not room.releasable


# ---- random interleavings ------------------------------------------------------------------

EVENTS = (
    "commit_here",
    "commit_elsewhere",
    "hear",
    "report",
    "lose",
    "confirm",
    "snapshot_ask",
    "snapshot_take",
    "fill",
    "fill_fails",
    "close",
)


@dataclass
class World:
    """The room's store and channel around one :class:`SharedRoom`, and what it returned."""

    room: SharedRoom
    store_seq: int
    first_seq: int
    live: bool = True
    closed: bool = False
    #: published, not heard yet (lost when the subscription is)
    unheard: list[int] = field(default_factory=list)
    #: committed here, the store's report of it not handled yet
    unreported: list[int] = field(default_factory=list)
    reported: list[int] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)
    acked: list[int] = field(default_factory=list)
    #: snapshot reads started: None until asked, then (asked_at, the seq read)
    snapshots: list[tuple[tuple[int, int], int] | None] = field(default_factory=list)
    fills: int = 0

    def take(self, actions: list[Action], *, closing: bool = False) -> None:
        """Record what the room returned, checking each action against what came before."""
        if self.closed:
            assert actions == [], "a closed room returned something"
        for action in actions:
            if isinstance(action, Deliver):
                seq = action.message.seq
                assert not self.delivered or seq > self.delivered[-1], "delivered twice"
                assert seq <= self.store_seq, "delivered before it was committed"
                self.delivered.append(seq)
            elif isinstance(action, Ack):
                seq = action.message.seq
                assert seq in self.reported, "acked before the store reported the commit"
                assert seq not in self.acked, "acked twice"
                # before its message is delivered here only when nothing more is heard
                assert closing or seq in self.delivered, "acked before its message"
                self.acked.append(seq)
            elif action is Then.READ_GAP:
                self.fills += 1
            elif action is Then.READ_SNAPSHOT:
                self.snapshots.append(None)

    def step(self, event: str) -> None:
        room = self.room
        assert room.live == self.live
        if event in {"commit_here", "commit_elsewhere"}:
            self.store_seq += 1
            if self.live:
                self.unheard.append(self.store_seq)
            if event == "commit_here":
                self.unreported.append(self.store_seq)
        elif event == "hear" and self.unheard:
            self.take(room.messages([msg(self.unheard.pop(0))]))
        elif event == "report" and self.unreported:
            seq = self.unreported.pop(0)
            self.reported.append(seq)
            if self.closed:  # the broker dropped the room: acked at once
                self.acked.append(seq)
            else:
                self.take(room.committed(msg(seq), seq))
        elif event == "lose" and self.live:
            self.live = False
            self.unheard.clear()
            self.take(room.subscription(SubEvent.DROPPED))
        elif event == "confirm" and not self.live:
            self.live = True
            self.take(room.subscription(SubEvent.SENT))
            self.take(room.subscription(SubEvent.CONFIRMED))
        elif event == "snapshot_ask" and None in self.snapshots:
            asked_at = room.snapshot_asked()
            self.snapshots[self.snapshots.index(None)] = (asked_at, self.store_seq)
        elif event == "snapshot_take" and any(self.snapshots):
            asked = next(s for s in self.snapshots if s is not None)
            self.snapshots.remove(asked)
            asked_at, seq = asked
            self.take(room.snapshot_taken(seq, 0, {}, (), seq, asked_at=asked_at))
        elif event == "fill" and self.fills:
            self.fills -= 1
            while (gap := room.gap) is not None and not room.closed:
                after, upto = gap
                self.take(room.fill_page([msg(s) for s in range(after + 1, upto + 1)]))
                self.take(room.fill_done(upto))
            self.take(room.fill_ended(0.0))
        elif event == "fill_fails" and self.fills:
            self.fills -= 1
            self.take(room.fill_ended(0.1))
        elif event == "close" and not self.closed:
            self.take(room.closed_by_core(), closing=True)
            assert room.acks_waiting == 0, "acks held after the room closed"
            room.released()
            self.closed = True

    def settle(self) -> None:
        """Let every pending thing happen (the subscription holding again)."""
        self.step("confirm")
        for _ in range(100):
            if self.unheard:
                self.step("hear")
            elif self.unreported:
                self.step("report")
            elif None in self.snapshots:
                self.step("snapshot_ask")
            elif self.snapshots:
                self.step("snapshot_take")
            elif self.fills:
                self.step("fill")
            else:
                return
        raise AssertionError("the room did not settle")


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 3), st.lists(st.sampled_from(EVENTS), max_size=80))
def test_random_interleavings_deliver_each_message_once_and_ack_only_after_it(
    first_seq: int, events: list[str]
) -> None:
    world = World(live_room(first_seq), store_seq=first_seq, first_seq=first_seq)
    for event in events:
        world.step(event)
    world.settle()
    if world.closed:
        assert world.room.acks_waiting == 0
        assert sorted(world.acked) == sorted(world.reported)  # every ack, once
        return
    everything = list(range(first_seq + 1, world.store_seq + 1))
    assert world.delivered == everything  # nothing missed, nothing twice, in order
    assert world.acked == world.reported  # every ack, once, in commit order
    assert world.room.acks_waiting == 0
    assert world.room.state is RoomState.LIVE
