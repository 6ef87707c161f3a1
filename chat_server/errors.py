"""The protocol's error codes and the exceptions that carry them.

One place maps failures to the contract's codes (``docs/protocol.md``). Every
exception raised while handling a frame is a :class:`ProtocolError` with a code
from :class:`ErrorCode`; anything else is a bug and is answered ``internal``.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """Error codes of the ``error`` frame, in the contract's precedence order."""

    RATE_LIMITED = "rate_limited"
    UNSUPPORTED = "unsupported"
    BAD_REQUEST = "bad_request"
    INVALID_ROOM = "invalid_room"
    TOO_LARGE = "too_large"
    NOT_IN_ROOM = "not_in_room"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


# Codes that do not count towards MAX_PROTOCOL_ERRORS: they are not the client's fault
# (unavailable, internal) or are counted by the flood rule instead (rate_limited).
UNCOUNTED_CODES = frozenset({ErrorCode.RATE_LIMITED, ErrorCode.UNAVAILABLE, ErrorCode.INTERNAL})


class ChatError(Exception):
    """Base of every exception chatlab raises on purpose."""


class ProtocolError(ChatError):
    """A frame the server answers with an ``error`` frame; the connection stays open."""

    def __init__(self, code: ErrorCode, detail: str, ref: str | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.ref = ref


class CodecError(ProtocolError):
    """A frame the codec could not turn into a typed message (bad_request, unsupported)."""


class StoreError(ChatError):
    """The history store failed; nothing of the affected batch was stored or acked."""

    code: ErrorCode = ErrorCode.INTERNAL


class StoreUnavailable(StoreError):
    """The store cannot take the write now (overloaded queue, closed, locked database)."""

    code = ErrorCode.UNAVAILABLE


class BrokerUnavailable(ChatError):
    """The broker cannot reach the other processes now (Redis unreachable or too slow)."""

    code = ErrorCode.UNAVAILABLE
