"""The codec interface: frames in, typed messages out, and back.

A codec is chosen once at start (``SERIALIZER``). ``decode_client`` is the
server's per-frame path; ``encode_server`` produces the exact bytes of a frame, so
a broadcast is encoded once and the same bytes go to every member. The
``decode_server``/``encode_client`` pair serves clients (tests, load test, lab).
Decoding never lets an exception other than :class:`~chat_server.errors.CodecError`
escape.
"""

from __future__ import annotations

from collections.abc import Callable

from chat_server.messages import ClientMessage, ServerMessage


class Codec:
    """One serializer: three class attributes and four functions.

    A subclass sets the class attributes and provides the four functions, as methods
    or as plain functions bound in its ``__init__`` (the JSON codecs build closures
    over their parser once, so the per-frame path does no method binding).
    """

    #: the ``SERIALIZER`` value, also sent in ``welcome.codec``
    name: str
    #: the websocket subprotocol this codec speaks
    subprotocol: str
    #: True: frames are binary (protobuf); False: frames are UTF-8 text (JSON)
    binary: bool

    #: turn one received frame into a client message, or raise ``CodecError``: a ``str``
    #: is a text frame, ``bytes`` a binary frame; the wrong one for this codec is
    #: ``unsupported``; anything undecodable, an unknown kind, a missing or mistyped
    #: field is ``bad_request``
    decode_client: Callable[[bytes | str], ClientMessage]
    #: the frame payload for a server message (UTF-8 JSON or protobuf)
    encode_server: Callable[[ServerMessage], bytes]
    #: client side: turn a received frame into a server message, or raise ``CodecError``
    decode_server: Callable[[bytes | str], ServerMessage]
    #: client side: the frame payload for a client message
    encode_client: Callable[[ClientMessage], bytes]
