"""Transports: one per ``TRANSPORT`` value, chosen once at start with :func:`transport_for`.

Only the chosen one is imported: a server on websockets never loads picows.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from chat_server.settings import SettingError, Settings

if TYPE_CHECKING:
    from chat_server.auth import TokenVerifier
    from chat_server.codecs.base import Codec
    from chat_server.service import ChatService
    from chat_server.transport.base import ServerTransport

__all__ = ["TransportFactory", "transport_for"]

#: builds a transport: (settings, service, verifier, codec, listening socket or None)
TransportFactory = Callable[
    ["Settings", "ChatService", "TokenVerifier", "Codec", "socket.socket | None"], "ServerTransport"
]


def transport_for(settings: Settings) -> TransportFactory:
    """The transport class ``TRANSPORT`` names; SettingError when its library is missing."""
    if settings.transport == "picows":
        try:
            from chat_server.transport.picows import PicowsTransport  # noqa: PLC0415
        except ImportError as exc:
            raise SettingError(
                "TRANSPORT", settings.transport, f"picows is not installed ({exc.msg})"
            ) from None
        return PicowsTransport
    from chat_server.transport.websockets import WebsocketsTransport  # noqa: PLC0415

    return WebsocketsTransport
