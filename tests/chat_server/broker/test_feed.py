"""RoomFeed without Redis: seq order, duplicates, gaps filled from the store, presence versions."""

from __future__ import annotations

from typing import Any

from chat_server.broker.feed import HELD_MAX, Deliver, FeedAction, Jumped, RoomFeed
from chat_server.messages import Message


def msg(seq: int, room: str = "r") -> Message:
    return Message(room=room, seq=seq, user="u", body=f"m{seq}", ts=1)


class Recorder:
    """What the feed returns, recorded by kind."""

    def __init__(self) -> None:
        self.delivered: list[int] = []
        self.jumps: list[int] = []
        self.announced: list[tuple[str, bool]] = []

    def feed(self) -> Any:
        return _Recording(RoomFeed("r"), self)

    def take(self, actions: list[FeedAction]) -> None:
        for action in actions:
            if isinstance(action, Deliver):
                self.delivered.append(action.message.seq)
            elif isinstance(action, Jumped):
                self.jumps.append(action.last_seq)
            else:
                self.announced.append((action.user, action.present))


class _Recording:
    """A feed whose returned actions go to a :class:`Recorder` (its state read through)."""

    def __init__(self, feed: RoomFeed, recorder: Recorder) -> None:
        self._feed = feed
        self._recorder = recorder

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._feed, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            if isinstance(result, list):
                self._recorder.take(result)
            return result

        return call


def test_nothing_is_delivered_before_the_snapshot_and_duplicates_are_dropped():
    rec = Recorder()
    feed = rec.feed()
    feed.messages([msg(4), msg(5)])  # heard while subscribing: 4 was already in the snapshot
    assert rec.delivered == []
    feed.snapshot(4, 0, {}, ())
    assert rec.delivered == [5]
    feed.messages([msg(5), msg(6)])
    assert rec.delivered == [5, 6]
    assert feed.last_seq == 6 and feed.gap is None


def test_a_gap_holds_later_messages_until_it_is_filled_from_the_store():
    rec = Recorder()
    feed = rec.feed()
    feed.snapshot(2, 0, {}, ())
    feed.messages([msg(5), msg(6)])  # 3 and 4 were missed
    assert rec.delivered == [] and feed.gap == (2, 4)
    feed.messages([msg(7)])  # still held behind the gap
    feed.fill_page([msg(3), msg(4)])
    assert rec.delivered == [3, 4]
    feed.fill_done(4)
    assert rec.delivered == [3, 4, 5, 6, 7]
    assert feed.gap is None and feed.last_seq == 7


def test_a_gap_that_takes_long_holds_at_most_held_max_then_reads_the_rest_back():
    """A gap whose read keeps failing (its node unreachable) while the room goes on: the
    feed lets go of what it held past HELD_MAX and widens the gap instead; filled, every
    message is delivered once, in order."""
    rec = Recorder()
    feed = rec.feed()
    feed.snapshot(2, 0, {}, ())
    later = [msg(seq) for seq in range(5, 5 + HELD_MAX + 1)]
    for message in later:
        feed.messages([message])
    assert feed.held <= HELD_MAX
    assert rec.delivered == [] and feed.gap == (2, later[-1].seq)
    feed.messages([msg(later[-1].seq + 1)])  # heard after letting go: held again
    feed.fill_page([msg(3), msg(4), *later])  # read back from the stream
    feed.fill_done(later[-1].seq)
    assert rec.delivered == list(range(3, later[-1].seq + 2))


def test_a_gap_the_store_no_longer_holds_is_jumped_over():
    rec = Recorder()
    feed = rec.feed()
    feed.snapshot(1, 0, {}, ())
    feed.messages([msg(10)])
    feed.fill_page([msg(8), msg(9)])  # 2..7 were trimmed (HISTORY_MAX)
    feed.fill_done(9)
    assert rec.delivered == [8, 9, 10]
    rec.delivered.clear()
    feed.messages([msg(13)])
    feed.fill_done(12)  # nothing at all left of 11..12
    assert rec.jumps == [12] and rec.delivered == [13]


def test_a_resnapshot_after_a_reconnect_opens_the_gap_of_what_was_missed():
    rec = Recorder()
    feed = rec.feed()
    feed.snapshot(3, 0, {}, ())
    feed.snapshot(6, 0, {}, ())  # published while the connection was down
    assert feed.gap == (3, 6)
    feed.messages([msg(7)])
    feed.fill_page([msg(4), msg(5), msg(6)])
    feed.fill_done(6)
    assert rec.delivered == [4, 5, 6, 7]


def test_a_resnapshot_older_than_what_was_heard_meanwhile_delivers_nothing_twice():
    # the subscription moved to the slot's new node and heard 50 there before the reply
    # of the snapshot asked for at 49 came back: read before 50 was committed, it says 49
    rec = Recorder()
    feed = rec.feed()
    feed.snapshot(48, 0, {}, ())
    feed.messages([msg(49)])
    asked_at = feed.position()
    feed.messages([msg(50)])
    feed.snapshot(49, 0, {}, (), asked_at=asked_at)
    assert feed.gap is None and rec.jumps == []
    feed.messages([msg(51), msg(52)])
    assert rec.delivered == [49, 50, 51, 52]


def test_a_resnapshot_behind_what_was_delivered_when_it_was_asked_for_goes_back():
    rec = Recorder()
    feed = rec.feed()
    feed.snapshot(9, 0, {}, ())
    asked_at = feed.position()
    feed.snapshot(7, 0, {}, (), asked_at=asked_at)  # Redis lost 8 and 9
    assert feed.last_seq == 7 and rec.jumps == [9]
    feed.messages([msg(8)])
    assert rec.delivered == [8]


def test_a_resnapshot_older_than_the_presence_heard_meanwhile_keeps_the_newer_members():
    rec = Recorder()
    feed = rec.feed()
    feed.snapshot(0, 1, {"bob": 1}, ())
    asked_at = feed.position()
    feed.presence(2, "carol", True, 1, False)  # heard before the snapshot's reply
    feed.snapshot(0, 1, {"bob": 1}, (), asked_at=asked_at)
    assert rec.announced == [("bob", True), ("carol", True)]
    assert list(feed.members) == ["bob", "carol"] and feed.version == 2
    feed.presence(3, "bob", False, 0, False)
    assert not feed.needs_snapshot and rec.announced[-1] == ("bob", False)


def test_presence_applies_in_version_order_and_a_skip_asks_for_a_snapshot():
    rec = Recorder()
    feed = rec.feed()
    feed.presence(1, "early", True, 1, False)  # before the snapshot: held, dropped as old
    feed.snapshot(0, 1, {"early": 1}, ())
    assert rec.announced == [("early", True)]
    feed.presence(2, "bob", True, 1, False)
    feed.presence(2, "bob", True, 1, False)  # a duplicate
    assert rec.announced[1:] == [("bob", True)]
    feed.presence(4, "carol", True, 1, False)  # version 3 was missed
    assert feed.needs_snapshot and "carol" not in feed.members
    feed.snapshot(0, 3, {"early": 1}, ())  # bob left at version 3
    assert rec.announced[2:] == [("bob", False), ("carol", True)]
    assert list(feed.members) == ["early", "carol"] and feed.version == 4


def test_the_echo_of_this_process_own_presence_writes_announces_nothing():
    # bob joined and left here before the echo of his join came back: the view (the
    # core's local users plus the users *other* processes hold) never had him twice
    rec = Recorder()
    feed = rec.feed()
    feed.snapshot(0, 0, {}, ())
    feed.presence(1, "bob", True, 1, True)
    feed.presence(2, "bob", False, 0, True)
    assert rec.announced == [] and "bob" not in feed.members and not feed.mine


def test_a_user_held_here_and_elsewhere_is_announced_by_the_other_process_only():
    rec = Recorder()
    feed = rec.feed()
    feed.snapshot(0, 0, {}, ())
    feed.presence(1, "bob", True, 1, True)  # bob's first connection is here
    feed.presence(2, "bob", True, 2, False)  # and another process's
    assert rec.announced == [("bob", True)]  # held elsewhere now (the core: local too)
    feed.presence(3, "bob", False, 1, True)  # bob left here: still held elsewhere
    assert rec.announced == [("bob", True)] and "bob" in feed.members
    feed.presence(4, "bob", False, 0, False)  # and left there
    assert rec.announced == [("bob", True), ("bob", False)] and not feed.members


def test_a_snapshot_counts_only_what_other_processes_hold():
    rec = Recorder()
    feed = rec.feed()
    feed.snapshot(0, 5, {"alice": 1, "bob": 2, "carol": 1}, {"alice", "bob"})
    assert list(feed.members) == ["bob", "carol"]
    assert rec.announced == [("bob", True), ("carol", True)]
    feed.presence(6, "bob", False, 1, False)  # the other process let bob go: only here now
    assert "bob" not in feed.members and rec.announced[-1] == ("bob", False)
