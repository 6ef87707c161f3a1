"""The codec interface: frames in, typed messages out, and back.

A codec is chosen once at start (``SERIALIZER``). ``decode_client`` is the
server's per-frame path; ``encode_server`` produces the exact bytes of a frame, so
a broadcast is encoded once and the same bytes go to every member. The
``decode_server``/``encode_client`` pair serves clients (tests, load test, lab).
Decoding never lets an exception other than :class:`~chat_server.errors.CodecError`
escape.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from chat_server.messages import ClientMessage, ServerMessage


class Codec(ABC):
    """One serializer. Subclasses set the class attributes below."""

    #: the ``SERIALIZER`` value, also sent in ``welcome.codec``
    name: str
    #: the websocket subprotocol this codec speaks
    subprotocol: str
    #: True: frames are binary (protobuf); False: frames are UTF-8 text (JSON)
    binary: bool

    @abstractmethod
    def decode_client(self, frame: bytes | str) -> ClientMessage:
        """Turn one received frame into a client message, or raise ``CodecError``.

        A ``str`` is a text frame, ``bytes`` a binary frame; the wrong one for this
        codec is ``unsupported``; anything undecodable, an unknown kind, a missing
        or mistyped field is ``bad_request``.
        """

    @abstractmethod
    def encode_server(self, message: ServerMessage) -> bytes:
        """Return the frame payload for a server message (UTF-8 JSON or protobuf)."""

    @abstractmethod
    def decode_server(self, frame: bytes | str) -> ServerMessage:
        """Client side: turn a received frame into a server message, or raise ``CodecError``."""

    @abstractmethod
    def encode_client(self, message: ClientMessage) -> bytes:
        """Client side: return the frame payload for a client message."""
