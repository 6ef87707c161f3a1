"""The contract's JSON form over ``orjson`` (``SERIALIZER=orjson``, the default)."""

from __future__ import annotations

import orjson

from chat_server.codecs.json import JsonFormCodec


class OrjsonCodec(JsonFormCodec):
    """``SERIALIZER=orjson``: orjson parses and dumps; its bytes are the frame.

    orjson itself refuses what the standard library would let through to the
    checks: lone surrogates, NaN/Infinity, nesting past 1024 levels; an integer
    past 64 bits parses as a float and is then refused as mistyped.
    """

    name = "orjson"
    _loads = staticmethod(orjson.loads)
    _dumps = staticmethod(orjson.dumps)
