"""The auth service as the tests run it."""

from __future__ import annotations

from chatlab.harness import FAST_ARGON2

__all__ = ["TEST_SETTINGS"]

#: what the tests run with unless they say otherwise: cheap hashes, no per-client limits
TEST_SETTINGS = {
    **FAST_ARGON2,
    "LOGIN_RATE_PER_CLIENT_PER_MIN": "0",
    "REGISTER_RATE_PER_CLIENT_PER_MIN": "0",
    "EVENT_LOOP": "asyncio",
}
