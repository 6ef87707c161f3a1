"""REGRESSION: the lab's deliberate mistakes, each defined here and chosen at start.

:meth:`Regression.of` reads ``REGRESSION`` and says what each part does differently:
the server (:mod:`chat_server.server`) reads it once and hands it to the wiring
(:mod:`chat_server.wiring`); the websockets transport reads its deflate window from
it. No other module compares ``settings.regression``.
A regression is loud at start (``python -m chat_server`` logs a warning) and never
meant for real traffic.

``auth_inline`` is the one place the chat server reaches the auth service's code:
:func:`load_inline_login` imports :mod:`auth_service.inline` by name, only in that
mode, so neither package imports the other at module level and argon2 is never
loaded otherwise.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from chat_server.settings import Settings

#: REGRESSION=blocking_loop: how long each send blocks the event loop (sleeping)
BLOCKING_LOOP_S = 0.001
#: REGRESSION=cpu_per_send: how much CPU each send burns on the event loop
CPU_PER_SEND_S = 0.001

#: the module serving REGRESSION=auth_inline's POST /login, beside the auth service
INLINE_LOGIN_MODULE = "auth_service.inline"


class InlineLogin(Protocol):
    """What the entry point needs of the inline login listener."""

    async def start(self) -> None:
        """Listen; SettingError or OSError when it cannot."""

    async def stop(self) -> None:
        """Stop listening."""


@dataclass(frozen=True)
class Regression:
    """What ``REGRESSION`` changes, part by part (everything off when it is ``off``)."""

    name: str = "off"
    #: ``commit_per_message``: one transaction per message (no group commit)
    commit_per_message: bool = False
    #: ``encode_per_recipient``: a broadcast encoded again for every member
    encode_per_recipient: bool = False
    #: ``blocking_loop``: each send blocks the event loop this long first (s), asleep
    blocking_send_s: float = 0.0
    #: ``cpu_per_send``: each send first burns this much CPU on the event loop (s)
    busy_send_s: float = 0.0
    #: ``deflate_max_window``: permessage-deflate with zlib's largest window and memLevel
    deflate_max_window: bool = False
    #: ``auth_inline``: the chat server also serves POST /login, hashing on its own loop
    inline_login: bool = False

    @classmethod
    def of(cls, settings: Settings) -> Regression:
        """The regression ``settings`` choose (validated with the other settings)."""
        name = settings.regression
        return cls(
            name=name,
            commit_per_message=name == "commit_per_message",
            encode_per_recipient=name == "encode_per_recipient",
            blocking_send_s=BLOCKING_LOOP_S if name == "blocking_loop" else 0.0,
            busy_send_s=CPU_PER_SEND_S if name == "cpu_per_send" else 0.0,
            deflate_max_window=name == "deflate_max_window",
            inline_login=name == "auth_inline",
        )

    def store_batch_max(self, settings: Settings) -> int:
        """Messages per group commit: ``STORE_BATCH_MAX``, or 1 for ``commit_per_message``."""
        return 1 if self.commit_per_message else settings.store_batch_max

    def deflate_window(self) -> tuple[int, int]:
        """permessage-deflate's window bits and zlib memLevel when ``WS_DEFLATE=on``."""
        return (15, 9) if self.deflate_max_window else (12, 5)


def load_inline_login(settings: Settings, env_file: str | None) -> InlineLogin:
    """REGRESSION=auth_inline: the auth service's login, built to run on this process's loop.

    The one declared plug-in point between the services: imported by name here, only
    in this mode, because the regression *is* the auth service's argon2 work moved
    onto the chat server's event loop.
    """
    module = importlib.import_module(INLINE_LOGIN_MODULE)
    login: InlineLogin = module.InlineLogin(settings.host, settings.auth_inline_port, env_file)
    return login
