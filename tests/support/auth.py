"""The auth service as the tests run it."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from chatlab.harness import FAST_ARGON2, AuthProcess

__all__ = ["TEST_SETTINGS", "logins_answered", "metric_sum"]

#: what the tests run with unless they say otherwise: cheap hashes, no per-client limits
TEST_SETTINGS = {
    **FAST_ARGON2,
    "LOGIN_RATE_PER_CLIENT_PER_MIN": "0",
    "REGISTER_RATE_PER_CLIENT_PER_MIN": "0",
    "EVENT_LOOP": "asyncio",
}


def logins_answered(replica: AuthProcess, status: int = 200) -> float:
    """How many logins ``replica`` answered with ``status`` (its Prometheus counter)."""
    text = replica.get("/metrics").body.decode()
    found = re.search(
        rf'auth_requests_total\{{[^}}]*route="/login"[^}}]*status="{status}"[^}}]*\}} (\S+)', text
    )
    return float(found.group(1)) if found else 0.0


def metric_sum(replica: AuthProcess, sample: str, **labels: str) -> float:
    """The sum of ``replica``'s samples named ``sample`` (e.g. ``auth_refresh_total``,
    ``auth_hash_seconds_count``) whose labels include ``labels``; 0 when there are none."""
    text = replica.get("/metrics").body.decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )
