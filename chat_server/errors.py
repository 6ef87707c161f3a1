"""The protocol's error codes and the exceptions that carry them.

Every failure a client hears of is a :class:`ChatError` whose ``code`` is one of the
contract's (``docs/protocol.md``) and whose ``detail`` is the frame's text: raised
where it happens, turned into an ``error`` frame at one edge per path (see
:class:`ChatError`). Any other exception is a bug, logged and answered ``internal``.
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
    TOO_MANY_ROOMS = "too_many_rooms"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


# Codes that do not count towards MAX_PROTOCOL_ERRORS: they are not the client's fault
# (unavailable, internal), are counted by the flood rule instead (rate_limited), or refuse
# a well-formed request that holds nothing (too_many_rooms: a client restoring more rooms
# than the cap after a reconnect would otherwise be closed, reconnect and try again).
UNCOUNTED_CODES = frozenset(
    {
        ErrorCode.RATE_LIMITED,
        ErrorCode.TOO_MANY_ROOMS,
        ErrorCode.UNAVAILABLE,
        ErrorCode.INTERNAL,
    }
)


class ChatError(Exception):
    """Base of every exception chatlab raises on purpose.

    ``code`` is the contract's code the client is answered with, ``detail`` the error
    frame's text, ``ref`` the send it answers (None: none). Raised where the failure
    happens; :meth:`chat_server.service.ChatService` turns it into an ``error`` frame
    at the edge (the frame's handler, or the background task's top), nowhere else.
    """

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, detail: str, ref: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.ref = ref


class ProtocolError(ChatError):
    """A request the server refuses with ``code``; the connection stays open."""

    def __init__(self, code: ErrorCode, detail: str, ref: str | None = None) -> None:
        super().__init__(detail, ref)
        self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


class CodecError(ProtocolError):
    """A frame the codec could not turn into a typed message (bad_request, unsupported)."""


class Unavailable(ChatError):
    """The server cannot do this now (shutting down, a replay or a join that failed); the
    client may try again."""

    code = ErrorCode.UNAVAILABLE


class StoreError(ChatError):
    """The history store failed; nothing of the affected batch was stored or acked."""

    code = ErrorCode.INTERNAL


class StoreUnavailable(StoreError):
    """The store cannot take the write now (overloaded queue, closed, locked database)."""

    code = ErrorCode.UNAVAILABLE


class BrokerUnavailable(Unavailable):
    """The broker cannot reach the other processes now (Redis unreachable or too slow)."""


class NodeBusy(BrokerUnavailable):
    """A Redis node already has ``REDIS_NODE_CONNECTIONS`` requests of this process in
    flight and none ended within ``REDIS_POOL_WAIT_S``: this one request is refused."""
