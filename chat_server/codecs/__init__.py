"""Codecs: one per ``SERIALIZER`` value, chosen once at start with :func:`get_codec`."""

from __future__ import annotations

from google.protobuf.internal import api_implementation

from chat_server.codecs.base import Codec
from chat_server.codecs.json import JsonCodec
from chat_server.codecs.orjson import OrjsonCodec
from chat_server.codecs.protobuf import ProtobufCodec

__all__ = ["CODEC_NAMES", "Codec", "get_codec", "protobuf_backend"]

_CODECS: dict[str, type[Codec]] = {
    JsonCodec.name: JsonCodec,
    OrjsonCodec.name: OrjsonCodec,
    ProtobufCodec.name: ProtobufCodec,
}

#: every valid ``SERIALIZER`` value
CODEC_NAMES: tuple[str, ...] = tuple(_CODECS)


def get_codec(name: str) -> Codec:
    """Return the codec for a ``SERIALIZER`` value; raise ValueError naming the valid ones."""
    try:
        return _CODECS[name]()
    except KeyError:
        allowed = ", ".join(CODEC_NAMES)
        raise ValueError(f"unknown serializer {name!r} (allowed: {allowed})") from None


def protobuf_backend() -> str:
    """Return the protobuf runtime in use: ``"upb"``, ``"cpp"`` or ``"python"``."""
    return api_implementation.Type()
