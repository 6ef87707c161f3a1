"""Secrets never reach a log: a logging filter that redacts JWTs, bearer credentials and
the passwords in database URLs.

At ``LOG_LEVEL=debug`` websockets logs each handshake's request line
(``GET /ws?token=eyJ...``) and headers (``Authorization: Bearer eyJ...``); an
exception's text may quote them too. :class:`RedactTokens`, installed on the
root logger's handlers by :func:`redact_tokens_in_logs`, rewrites every record
that reaches them, at every level and from every library (websockets, picows,
uvicorn, psycopg), so no line holds a usable token. The password of a URL's user
(``postgresql://auth:secret@db/auth``) and a libpq ``password=`` keyword are redacted the
same way: the auth service's ``AUTH_DB_URL`` carries one. Both services install it at
start, and a setting's value is shown through :func:`redact` too.
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
#: a URL's password: ``scheme://user:PASSWORD@host`` (up to the last ``@`` before the path,
#: as ``urllib.parse`` splits it), and a libpq connection string's ``password=PASSWORD``
_URL_PASSWORD = re.compile(r"(://[^\s/@:]*:)[^\s/]*(@[^\s/@]*)")
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s'\"]+)")


def redact(text: str) -> str:
    """``text`` with every JWT, ``token=`` value, bearer credential and password replaced."""
    text = _SECRET.sub(REDACTED, text)
    text = _URL_PASSWORD.sub(rf"\1{REDACTED}\2", text)
    return _KEYWORD_PASSWORD.sub(rf"\1{REDACTED}", text)


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
