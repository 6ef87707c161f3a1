"""The protocol's rules on names and sizes, checked in the contract's precedence order."""

from __future__ import annotations

import re

from chat_server.errors import ErrorCode, ProtocolError

ROOM_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
MAX_REF_CHARS = 64
HISTORY_LIMIT_DEFAULT = 50
HISTORY_LIMIT_MAX = 500


def check_room(room: str, ref: str | None = None) -> None:
    """Raise ``invalid_room`` unless ``room`` is 1-64 characters of ``A-Za-z0-9_.-``."""
    if ROOM_NAME.fullmatch(room) is None:
        raise ProtocolError(
            ErrorCode.INVALID_ROOM, "room names are 1-64 characters of A-Za-z0-9_.-", ref
        )


def check_send(room: str, body: str, ref: str | None, max_body_chars: int) -> None:
    """Validate a ``send``: bad_request, then invalid_room, then too_large."""
    if ref is not None and len(ref) > MAX_REF_CHARS:
        # an over-long ref is not echoed: it is the thing that is wrong
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"ref is over {MAX_REF_CHARS} characters")
    if not body:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "body is empty", ref)
    check_room(room, ref)
    if len(body) > max_body_chars:
        raise ProtocolError(
            ErrorCode.TOO_LARGE, f"body is over MAX_BODY_CHARS={max_body_chars} characters", ref
        )


def check_since(since: int | None) -> None:
    """Raise ``bad_request`` for a negative ``since`` (a ``join``'s last seen seq)."""
    if since is not None and since < 0:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "since must be a seq: 0 or more")


def history_limit(limit: int | None) -> int:
    """The page size of a ``history`` request: default 50, else 1-500 or ``bad_request``."""
    if limit is None:
        return HISTORY_LIMIT_DEFAULT
    if not 1 <= limit <= HISTORY_LIMIT_MAX:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"limit must be from 1 to {HISTORY_LIMIT_MAX}")
    return limit
