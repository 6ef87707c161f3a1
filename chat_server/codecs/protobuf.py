"""The contract's protobuf form, ``proto/chat.proto`` (``SERIALIZER=protobuf``).

Typed messages are built straight from the generated messages' fields and back,
never through dicts or ``json_format``: a proto3 ``optional`` field becomes None
when it is not set, so absent and zero differ as in the JSON form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.message import DecodeError

from chat_server.codecs import chat_pb2
from chat_server.codecs.base import Codec
from chat_server.errors import CodecError, ErrorCode
from chat_server.messages import (
    Ack,
    ClientMessage,
    Error,
    History,
    HistoryRequest,
    Join,
    Joined,
    Leave,
    Message,
    Presence,
    Send,
    ServerMessage,
    Welcome,
)

_ClientPb = chat_pb2.ClientMessage
_ServerPb = chat_pb2.ServerMessage
_client_from_bytes = _ClientPb.FromString
_server_from_bytes = _ServerPb.FromString
_BAD_REQUEST = ErrorCode.BAD_REQUEST

# ---- client messages ---------------------------------------------------------


def _decode_join(pb: Any) -> Join:
    j = pb.join
    return Join(room=j.room, since=j.since if j.HasField("since") else None)


def _decode_leave(pb: Any) -> Leave:
    return Leave(room=pb.leave.room)


def _decode_send(pb: Any) -> Send:
    s = pb.send
    return Send(room=s.room, body=s.body, ref=s.ref if s.HasField("ref") else None)


def _decode_history_request(pb: Any) -> HistoryRequest:
    h = pb.history
    return HistoryRequest(
        room=h.room,
        before=h.before if h.HasField("before") else None,
        limit=h.limit if h.HasField("limit") else None,
    )


def _encode_join(m: Join) -> bytes:
    pb = _ClientPb()
    j = pb.join
    j.room = m.room
    if m.since is not None:
        j.since = m.since
    return pb.SerializeToString()


def _encode_leave(m: Leave) -> bytes:
    pb = _ClientPb()
    pb.leave.room = m.room
    return pb.SerializeToString()


def _encode_send(m: Send) -> bytes:
    pb = _ClientPb()
    s = pb.send
    s.room = m.room
    s.body = m.body
    if m.ref is not None:
        s.ref = m.ref
    return pb.SerializeToString()


def _encode_history_request(m: HistoryRequest) -> bytes:
    pb = _ClientPb()
    h = pb.history
    h.room = m.room
    if m.before is not None:
        h.before = m.before
    if m.limit is not None:
        h.limit = m.limit
    return pb.SerializeToString()


# ---- server messages ---------------------------------------------------------


def _decode_welcome(pb: Any) -> Welcome:
    w = pb.welcome
    return Welcome(user=w.user, codec=w.codec)


def _decode_joined(pb: Any) -> Joined:
    j = pb.joined
    return Joined(room=j.room, members=list(j.members), last_seq=j.last_seq)


def _decode_presence(pb: Any) -> Presence:
    p = pb.presence
    return Presence(room=p.room, user=p.user, event=p.event)


def _chat_message(c: Any) -> Message:
    """Return the typed form of one ``ChatMessage``."""
    return Message(
        room=c.room,
        seq=c.seq,
        user=c.user,
        body=c.body,
        ts=c.ts,
        ref=c.ref if c.HasField("ref") else None,
    )


def _decode_message(pb: Any) -> Message:
    return _chat_message(pb.message)


def _decode_ack(pb: Any) -> Ack:
    a = pb.ack
    return Ack(room=a.room, seq=a.seq, ref=a.ref if a.HasField("ref") else None)


def _decode_history(pb: Any) -> History:
    h = pb.history
    return History(room=h.room, messages=[_chat_message(c) for c in h.messages])


def _decode_error(pb: Any) -> Error:
    e = pb.error
    return Error(code=e.code, detail=e.detail, ref=e.ref if e.HasField("ref") else None)


def _encode_welcome(m: Welcome) -> bytes:
    pb = _ServerPb()
    w = pb.welcome
    w.user = m.user
    w.codec = m.codec
    return pb.SerializeToString()


def _encode_joined(m: Joined) -> bytes:
    pb = _ServerPb()
    j = pb.joined
    j.room = m.room
    j.members.extend(m.members)
    j.last_seq = m.last_seq
    return pb.SerializeToString()


def _encode_presence(m: Presence) -> bytes:
    pb = _ServerPb()
    p = pb.presence
    p.room = m.room
    p.user = m.user
    p.event = m.event
    return pb.SerializeToString()


def _fill_chat_message(c: Any, m: Message) -> None:
    """Set every field of the ``ChatMessage`` ``c`` from ``m``."""
    c.room = m.room
    c.seq = m.seq
    c.user = m.user
    c.body = m.body
    c.ts = m.ts
    if m.ref is not None:
        c.ref = m.ref


def _encode_message(m: Message) -> bytes:
    # the hot path of every broadcast: _fill_chat_message inlined
    pb = _ServerPb()
    c = pb.message
    c.room = m.room
    c.seq = m.seq
    c.user = m.user
    c.body = m.body
    c.ts = m.ts
    if m.ref is not None:
        c.ref = m.ref
    return pb.SerializeToString()


def _encode_ack(m: Ack) -> bytes:
    pb = _ServerPb()
    a = pb.ack
    a.room = m.room
    a.seq = m.seq
    if m.ref is not None:
        a.ref = m.ref
    return pb.SerializeToString()


def _encode_history(m: History) -> bytes:
    pb = _ServerPb()
    h = pb.history
    h.room = m.room
    add = h.messages.add
    for message in m.messages:
        _fill_chat_message(add(), message)
    return pb.SerializeToString()


def _encode_error(m: Error) -> bytes:
    pb = _ServerPb()
    e = pb.error
    e.code = m.code
    e.detail = m.detail
    if m.ref is not None:
        e.ref = m.ref
    return pb.SerializeToString()


# Keyed by the oneof field name (decoding) and by the Struct class (encoding).
_CLIENT_DECODERS: dict[str | None, Callable[[Any], ClientMessage]] = {
    "join": _decode_join,
    "leave": _decode_leave,
    "send": _decode_send,
    "history": _decode_history_request,
}
_CLIENT_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    Join: _encode_join,
    Leave: _encode_leave,
    Send: _encode_send,
    HistoryRequest: _encode_history_request,
}
_SERVER_DECODERS: dict[str | None, Callable[[Any], ServerMessage]] = {
    "welcome": _decode_welcome,
    "joined": _decode_joined,
    "presence": _decode_presence,
    "message": _decode_message,
    "ack": _decode_ack,
    "history": _decode_history,
    "error": _decode_error,
}
_SERVER_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    Welcome: _encode_welcome,
    Joined: _encode_joined,
    Presence: _encode_presence,
    Message: _encode_message,
    Ack: _encode_ack,
    History: _encode_history,
    Error: _encode_error,
}


def _wrong_frame(frame: object) -> CodecError:
    """Return the ``unsupported`` for anything but a binary frame."""
    if isinstance(frame, str):
        return CodecError(ErrorCode.UNSUPPORTED, "text frame on a protobuf connection")
    return CodecError(ErrorCode.UNSUPPORTED, f"expected a binary frame, got {type(frame).__name__}")


_NO_KIND = "no kind set (empty or unknown oneof field)"


_Decoded = TypeVar("_Decoded")


def _protobuf_decoder(
    from_bytes: Callable[[Any], Any],
    decoders: dict[str | None, Callable[[Any], _Decoded]],
    doc: str,
) -> Callable[[ProtobufCodec, bytes | str], _Decoded]:
    """Return a ``decode_*`` method parsing with ``from_bytes``: one code path for both sides."""

    def decode(self: ProtobufCodec, frame: bytes | str) -> _Decoded:
        try:
            pb = from_bytes(frame)
        except DecodeError as exc:
            raise CodecError(_BAD_REQUEST, f"invalid protobuf: {exc}") from None
        except TypeError:  # a str, or not a frame at all
            raise _wrong_frame(frame) from None
        kind_decoder = decoders.get(pb.WhichOneof("kind"))
        if kind_decoder is None:
            raise CodecError(_BAD_REQUEST, _NO_KIND)
        return kind_decoder(pb)

    decode.__doc__ = doc
    return decode


class ProtobufCodec(Codec):
    """``SERIALIZER=protobuf``: binary frames holding a ``ClientMessage``/``ServerMessage``.

    Decoding accepts bytes-like frames only; anything the parser refuses
    (truncated, corrupt, invalid UTF-8 in a string) or a message with no kind set
    is a :class:`CodecError` ``bad_request``; a ``str`` is ``unsupported``.
    """

    name = "protobuf"
    subprotocol = "chatlab.protobuf"
    binary = True

    decode_client = _protobuf_decoder(
        _client_from_bytes,
        _CLIENT_DECODERS,
        "Turn a binary frame into a client message, or raise ``CodecError``.",
    )
    decode_server = _protobuf_decoder(
        _server_from_bytes,
        _SERVER_DECODERS,
        "Client side: turn a binary frame into a server message, or raise ``CodecError``.",
    )

    def encode_server(self, message: ServerMessage) -> bytes:
        """Return the serialized ``ServerMessage`` holding ``message``."""
        return _SERVER_ENCODERS[message.__class__](message)

    def encode_client(self, message: ClientMessage) -> bytes:
        """Client side: return the serialized ``ClientMessage`` holding ``message``."""
        return _CLIENT_ENCODERS[message.__class__](message)
