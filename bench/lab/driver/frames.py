"""The driver's ``send`` frames: encoded once per connection, the scheduled time spliced in."""

from __future__ import annotations

from collections.abc import Callable

from chat_server.codecs import Codec, chat_pb2
from chat_server.messages import Send, ServerMessage

#: what precedes the scheduled send time in every body
MARKER = b"~ts="
#: width of the scheduled send time in the body (``perf_counter_ns`` fits in 19 digits)
DIGITS = 19
#: the shortest body: the marker and the digits
MIN_BODY_CHARS = len(MARKER) + DIGITS
#: where a send's ref goes (--retry): replaced by the send's scheduled-time digits
REF_PLACEHOLDER = b"9" * DIGITS


def header_bytes(payload_bytes: int) -> int:
    """The websocket header of an unmasked frame (server to client) with this payload."""
    return 2 if payload_bytes < 126 else 4 if payload_bytes < 65536 else 10


def send_frame(
    codec: Codec, room: str, body_chars: int, with_ref: bool = False
) -> tuple[bytearray, slice, slice | None]:
    """One ``send`` frame for ``room``, encoded by ``codec``; where its time digits are,
    and (``with_ref``) where its ``ref``'s are.

    The digits are placeholders; writing 19 digits in each place gives the frame the
    codec would encode for that time and ref (same length, so protobuf lengths stay
    right).
    """
    body = MARKER.decode() + "0" * DIGITS + "x" * (body_chars - MIN_BODY_CHARS)
    ref = REF_PLACEHOLDER.decode() if with_ref else None
    frame = bytearray(codec.encode_client(Send(room=room, body=body, ref=ref)))
    start = frame.find(MARKER) + len(MARKER)
    assert start >= len(MARKER) and frame[start : start + DIGITS] == b"0" * DIGITS, frame
    ref_digits = None
    if with_ref:
        at = frame.find(REF_PLACEHOLDER)
        assert at >= 0, frame
        ref_digits = slice(at, at + DIGITS)
    return frame, slice(start, start + DIGITS), ref_digits


def decode_frame(codec: Codec, payload: bytes) -> ServerMessage:
    """A server frame's payload decoded (JSON codecs take text frames as ``str``)."""
    return codec.decode_server(payload if codec.binary else payload.decode("utf-8", "replace"))


def frame_kind_reader(codec: Codec) -> Callable[[bytes], str]:
    """A function naming a server frame's kind (``ack``, ``error``, ...) from its first bytes.

    JSON frames start with their ``type`` (msgspec writes the tag first); a protobuf
    frame starts with the tag of its ``oneof`` field. Anything else is decoded.
    """
    if codec.binary:
        oneof = chat_pb2.ServerMessage.DESCRIPTOR.oneofs_by_name["kind"]
        names = {f.number: f.name for f in oneof.fields}

        def protobuf_kind(payload: bytes) -> str:
            return names.get(payload[0] >> 3, "unknown") if payload else "unknown"

        return protobuf_kind

    prefix = b'{"type":"'

    def json_kind(payload: bytes) -> str:
        if payload.startswith(prefix):
            return payload[len(prefix) : payload.find(b'"', len(prefix))].decode("ascii", "replace")
        try:
            return type(decode_frame(codec, payload)).__struct_config__.tag  # type: ignore[return-value]
        except Exception:  # any undecodable frame is just of an unknown kind here
            return "unknown"

    return json_kind
