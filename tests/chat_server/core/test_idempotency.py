"""RecentSends: a send's ref as an idempotency key, driven with plain values (no server)."""

from __future__ import annotations

from chat_server.core.idempotency import RecentSends
from chat_server.messages import Message

WINDOW_MS = 60_000


def _send(body: str = "hello", ref: str = "r1", ts: int = 1_000, user: str = "alice") -> Message:
    return Message(room="lobby", seq=0, user=user, body=body, ts=ts, ref=ref)


def test_a_repeat_of_a_committed_send_gets_its_seq():
    recent = RecentSends(WINDOW_MS, 100)
    original = _send()
    recent.submitted(original)
    original.seq = 7
    assert recent.committed(original) == []
    repeat = recent.repeat_of(_send(ts=2_000))
    assert repeat is not None and repeat.seq == 7
    assert recent.repeats == 1


def test_another_body_another_user_or_room_is_a_new_send():
    recent = RecentSends(WINDOW_MS, 100)
    recent.submitted(_send())
    assert recent.repeat_of(_send(body="other")) is None
    assert recent.repeat_of(_send(user="bob")) is None
    other_room = _send()
    other_room.room = "elsewhere"
    assert recent.repeat_of(other_room) is None
    # a reused ref with another body is a send of its own: both are remembered
    recent.submitted(_send(body="other", ts=1_500))
    assert recent.repeat_of(_send(body="other")) is not None
    assert recent.repeat_of(_send()) is not None


def test_a_ref_reused_with_two_bodies_answers_each_with_its_own_seq():
    """The overlap an outside client found: two bodies under one ref in one batch were
    remembered as one record, so the second's repeat got the first's seq."""
    recent = RecentSends(WINDOW_MS, 100)
    first, second = _send(body="one"), _send(body="two")
    recent.submitted(first)
    recent.submitted(second)
    recent.repeat_of(_send(body="two")).wait("repeat of two")  # type: ignore[union-attr]
    first.seq, second.seq = 1, 2
    assert recent.committed(first) == []
    assert recent.committed(second) == ["repeat of two"]
    assert recent.repeat_of(_send(body="one")).seq == 1  # type: ignore[union-attr]
    assert recent.repeat_of(_send(body="two")).seq == 2  # type: ignore[union-attr]


def test_a_failed_body_is_not_acked_with_another_bodys_seq():
    recent = RecentSends(WINDOW_MS, 100)
    first, second = _send(body="one"), _send(body="two")
    recent.submitted(first)
    first.seq = 1
    recent.committed(first)
    recent.submitted(second)
    recent.repeat_of(_send(body="two")).wait("retry of two")  # type: ignore[union-attr]
    assert recent.failed(second) == ["retry of two"]
    assert recent.repeat_of(_send(body="two")) is None  # stored nowhere: a retry is new
    assert recent.repeat_of(_send(body="one")).seq == 1  # type: ignore[union-attr]


def test_a_send_in_flight_is_never_forgotten_by_the_bound():
    recent = RecentSends(WINDOW_MS, 2)
    waiting = _send(ref="slow")
    recent.submitted(waiting)
    recent.repeat_of(_send(ref="slow")).wait("repeat")  # type: ignore[union-attr]
    for i in range(5):
        other = _send(ref=f"r{i}", ts=1_000 + i)
        recent.submitted(other)
        other.seq = i + 1
        recent.committed(other)
    waiting.seq = 9
    assert recent.committed(waiting) == ["repeat"]


def test_a_repeat_in_flight_waits_for_the_original():
    recent = RecentSends(WINDOW_MS, 100)
    original = _send()
    recent.submitted(original)
    waiting = recent.repeat_of(_send())
    assert waiting is not None and waiting.seq == 0
    waiting.wait("second connection")
    original.seq = 3
    assert recent.committed(original) == ["second connection"]
    assert recent.repeat_of(_send()).seq == 3  # type: ignore[union-attr]


def test_a_failed_send_is_forgotten_and_its_waiters_told():
    recent = RecentSends(WINDOW_MS, 100)
    original = _send()
    recent.submitted(original)
    recent.repeat_of(_send()).wait("retry")  # type: ignore[union-attr]
    assert recent.failed(original) == ["retry"]
    assert recent.repeat_of(_send()) is None  # a later retry is a new send


def _committed(recent: RecentSends, message: Message, seq: int) -> None:
    recent.submitted(message)
    message.seq = seq
    recent.committed(message)


def test_the_window_and_the_bound_forget_the_oldest():
    recent = RecentSends(WINDOW_MS, 3)
    for i in range(3):
        _committed(recent, _send(ref=f"r{i}", ts=1_000 + i), i + 1)
    _committed(recent, _send(ref="r3", ts=1_010), 4)
    assert len(recent) == 3 and recent.repeat_of(_send(ref="r0")) is None
    _committed(recent, _send(ref="late", ts=1_010 + WINDOW_MS + 1), 5)
    assert len(recent) == 1 and recent.repeat_of(_send(ref="r3")) is None


def test_the_bound_counts_bodies_not_refs():
    recent = RecentSends(WINDOW_MS, 2)
    for i, body in enumerate(("a", "b", "c")):
        _committed(recent, _send(body=body, ts=1_000 + i), i + 1)
    assert len(recent) == 2
    assert recent.repeat_of(_send(body="a")) is None
    assert recent.repeat_of(_send(body="c")).seq == 3  # type: ignore[union-attr]


def test_loaded_sends_count_as_committed():
    recent = RecentSends(WINDOW_MS, 100)
    stored = _send()
    stored.seq = 41
    recent.load(stored)
    assert recent.repeat_of(_send()).seq == 41  # type: ignore[union-attr]


def test_window_zero_remembers_nothing():
    recent = RecentSends(0, 100)
    recent.submitted(_send())
    assert recent.repeat_of(_send()) is None and len(recent) == 0
