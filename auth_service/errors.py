"""The auth API's error codes and the exceptions that carry them.

Every failure a client can cause or see is an :class:`AuthError` whose ``code`` and
``status`` are the contract's; :mod:`auth_service.app` turns it into
``{"error": code, "detail": text}`` (with ``Retry-After`` where the error has one) in
one place. Anything else raised while handling a request is a bug and is answered
``500 internal``.
"""

from __future__ import annotations

import math


class AuthError(Exception):
    """A request the service refuses; ``code``, ``status`` and ``detail`` go to the client."""

    code = "internal"
    status = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def headers(self) -> dict[str, str]:
        """Extra response headers this error carries."""
        return {}


class BadRequest(AuthError):
    """Malformed body, missing or mistyped field, or a username/password outside the rules."""

    code = "bad_request"
    status = 400


class TooLarge(AuthError):
    """A request body over the limit."""

    code = "too_large"
    status = 413


class UsernameTaken(AuthError):
    """The username (compared without regard to case) is already registered."""

    code = "username_taken"
    status = 409


class InvalidCredentials(AuthError):
    """Unknown username or wrong password: one error, so the two cannot be told apart."""

    code = "invalid_credentials"
    status = 401


class RetryLater(AuthError):
    """An error that tells the client when to try again (``Retry-After``, whole seconds)."""

    def __init__(self, detail: str, retry_after_s: float) -> None:
        super().__init__(detail)
        self.retry_after_s = max(1, math.ceil(retry_after_s))

    def headers(self) -> dict[str, str]:
        """``Retry-After`` in whole seconds, at least 1."""
        return {"Retry-After": str(self.retry_after_s)}


class RateLimited(RetryLater):
    """Too many attempts from this address or for this username."""

    code = "rate_limited"
    status = 429


class Unavailable(RetryLater):
    """The service cannot take the request now (hashing pool full, database busy)."""

    code = "unavailable"
    status = 503
