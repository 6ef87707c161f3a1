"""Tokens never reach a log: a logging filter that redacts JWTs and bearer credentials.

At ``LOG_LEVEL=debug`` websockets logs each handshake's request line
(``GET /ws?token=eyJ...``) and headers (``Authorization: Bearer eyJ...``); an
exception's text may quote them too. :class:`RedactTokens`, installed on the
root logger's handlers by :func:`redact_tokens_in_logs`, rewrites every record
that reaches them, at every level and from every library (websockets, picows,
uvicorn), so no line holds a usable token. Both services install it at start.
"""

from __future__ import annotations

import logging
import re

REDACTED = "[redacted]"

#: a challenge's parameter after its scheme (``realm="chatlab"``, ``error=invalid_token`` in
#: ``WWW-Authenticate: Bearer realm="chatlab", ...``): not a credential, which (RFC 7235's
#: token68) has ``=`` only at its end
_AUTH_PARAM = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\s*=\s*[^=\s,]"

#: a JWT or a piece of one (base64url parts, the first a JSON header: ``eyJ``), a ``token=`` query
#: value, or the credentials of an ``Authorization: Bearer`` / ``Basic`` header
_SECRET = re.compile(
    r"eyJ[A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]*){0,2}"
    r"|(?<=[?&]token=)[^&\s'\"]+"
    rf"|(?<=[Bb]earer )(?!{_AUTH_PARAM})[^\s'\",]+"
    rf"|(?<=[Bb]asic )(?!{_AUTH_PARAM})[^\s'\",]+"
)


def redact(text: str) -> str:
    """``text`` with every JWT, ``token=`` value and bearer credential replaced."""
    return _SECRET.sub(REDACTED, text)


class RedactTokens(logging.Filter):
    """Rewrites a record's message (and its exception text) without tokens; drops nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record`` in place; always True."""
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def redact_tokens_in_logs() -> None:
    """Install :class:`RedactTokens` on every handler of the root logger (after basicConfig)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactTokens) for f in handler.filters):
            handler.addFilter(RedactTokens())
