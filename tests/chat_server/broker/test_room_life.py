"""A shared room's lifecycle and its subscription's, as tables, driven with plain values."""

from __future__ import annotations

import itertools

import pytest

from chat_server.broker.room_life import (
    ROOM_TRANSITIONS,
    SUB_TRANSITIONS,
    RoomEvent,
    RoomState,
    SubEvent,
    SubState,
    Then,
    room_step,
    sub_step,
)

S, E = RoomState, RoomEvent


def _run(state: RoomState, *events: RoomEvent) -> tuple[RoomState, list[Then]]:
    done = []
    for event in events:
        state, then = room_step(state, event)
        done.append(then)
    return state, done


def test_a_room_opens_subscribing_then_reading_its_first_snapshot_then_live():
    state, done = _run(S.SUBSCRIBING, E.SUBSCRIBED, E.SNAPSHOT_ASKED, E.SNAPSHOT_TAKEN)
    assert state is S.LIVE
    assert done == [Then.NOTHING] * 3  # the opening reads the first snapshot itself


def test_a_live_room_reads_a_snapshot_again_when_its_subscription_came_back():
    assert room_step(S.LIVE, E.RESUBSCRIBED) == (S.SNAPSHOT, Then.READ_SNAPSHOT)
    assert room_step(S.LIVE, E.VERSION_SKIPPED) == (S.SNAPSHOT, Then.READ_SNAPSHOT)


def test_a_resubscription_during_a_snapshot_reads_one_more_after_it():
    state, done = _run(S.SNAPSHOT, E.RESUBSCRIBED, E.RESUBSCRIBED, E.SNAPSHOT_TAKEN)
    assert (state, done) == (S.SNAPSHOT, [Then.NOTHING, Then.NOTHING, Then.READ_SNAPSHOT])
    state, done = _run(state, E.SNAPSHOT_ASKED, E.SNAPSHOT_TAKEN)
    assert (state, done) == (S.LIVE, [Then.NOTHING, Then.NOTHING])


def test_a_retry_that_starts_after_the_resubscription_covers_it():
    state, done = _run(S.SNAPSHOT_STALE, E.SNAPSHOT_ASKED, E.SNAPSHOT_TAKEN)
    assert (state, done) == (S.LIVE, [Then.NOTHING, Then.NOTHING])


def test_nothing_more_is_read_while_a_snapshot_is_read_or_before_the_first():
    assert room_step(S.SNAPSHOT, E.VERSION_SKIPPED) == (S.SNAPSHOT, Then.NOTHING)
    assert room_step(S.SUBSCRIBING, E.RESUBSCRIBED) == (S.SUBSCRIBING, Then.NOTHING)


@pytest.mark.parametrize("state", [s for s in RoomState if s is not S.CLOSED])
def test_released_closes_from_every_state(state):
    assert room_step(state, E.RELEASED) == (S.CLOSED, Then.NOTHING)


@pytest.mark.parametrize("event", list(RoomEvent))
def test_a_closed_room_stays_closed_and_does_nothing(event):
    assert room_step(S.CLOSED, event) == (S.CLOSED, Then.NOTHING)


def test_a_snapshot_read_is_started_only_into_the_snapshot_state():
    # one read at a time: whatever starts one leaves the room reading it
    for (state, event), (after, then) in ROOM_TRANSITIONS.items():
        if then is Then.READ_SNAPSHOT:
            assert after is S.SNAPSHOT, (state, event)
            assert state in (S.LIVE, S.SNAPSHOT_STALE), (state, event)


def test_the_subscription_table_is_total():
    assert set(SUB_TRANSITIONS) == set(itertools.product(SubState, SubEvent))


def test_a_subscription_lost_after_it_held_is_reported_once_it_holds_again():
    state, lost = SubState.WANTED, False
    state, lost, told = sub_step(state, lost, SubEvent.SENT)
    state, lost, told = sub_step(state, lost, SubEvent.CONFIRMED)
    assert (state, lost, told) == (SubState.CONFIRMED, False, False)  # the first: not "again"
    state, lost, told = sub_step(state, lost, SubEvent.DROPPED)
    assert (state, lost, told) == (SubState.WANTED, True, False)
    state, lost, told = sub_step(state, lost, SubEvent.SENT)
    state, lost, told = sub_step(state, lost, SubEvent.DROPPED)  # lost again before confirmed
    assert (state, lost, told) == (SubState.WANTED, True, False)
    state, lost, told = sub_step(*sub_step(state, lost, SubEvent.SENT)[:2], SubEvent.CONFIRMED)
    assert (state, lost, told) == (SubState.CONFIRMED, False, True)


def test_a_subscription_dropped_before_it_held_missed_nothing():
    state, lost, told = sub_step(SubState.REQUESTED, False, SubEvent.DROPPED)
    assert (state, lost, told) == (SubState.WANTED, False, False)
