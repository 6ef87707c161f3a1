"""The contract's JSON form over the standard library ``json`` (``SERIALIZER=json``).

:class:`JsonFormCodec` holds what every JSON codec shares: text frames only, the
``type`` dispatch, structural checks by ``msgspec.convert`` and the exact JSON of
each kind; a subclass only says how to parse text and how to dump a dict to bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import msgspec

from chat_server.codecs.base import Codec
from chat_server.errors import CodecError, ErrorCode
from chat_server.messages import (
    CLIENT_KINDS,
    SERVER_KINDS,
    Ack,
    Message,
    Send,
)

#: the longest ``ref`` an error frame echoes back (the contract's limit for ``ref``)
MAX_ECHOED_REF_CHARS = 64
#: the longest piece of client input quoted in an error's detail
_MAX_QUOTED_CHARS = 32

_convert = msgspec.convert
_to_builtins = msgspec.to_builtins
_ValidationError = msgspec.ValidationError
_BAD_REQUEST = ErrorCode.BAD_REQUEST

_JSON_TYPE_NAMES: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


# ---- encoding: the exact JSON of each kind -----------------------------------
# Hand-built dicts for the hot kinds measured faster than msgspec.to_builtins
# (see bench/codecs.py); they give the same keys in the same order and, like the
# Structs' omit_defaults, leave out an optional field that is None.


def _message_dict(m: Message) -> dict[str, Any]:
    d: dict[str, Any] = {
        "type": "message",
        "room": m.room,
        "seq": m.seq,
        "user": m.user,
        "body": m.body,
        "ts": m.ts,
    }
    if m.ref is not None:
        d["ref"] = m.ref
    return d


def _ack_dict(m: Ack) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "ack", "room": m.room, "seq": m.seq}
    if m.ref is not None:
        d["ref"] = m.ref
    return d


def _send_dict(m: Send) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "send", "room": m.room, "body": m.body}
    if m.ref is not None:
        d["ref"] = m.ref
    return d


_ToDict = Callable[[Any], Any]
_SERVER_DICTS: dict[type, _ToDict] = {cls: _to_builtins for cls in SERVER_KINDS.values()}
_SERVER_DICTS |= {Message: _message_dict, Ack: _ack_dict}
_CLIENT_DICTS: dict[type, _ToDict] = {cls: _to_builtins for cls in CLIENT_KINDS.values()}
_CLIENT_DICTS[Send] = _send_dict


# ---- decoding errors: off the hot path ----------------------------------------


def _quote(value: str) -> str:
    """Return ``value`` quoted for an error detail, cut to a few dozen characters."""
    if len(value) > _MAX_QUOTED_CHARS:
        return repr(value[:_MAX_QUOTED_CHARS]) + "..."
    return repr(value)


def _echoed_ref(obj: object) -> str | None:
    """Return the frame's ``ref`` if it is one an error frame may echo, else None."""
    if obj.__class__ is dict:
        ref = obj.get("ref")  # type: ignore[attr-defined]
        if ref.__class__ is str and len(ref) <= MAX_ECHOED_REF_CHARS:
            return ref
    return None


def _kind_error(obj: object, kinds: dict[str, Any]) -> CodecError:
    """Return the ``bad_request`` for a parsed frame whose ``type`` names no kind."""
    if obj.__class__ is not dict:
        what = _JSON_TYPE_NAMES.get(obj.__class__, obj.__class__.__name__)
        return CodecError(_BAD_REQUEST, f"expected a JSON object, got {what}")
    ref = _echoed_ref(obj)
    if "type" not in obj:  # type: ignore[operator]
        return CodecError(_BAD_REQUEST, "Object missing required field `type`", ref)
    kind = obj["type"]  # type: ignore[index]
    if kind.__class__ is not str:
        what = _JSON_TYPE_NAMES.get(kind.__class__, kind.__class__.__name__)
        return CodecError(_BAD_REQUEST, f"`type` must be a string, got {what}", ref)
    known = ", ".join(kinds)
    return CodecError(_BAD_REQUEST, f"unknown type {_quote(kind)} (expected one of {known})", ref)


def _wrong_frame(frame: object) -> CodecError:
    """Return the ``unsupported`` for anything but a text frame."""
    if isinstance(frame, bytes | bytearray | memoryview):
        return CodecError(ErrorCode.UNSUPPORTED, "binary frame on a JSON connection")
    return CodecError(ErrorCode.UNSUPPORTED, f"expected a text frame, got {type(frame).__name__}")


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _convert_or_raise(obj: dict[str, Any], cls: type[Any]) -> Any:
    """``msgspec.convert`` with its failure as the ``bad_request`` naming the field."""
    try:
        return _convert(obj, cls)
    except (_ValidationError, RecursionError) as exc:
        raise CodecError(_BAD_REQUEST, _too_big_detail(obj) or str(exc), _echoed_ref(obj)) from None


def _too_big_detail(obj: dict[str, Any]) -> str | None:
    """The detail for an integer field past 64 bits, which orjson parsed as a float.

    msgspec would call it a mistyped ``float``, which the client never sent.
    """
    for name, value in obj.items():
        if (
            value.__class__ is float
            and value.is_integer()
            and not _INT64_MIN <= value <= _INT64_MAX
        ):
            return f"`{_quote(name)[1:-1]}` is out of range: integers here are 64-bit"
    return None


def _decode_send(obj: dict[str, Any]) -> Send:
    """A ``send`` from a parsed object: checked by hand when well formed, else by convert.

    The hot kinds are checked by hand (cheaper than convert, measured in
    ``bench/codecs.py``); anything unusual goes to convert, which gives the precise
    error, so both paths accept and refuse exactly the same frames.
    """
    try:
        room = obj["room"]
        body = obj["body"]
    except KeyError:
        return _convert_or_raise(obj, Send)  # type: ignore[no-any-return]
    ref = obj.get("ref")
    if room.__class__ is str and body.__class__ is str and (ref is None or ref.__class__ is str):
        return Send(room=room, body=body, ref=ref)
    return _convert_or_raise(obj, Send)  # type: ignore[no-any-return]


def _decode_message(obj: dict[str, Any]) -> Message:
    """A ``message`` (client side) from a parsed object, like :func:`_decode_send`."""
    try:
        room, seq, user = obj["room"], obj["seq"], obj["user"]
        body, ts = obj["body"], obj["ts"]
    except KeyError:
        return _convert_or_raise(obj, Message)  # type: ignore[no-any-return]
    ref = obj.get("ref")
    if (
        room.__class__ is str
        and user.__class__ is str
        and body.__class__ is str
        and seq.__class__ is int
        and ts.__class__ is int
        and _INT64_MIN <= seq <= _INT64_MAX
        and _INT64_MIN <= ts <= _INT64_MAX
        and (ref is None or ref.__class__ is str)
    ):
        return Message(room=room, seq=seq, user=user, body=body, ts=ts, ref=ref)
    return _convert_or_raise(obj, Message)  # type: ignore[no-any-return]


_FAST_DECODERS: dict[type, Callable[[dict[str, Any]], Any]] = {
    Send: _decode_send,
    Message: _decode_message,
}


_Decoded = TypeVar("_Decoded")


def _json_decoder(
    kinds: dict[str, type[_Decoded]], loads: Callable[[str], Any]
) -> Callable[[bytes | str], _Decoded]:
    """Return a ``decode_*`` function for one direction's ``kinds``: one code path for both."""
    decoders: dict[str, Callable[[dict[str, Any]], Any]] = {
        name: _FAST_DECODERS.get(cls) or partial(_convert_or_raise, cls=cls)
        for name, cls in kinds.items()
    }

    def decode(frame: bytes | str) -> _Decoded:
        if frame.__class__ is not str:
            raise _wrong_frame(frame)
        try:
            obj = loads(frame)  # type: ignore[arg-type]
        except (ValueError, RecursionError) as exc:
            raise CodecError(_BAD_REQUEST, f"invalid JSON: {exc}") from None
        try:
            decoder = decoders[obj["type"]]
        except (KeyError, TypeError, IndexError):
            raise _kind_error(obj, kinds) from None
        return decoder(obj)  # type: ignore[no-any-return]

    return decode


def _json_encoder(
    to_dict: dict[type, _ToDict], dumps: Callable[[Any], bytes]
) -> Callable[[Any], bytes]:
    """Return an ``encode_*`` function: the kind's dict, dumped."""

    def encode(message: Any) -> bytes:
        return dumps(to_dict[message.__class__](message))

    return encode


class JsonFormCodec(Codec):
    """Base of the JSON codecs: the contract's JSON form over a subclass's parser.

    Decoding accepts only ``str`` (a text frame) and returns a message whose fields
    have exactly the Struct's types (no bool for an int, integers within int64);
    every failure is a :class:`CodecError`. Encoding returns compact UTF-8 JSON
    with the contract's keys, optional fields left out when None.
    """

    subprotocol = "chatlab.json"
    binary = False

    @staticmethod
    def _loads(text: str) -> Any:
        """Parse JSON text; raise ValueError or RecursionError when it is not valid."""
        raise NotImplementedError

    @staticmethod
    def _dumps(obj: Any) -> bytes:
        """Return ``obj`` as compact UTF-8 JSON."""
        raise NotImplementedError

    def __init__(self) -> None:
        # the per-message functions are closures over this codec's parser and dumper,
        # bound once here: no method binding or attribute lookup per frame
        loads, dumps = type(self)._loads, type(self)._dumps
        self.decode_client = _json_decoder(CLIENT_KINDS, loads)
        self.decode_server = _json_decoder(SERVER_KINDS, loads)
        self.encode_server = _json_encoder(_SERVER_DICTS, dumps)
        self.encode_client = _json_encoder(_CLIENT_DICTS, dumps)


# ---- the standard library codec ----------------------------------------------

_encode_text = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_json_loads = json.loads


def _require_utf8_strings(obj: Any) -> None:
    """Raise UnicodeEncodeError if any string (key or value) in ``obj`` is not valid UTF-8.

    Only a lone surrogate (``"\\ud800"`` in the text, or in the ``str`` itself)
    fails; such a string could not be encoded into any outgoing frame.
    """
    stack = [obj]
    while stack:
        item = stack.pop()
        cls = item.__class__
        if cls is str:
            item.encode()
        elif cls is dict:
            for key, value in item.items():
                key.encode()
                stack.append(value)
        elif cls is list:
            stack.extend(item)


def _stdlib_loads(text: str) -> Any:
    obj = _json_loads(text)
    # A lone surrogate can only come from a \u escape or a non-ASCII str.
    if not text.isascii() or "\\u" in text:
        _require_utf8_strings(obj)
    return obj


def _stdlib_dumps(obj: Any) -> bytes:
    return _encode_text(obj).encode()


class JsonCodec(JsonFormCodec):
    """``SERIALIZER=json``: the standard library's parser and encoder."""

    name = "json"
    _loads = staticmethod(_stdlib_loads)
    _dumps = staticmethod(_stdlib_dumps)
