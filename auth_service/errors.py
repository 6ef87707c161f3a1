"""The auth API's error codes and the exception that carries them.

Every failure a client can cause or see is an :class:`AuthError`: raised where it
happens, with the contract's ``code`` as data (its HTTP status follows from the code,
:data:`STATUS`); :mod:`auth_service.app` turns it into ``{"error": code, "detail":
text}`` (with ``Retry-After`` where the error has one) in one place. Anything else
raised while handling a request is a bug and is answered ``500 internal``.
"""

from __future__ import annotations

import enum
import math
from typing import Final


class AuthCode(enum.StrEnum):
    """The ``error`` codes of the auth API (``docs/protocol.md``)."""

    BAD_REQUEST = "bad_request"
    INVALID_CREDENTIALS = "invalid_credentials"
    INVALID_TOKEN = "invalid_token"
    USERNAME_TAKEN = "username_taken"
    TOO_LARGE = "too_large"
    REQUEST_TIMEOUT = "request_timeout"
    RATE_LIMITED = "rate_limited"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


#: the HTTP status of each code
STATUS: Final = {
    AuthCode.BAD_REQUEST: 400,
    AuthCode.INVALID_CREDENTIALS: 401,
    AuthCode.INVALID_TOKEN: 401,
    AuthCode.USERNAME_TAKEN: 409,
    AuthCode.TOO_LARGE: 413,
    AuthCode.REQUEST_TIMEOUT: 408,
    AuthCode.RATE_LIMITED: 429,
    AuthCode.UNAVAILABLE: 503,
    AuthCode.INTERNAL: 500,
}


class AuthError(Exception):
    """A request the service refuses: ``code`` and ``detail`` go to the client, with
    ``Retry-After`` (whole seconds, at least 1) when ``retry_after_s`` is given."""

    def __init__(self, code: AuthCode, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.retry_after_s = None if retry_after_s is None else max(1, math.ceil(retry_after_s))

    @property
    def status(self) -> int:
        """The HTTP status of :attr:`code`."""
        return STATUS[self.code]

    def headers(self) -> dict[str, str]:
        """Extra response headers this error carries: ``Retry-After`` when it has one."""
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class Unavailable(AuthError):
    """The service cannot take the request now (hashing pool full, database busy or down):
    ``unavailable`` with ``Retry-After``. A kind of its own because callers catch it."""

    def __init__(self, detail: str, retry_after_s: float) -> None:
        super().__init__(AuthCode.UNAVAILABLE, detail, retry_after_s)
