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
    # the reused ref now names the newer send
    recent.submitted(_send(body="other", ts=1_500))
    assert recent.repeat_of(_send(body="other")) is not None
    assert recent.repeat_of(_send()) is None


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


def test_the_window_and_the_bound_forget_the_oldest():
    recent = RecentSends(WINDOW_MS, 3)
    for i in range(3):
        recent.submitted(_send(ref=f"r{i}", ts=1_000 + i))
    recent.submitted(_send(ref="r3", ts=1_010))
    assert len(recent) == 3 and recent.repeat_of(_send(ref="r0")) is None
    recent.submitted(_send(ref="late", ts=1_010 + WINDOW_MS + 1))
    assert len(recent) == 1 and recent.repeat_of(_send(ref="r3")) is None


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
