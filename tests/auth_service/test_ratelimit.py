"""Token buckets driven with plain numbers: no clock, no sockets."""

from __future__ import annotations

import pytest

from auth_service.ratelimit import KnownAddresses, TokenBuckets


def test_a_burst_passes_then_the_wait_is_until_the_next_token():
    buckets = TokenBuckets(rate_per_min=6, burst=3, max_keys=10)  # one token per 10 s
    assert [buckets.take("a", 0.0) for _ in range(3)] == [0, 0, 0]
    assert buckets.take("a", 0.0) == pytest.approx(10)
    assert buckets.take("a", 4.0) == pytest.approx(6)
    assert buckets.take("a", 10.0) == 0
    assert buckets.take("b", 10.0) == 0  # keys are independent


def test_refill_stops_at_the_burst():
    buckets = TokenBuckets(rate_per_min=60, burst=2, max_keys=10)
    assert buckets.take("a", 0.0) == 0
    assert [buckets.take("a", 1000.0) for _ in range(2)] == [0, 0]
    assert buckets.take("a", 1000.0) > 0


def test_refund_gives_a_token_back_up_to_the_burst():
    buckets = TokenBuckets(rate_per_min=1, burst=1, max_keys=10)
    assert buckets.take("a", 0.0) == 0
    assert buckets.take("a", 0.0) > 0
    buckets.refund("a", 0.0)
    buckets.refund("a", 0.0)
    assert buckets.take("a", 0.0) == 0
    assert buckets.take("a", 0.0) > 0


def test_rate_zero_is_no_limit():
    buckets = TokenBuckets(rate_per_min=0, burst=1, max_keys=1)
    assert not buckets.enabled
    assert all(buckets.take("a", 0.0) == 0 for _ in range(100))
    assert len(buckets) == 0


def test_keys_are_bounded_and_the_least_recent_is_forgotten():
    buckets = TokenBuckets(rate_per_min=1, burst=1, max_keys=2)
    buckets.take("old", 0.0)
    buckets.take("recent", 0.0)
    buckets.take("old", 1.0)  # touched again: now "recent" is the least recent
    buckets.take("new", 2.0)
    assert len(buckets) == 2
    assert buckets.take("old", 2.0) > 0  # still remembered, still empty
    assert buckets.take("recent", 2.0) == 0  # forgotten: a full bucket again


def test_known_addresses_are_the_recent_successes_of_each_username():
    known = KnownAddresses(per_user=2, remember_s=100, max_users=2)
    known.remember("alice", "10.0.0.1", 0.0)
    assert known.knows("alice", "10.0.0.1", 100.0)
    assert not known.knows("alice", "10.0.0.1", 100.5)  # forgotten after remember_s
    assert not known.knows("alice", "10.0.0.2", 1.0)
    assert not known.knows("bob", "10.0.0.1", 1.0)  # per username
    known.remember("alice", "10.0.0.2", 1.0)
    known.remember("alice", "10.0.0.3", 2.0)  # the third: the least recent goes
    assert [known.knows("alice", f"10.0.0.{i}", 3.0) for i in (1, 2, 3)] == [False, True, True]
    known.remember("bob", "10.0.0.9", 3.0)
    known.remember("carol", "10.0.0.9", 4.0)  # a third username: alice goes
    assert len(known) == 2
    assert not known.knows("alice", "10.0.0.3", 5.0)
    assert known.knows("bob", "10.0.0.9", 5.0)
