"""``WS_DEFLATE=shared``: permessage-deflate (RFC 7692) without context takeover, each
broadcast compressed once for every member that negotiated it.

With context takeover (``WS_DEFLATE=on``) every connection keeps its own compressor and
a message to a room of N is compressed N times. Without it, a compressed message
depends on nothing sent before, so one compressed frame fits every member: what
uWebSockets' ``SHARED_COMPRESSOR`` and gorilla/websocket's ``PreparedMessage`` do.

- **Negotiation** (:func:`negotiate`, :func:`answer_offers`): a client's offer is
  accepted with ``server_no_context_takeover`` and ``client_no_context_takeover`` added
  (RFC 7692 7.1.1.1-2 let a server add either to any offer), as websockets'
  ``ServerPerMessageDeflateFactory(server_no_context_takeover=True,
  client_no_context_takeover=True)`` answers; an offer it cannot accept (one asking
  ``server_max_window_bits=8``, which zlib cannot compress to) is declined, and that
  client gets plain frames.
- **Sending** (:class:`SharedCompressor`, :func:`deflated_frame`): one compressor per
  process, window 2^:data:`WINDOW_BITS` (the smallest window an accepted offer may ask
  for, so one frame fits every member), each message ended with a full flush, so it
  inflates alone with a fresh raw inflater; RSV1 set, the tail ``00 00 ff ff`` removed.
- **Receiving** (:class:`MessageInflater`): a client's compressed
  message is inflated by a fresh raw inflater that lives only while the message is read,
  bounded by ``MAX_FRAME_BYTES`` (:class:`InflatedTooBig`: close 1009); a stream zlib
  refuses is :class:`InvalidCompressedData` (close 1007).

Control frames are never compressed (RFC 7692 6.1).
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Iterable, Sequence

from websockets.exceptions import InvalidHeaderFormat, NegotiationError
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.headers import build_extension, parse_extension
from websockets.typing import ExtensionParameter

from chat_server.transport.frames import frame_header

__all__ = [
    "EXTENSION_NAME",
    "WINDOW_BITS",
    "Framing",
    "InflatedTooBig",
    "InvalidCompressedData",
    "MessageInflater",
    "SharedCompressor",
    "answer_offers",
    "deflated_frame",
    "negotiate",
]

EXTENSION_NAME = "permessage-deflate"


class Framing(enum.Enum):
    """How a connection's data frames go on the wire: chosen once, at its handshake, by
    both transports (:meth:`of` for what a connection that negotiated permessage-deflate
    takes, :attr:`PLAIN` for every other)."""

    #: no extension: each frame built once per broadcast for every such connection
    PLAIN = "plain"
    #: ``WS_DEFLATE=on``: through the connection's own compressor (context takeover),
    #: websockets' extension (the transport's ``_write_frames``)
    PER_CONNECTION_DEFLATE = "per-connection deflate"
    #: ``WS_DEFLATE=shared``: compressed once per broadcast for every such connection
    SHARED_DEFLATE = "shared deflate"

    @classmethod
    def of(cls, ws_deflate: str) -> Framing:
        """The framing of a connection that negotiated permessage-deflate under
        ``WS_DEFLATE=ws_deflate`` (PLAIN when it is off: none negotiates)."""
        return {"on": cls.PER_CONNECTION_DEFLATE, "shared": cls.SHARED_DEFLATE}.get(
            ws_deflate, cls.PLAIN
        )


#: the window every broadcast is compressed with: RFC 7692 lets an offer ask for 2^8 to
#: 2^15; zlib cannot compress with 2^8 (madler/zlib#171, as websockets notes), so 2^9 is
#: the smallest window an accepted offer may ask for, and a frame compressed with it
#: inflates with any window an offer may give
WINDOW_BITS = 9
#: the window a client's messages are inflated with: no offer is narrowed (any 2^8-2^15
#: inflates with 2^15), and the inflater lives only while one message is read
CLIENT_WINDOW_BITS = 15
#: zlib's compression level for broadcasts (its default): chat messages are short, and
#: faster levels save little time on them while compressing worse
LEVEL = 6
#: what a sync or full flush ends with, removed by the sender (RFC 7692 7.2.1)
TAIL = b"\x00\x00\xff\xff"

#: the answer's parameters, websockets' negotiation (the response it builds to an offer)
_FACTORY = ServerPerMessageDeflateFactory(
    server_no_context_takeover=True, client_no_context_takeover=True
)


class InflatedTooBig(Exception):
    """A compressed message inflates past ``MAX_FRAME_BYTES`` (close 1009)."""


class InvalidCompressedData(UnicodeDecodeError):
    """A compressed message zlib cannot inflate (close 1007, invalid frame payload data).

    A :class:`UnicodeDecodeError` because websockets' sans-I/O parser closes a connection
    with 1007 on exactly that exception when an extension's ``decode`` raises it; chatlab's
    own peers close with 1007 when they catch it.
    """

    def __init__(self, data: bytes, detail: str) -> None:
        super().__init__(EXTENSION_NAME, data, 0, len(data), f"invalid compressed data ({detail})")


def negotiate(params: Sequence[ExtensionParameter]) -> list[ExtensionParameter]:
    """The answer's parameters to one permessage-deflate offer; NegotiationError when it
    cannot be accepted."""
    answer, _ = _FACTORY.process_request_params(params, [])
    return answer


def answer_offers(headers: Iterable[str]) -> str | None:
    """The ``Sec-WebSocket-Extensions`` answer to a request's headers of that name: the
    first permessage-deflate offer that can be accepted, or None (no extension)."""
    for header in headers:
        try:
            offers = parse_extension(header)
        except InvalidHeaderFormat:  # a malformed header offers nothing
            continue
        for name, params in offers:
            if name != EXTENSION_NAME:
                continue
            try:
                return build_extension([(name, negotiate(params))])
            except NegotiationError:  # its parameters' errors too
                continue
    return None


class SharedCompressor:
    """Compresses messages, each independently of every other, with one zlib compressor.

    Each message ends with a full flush (``Z_FULL_FLUSH``): zlib forgets what came
    before, so the message inflates alone with a fresh raw inflater, as a peer without
    context takeover reads it; and nothing is allocated per message.
    """

    __slots__ = ("_zlib",)

    def __init__(self) -> None:
        self._zlib = zlib.compressobj(LEVEL, zlib.DEFLATED, -WINDOW_BITS)

    def compress(self, payload: bytes) -> bytes:
        """``payload`` compressed, the tail ``00 00 ff ff`` removed (RFC 7692 7.2.1)."""
        deflater = self._zlib
        return (deflater.compress(payload) + deflater.flush(zlib.Z_FULL_FLUSH))[:-4]


def deflated_frame(opcode: int, compressed: bytes) -> bytes:
    """One unmasked, final websocket data frame carrying a compressed message (RSV1 set)."""
    return frame_header(opcode, len(compressed), compressed=True) + compressed


class MessageInflater:
    """Inflates one compressed message, frame by frame, within ``limit_bytes`` in all."""

    __slots__ = ("_left", "_zlib")

    def __init__(self, limit_bytes: int) -> None:
        self._zlib = zlib.decompressobj(-CLIENT_WINDOW_BITS)
        self._left = limit_bytes

    def feed(self, chunk: bytes | bytearray | memoryview, fin: bool) -> bytes:
        """The bytes ``chunk`` inflates to (``fin``: the message's last frame)."""
        data = bytes(chunk) + TAIL if fin else chunk
        inflater = self._zlib
        try:
            out = inflater.decompress(data, self._left + 1)
        except zlib.error as exc:
            raise InvalidCompressedData(bytes(chunk), str(exc)) from None
        if len(out) > self._left:
            raise InflatedTooBig(f"a compressed message inflates past {self._left} bytes")
        if inflater.unused_data:
            raise InvalidCompressedData(bytes(chunk), "data after the final block")
        self._left -= len(out)
        return out
