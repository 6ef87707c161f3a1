"""A connection's framing, chosen once by name at its handshake: what ``WS_DEFLATE`` gives
a connection that negotiated permessage-deflate, and which frame cache each framing takes."""

from __future__ import annotations

import zlib

import pytest

from chat_server.transport.base import WriteCoalescer
from chat_server.transport.deflate import Framing


@pytest.mark.parametrize(
    ("ws_deflate", "framing"),
    [
        ("off", Framing.PLAIN),
        ("on", Framing.PER_CONNECTION_DEFLATE),
        ("shared", Framing.SHARED_DEFLATE),
    ],
)
def test_ws_deflate_names_the_framing_of_a_negotiating_connection(ws_deflate, framing):
    assert Framing.of(ws_deflate) is framing


def test_each_framing_takes_its_own_frame_cache():
    coalescer = WriteCoalescer(binary=False, shared_deflate=True)
    plain = coalescer.frames(Framing.PLAIN).alone(b"hello")
    assert plain == b"\x81\x05hello"  # final text frame, unmasked, as sent
    deflated = coalescer.frames(Framing.SHARED_DEFLATE).alone(b"hello" * 20)
    assert deflated[0] == 0xC1  # final, RSV1 (compressed), text
    payload = deflated[2:]
    assert zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff") == b"hello" * 20
    # a framing this process does not offer has no cache
    with pytest.raises(KeyError):
        WriteCoalescer(binary=True).frames(Framing.SHARED_DEFLATE)
