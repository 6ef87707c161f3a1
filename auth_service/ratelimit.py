"""Token buckets keyed by username or client address, with a bounded number of keys, and
the addresses each username logged in from lately.

Pure bookkeeping (no I/O, no asyncio): the caller passes the time, so tests drive
it with plain numbers. A key's bucket holds up to ``burst`` tokens and refills at
``rate_per_min / 60`` tokens per second; a bucket that has refilled completely is
the same as no bucket. At most ``max_keys`` keys are tracked: past that the least
recently used key is forgotten, which at worst gives that key a full bucket again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated_s: float


class TokenBuckets:
    """One token bucket per key; a rate of 0 means no limit at all."""

    def __init__(self, rate_per_min: float, burst: int, max_keys: int) -> None:
        self.rate_per_s = rate_per_min / 60
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: dict[str, _Bucket] = {}

    @property
    def enabled(self) -> bool:
        """False when the rate is 0: :meth:`take` always succeeds."""
        return self.rate_per_s > 0

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, now_s: float) -> float:
        """Take one token for ``key``: 0 if taken, else the seconds until one is there."""
        if not self.enabled:
            return 0.0
        bucket = self._refilled(key, now_s)
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / self.rate_per_s

    def refund(self, key: str, now_s: float) -> None:
        """Give back a token taken for an attempt that turned out not to count."""
        if not self.enabled:
            return
        bucket = self._refilled(key, now_s)
        bucket.tokens = min(self.burst, bucket.tokens + 1)

    def _refilled(self, key: str, now_s: float) -> _Bucket:
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = _Bucket(float(self.burst), now_s)
            while len(self._buckets) >= self.max_keys:
                del self._buckets[next(iter(self._buckets))]
        else:
            elapsed_s = max(0.0, now_s - bucket.updated_s)
            bucket.tokens = min(self.burst, bucket.tokens + elapsed_s * self.rate_per_s)
            bucket.updated_s = now_s
        # re-inserted last: the dict's order is least recently used first
        self._buckets[key] = bucket
        return bucket


class KnownAddresses:
    """Per username, the client addresses that logged in successfully lately.

    Each username keeps its ``per_user`` most recent addresses, each for ``remember_s``
    after its last success; at most ``max_users`` usernames are tracked, the least
    recently successful forgotten first (which at worst treats its owner's address as
    new again). Pure bookkeeping, like :class:`TokenBuckets`.
    """

    def __init__(self, per_user: int, remember_s: float, max_users: int) -> None:
        self.per_user = per_user
        self.remember_s = remember_s
        self.max_users = max_users
        self._users: dict[str, dict[str, float]] = {}

    def __len__(self) -> int:
        return len(self._users)

    def remember(self, user: str, address: str, now_s: float) -> None:
        """``address`` logged in as ``user`` at ``now_s``."""
        addresses = self._users.pop(user, None)
        if addresses is None:
            addresses = {}
            while len(self._users) >= self.max_users:
                del self._users[next(iter(self._users))]
        addresses.pop(address, None)
        addresses[address] = now_s  # last: the dict's order is least recent first
        while len(addresses) > self.per_user:
            del addresses[next(iter(addresses))]
        self._users[user] = addresses

    def knows(self, user: str, address: str, now_s: float) -> bool:
        """True when ``address`` logged in as ``user`` within the last ``remember_s``."""
        seen_s = self._users.get(user, {}).get(address)
        return seen_s is not None and now_s - seen_s <= self.remember_s
