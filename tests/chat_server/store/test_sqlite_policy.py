"""The SQLite history's decisions with plain numbers: when to hand over, where to commit."""

from __future__ import annotations

import inspect

import pytest

from chat_server.settings import SPECS, Settings
from chat_server.store.sqlite import SqliteHistoryStore
from chat_server.store.sqlite_policy import (
    COMMIT_NOW_SIZE,
    commit_place,
    hand_over_wait_s,
)


def wait_s(
    *,
    pending: int = 1,
    now_s: float = 10.0,
    last_hand_over_s: float = 10.0,
    interval_s: float = 1.0,
    batch_max: int = 1000,
    closed: bool = False,
) -> float:
    """The policy's answer: by default one send, a hand-over that just ended, and an
    interval of 1 (seconds, in numbers that add up exactly)."""
    return hand_over_wait_s(
        pending=pending,
        now_s=now_s,
        last_hand_over_s=last_hand_over_s,
        interval_s=interval_s,
        batch_max=batch_max,
        closed=closed,
    )


def test_a_hand_over_right_after_the_last_waits_for_the_rest_of_the_interval() -> None:
    assert wait_s(now_s=10.0) == 1.0
    assert wait_s(now_s=10.25) == 0.75


def test_a_wait_of_half_the_interval_or_less_is_not_worth_a_timer() -> None:
    assert wait_s(now_s=10.375) == 0.625
    assert wait_s(now_s=10.5) == 0.0
    assert wait_s(now_s=10.75) == 0.0


def test_a_hand_over_after_a_quiet_interval_goes_now() -> None:
    assert wait_s(now_s=11.0) == 0.0
    assert wait_s(now_s=500.0) == 0.0
    assert wait_s(last_hand_over_s=0.0) == 0.0  # the first hand-over: none before it


def test_no_interval_means_every_hand_over_goes_now() -> None:
    assert wait_s(interval_s=0.0) == 0.0


def test_commit_now_size_sends_go_now_whatever_the_interval() -> None:
    assert wait_s(pending=COMMIT_NOW_SIZE - 1) == 1.0
    assert wait_s(pending=COMMIT_NOW_SIZE) == 0.0
    assert wait_s(pending=5000) == 0.0


def test_a_batch_max_below_commit_now_size_lowers_it() -> None:
    assert wait_s(pending=4, batch_max=5) == 1.0
    assert wait_s(pending=5, batch_max=5) == 0.0


def test_a_closed_store_hands_over_now() -> None:
    assert wait_s(closed=True) == 0.0


def test_the_interval_scales_the_wait_and_its_timer_threshold() -> None:
    assert wait_s(interval_s=4.0, now_s=11.0) == 3.0
    assert wait_s(interval_s=4.0, now_s=12.0) == 0.0  # 2 left: half, not worth a timer
    assert wait_s(interval_s=0.25, now_s=10.0) == 0.25


@pytest.mark.parametrize(
    ("requested", "synchronous", "place"),
    [
        ("auto", "normal", "loop"),
        ("auto", "full", "thread"),
        ("loop", "normal", "loop"),
        ("thread", "normal", "thread"),
        ("thread", "full", "thread"),
    ],
)
def test_commit_place_resolves_auto_by_synchronous(
    requested: str, synchronous: str, place: str
) -> None:
    assert commit_place(requested, synchronous) == place


@pytest.mark.parametrize(("requested", "synchronous"), [("loop", "full"), ("elsewhere", "normal")])
def test_commit_place_refuses_the_loop_with_full_and_unknown_places(
    requested: str, synchronous: str
) -> None:
    with pytest.raises(ValueError):
        commit_place(requested, synchronous)


@pytest.mark.parametrize(
    ("env", "parameter"),
    [
        ("CHAT_DB_SYNCHRONOUS", "synchronous"),
        ("STORE_QUEUE_MAX", "queue_max"),
        ("STORE_BATCH_MAX", "batch_max"),
        ("CHAT_DB_COMMIT", "commit_on"),
        ("CHAT_DB_COMMIT_INTERVAL_MS", "commit_interval_ms"),
        ("CHAT_DB_CHECKPOINT_PAGES", "checkpoint_pages"),
        ("CHAT_DB_WAL_MAX_BYTES", "wal_max_bytes"),
    ],
)
def test_the_stores_defaults_are_the_settings_defaults(env: str, parameter: str) -> None:
    setting = next(spec for spec in SPECS if spec.env == env)
    assert str(inspect.signature(SqliteHistoryStore).parameters[parameter].default) == (
        setting.default
    )


def test_the_settings_resolve_the_commit_place_with_the_policy() -> None:
    for synchronous in ("normal", "full"):
        settings = Settings.from_mapping({"CHAT_DB_SYNCHRONOUS": synchronous})
        assert settings.store_commit_place == commit_place("auto", synchronous)
