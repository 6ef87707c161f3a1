"""The auth service as the tests run it."""

from __future__ import annotations

import re

from chatlab.harness import FAST_ARGON2, AuthProcess

__all__ = ["TEST_SETTINGS", "logins_answered"]

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
