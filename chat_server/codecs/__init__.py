"""Codecs: one per ``SERIALIZER`` value, chosen once at start with :func:`get_codec`.

Only the chosen codec's module is imported (protobuf's runtime is not loaded for JSON).
"""

from __future__ import annotations

import importlib

from chat_server.codecs.base import Codec

__all__ = ["CODEC_NAMES", "Codec", "get_codec", "protobuf_backend"]

#: ``SERIALIZER`` value -> the module and class of its codec
_CODECS: dict[str, tuple[str, str]] = {
    "json": ("chat_server.codecs.json", "JsonCodec"),
    "orjson": ("chat_server.codecs.orjson", "OrjsonCodec"),
    "protobuf": ("chat_server.codecs.protobuf", "ProtobufCodec"),
}

#: every valid ``SERIALIZER`` value
CODEC_NAMES: tuple[str, ...] = tuple(_CODECS)


def get_codec(name: str) -> Codec:
    """Return the codec for a ``SERIALIZER`` value; raise ValueError naming the valid ones."""
    try:
        module, cls = _CODECS[name]
    except KeyError:
        allowed = ", ".join(CODEC_NAMES)
        raise ValueError(f"unknown serializer {name!r} (allowed: {allowed})") from None
    codec: Codec = getattr(importlib.import_module(module), cls)()
    return codec


def protobuf_backend() -> str:
    """Return the protobuf runtime in use: ``"upb"``, ``"cpp"`` or ``"python"``."""
    from google.protobuf.internal import api_implementation  # noqa: PLC0415 (only when asked)

    return api_implementation.Type()
