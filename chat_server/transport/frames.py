"""A server frame's header (RFC 6455 5.2), built in one place: the deflated broadcasts of
``WS_DEFLATE=shared`` and the bare relays frame their payloads with it."""

from __future__ import annotations

import struct

_FIN = 0b1000_0000
_RSV1 = 0b0100_0000  # permessage-deflate: the message is compressed (RFC 7692 6)


def frame_header(opcode: int, payload_bytes: int, *, compressed: bool = False) -> bytes:
    """The header of one final, unmasked server frame with this opcode and payload length
    (RSV1 set when ``compressed``), as websockets' ``Frame.serialize(mask=False)`` writes
    it."""
    head = _FIN | opcode | (_RSV1 if compressed else 0)
    if payload_bytes < 126:
        return bytes((head, payload_bytes))
    if payload_bytes < 2**16:
        return struct.pack("!BBH", head, 126, payload_bytes)
    return struct.pack("!BBQ", head, 127, payload_bytes)
