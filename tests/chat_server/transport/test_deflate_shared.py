"""``WS_DEFLATE=shared`` on each transport: permessage-deflate without context takeover,
each broadcast compressed once for every member that negotiated it.

The clients are websockets' own, with a recording extension beside its permessage-deflate
(:class:`Recording`): it keeps every data frame's payload as it came off the wire, before
the client inflates it, and may replace what the client sends with bytes of its choosing.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.extensions import ClientExtensionFactory, Extension
from websockets.extensions.permessage_deflate import (
    ClientPerMessageDeflateFactory,
    PerMessageDeflate,
)
from websockets.frames import CTRL_OPCODES, Frame
from websockets.typing import ExtensionParameter

from chat_server.messages import Ack, Join, Joined, Message, Presence, Welcome
from tests.support import Client, KeyPair, ServerProcess

pytestmark = pytest.mark.transports

DEFLATE_MEMBERS = 10
MESSAGES = 5
#: a payload RFC 7692 would have a server inflate, that no deflate stream starts with
#: (block type 3 is reserved)
NOT_DEFLATE = b"\xff\xff\xff\xff"


class Recording(ClientExtensionFactory):
    """websockets' client permessage-deflate, offering no context takeover either way;
    the extension it negotiates records raw frames and may be told what to send."""

    name = ClientPerMessageDeflateFactory.name

    def __init__(self) -> None:
        self._inner = ClientPerMessageDeflateFactory(
            server_no_context_takeover=True, client_no_context_takeover=True
        )
        self.extension: RecordingDeflate | None = None

    def get_request_params(self) -> Sequence[ExtensionParameter]:
        return self._inner.get_request_params()

    def process_response_params(
        self, params: Sequence[ExtensionParameter], accepted_extensions: Sequence[Extension]
    ) -> Extension:
        self.extension = RecordingDeflate(
            self._inner.process_response_params(params, accepted_extensions)
        )
        return self.extension


class RecordingDeflate(Extension):
    """A negotiated permessage-deflate that keeps (rsv1, payload) of each data frame read."""

    name = PerMessageDeflate.name

    def __init__(self, inner: PerMessageDeflate) -> None:
        self.inner = inner
        self.raw: list[tuple[bool, bytes]] = []
        #: the next data frame goes out with these bytes as its payload, RSV1 set
        self.replace_next: bytes | None = None

    def decode(self, frame: Frame, *, max_size: int | None = None) -> Frame:
        if frame.opcode not in CTRL_OPCODES:
            self.raw.append((frame.rsv1, bytes(frame.data)))
        return self.inner.decode(frame, max_size=max_size)

    def encode(self, frame: Frame) -> Frame:
        if frame.opcode in CTRL_OPCODES or self.replace_next is None:
            return self.inner.encode(frame)
        data, self.replace_next = self.replace_next, None
        return Frame(frame.opcode, data, True, True)


async def _connect(server: ServerProcess, keys: KeyPair, user: str) -> tuple[Client, Recording]:
    recording = Recording()
    client = await Client.connect(server, keys.mint(user), compression=None, extensions=[recording])
    await client.expect(Welcome)
    return client, recording


def _inflate_alone(payload: bytes) -> bytes:
    """``payload`` inflated by a fresh raw inflater, as a client without context reads it."""
    return zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff")


async def test_a_broadcast_reaches_every_deflate_member_as_the_same_compressed_bytes(
    start_server, keys: KeyPair
) -> None:
    server = start_server(ws_deflate="shared")
    members = [await _connect(server, keys, f"zip{i}") for i in range(DEFLATE_MEMBERS)]
    plain = await Client.connect(server, keys.mint("plain"))  # offers no extension
    await plain.expect(Welcome)
    for client, recording in members:
        assert recording.extension is not None, "shared deflate was not negotiated"
        answer = client.conn.response.headers["Sec-WebSocket-Extensions"]
        assert "server_no_context_takeover" in answer and "client_no_context_takeover" in answer
        await client.join("zipped")
    await plain.join("zipped")
    assert plain.conn.response.headers.get("Sec-WebSocket-Extensions") is None
    # bodies of the demo's length and longer, sent by a member with and one without deflate
    bodies = [f"message {n} " + "lorem ipsum dolor " * (n * 20) for n in range(MESSAGES)]
    for n, body in enumerate(bodies):
        await (members[0][0] if n % 2 else plain).say("zipped", body)

    async def delivered(client: Client) -> list[Message]:
        seen: list[Message] = []
        while len(seen) < MESSAGES:
            frame = await client.recv()
            if isinstance(frame, Message):
                seen.append(frame)
        return seen

    seen = [[(m.seq, m.body) for m in await delivered(c)] for c, _ in [*members, (plain, None)]]
    assert sorted(body for _, body in seen[0]) == sorted(bodies)
    assert all(messages == seen[0] for messages in seen), "members saw different messages"
    # what each deflate member read off the wire: the messages' frames, compressed
    wire: list[list[bytes]] = []
    for client, recording in members:
        assert recording.extension is not None
        decoded = [
            (rsv1, payload, client.codec.decode_server(_inflate_alone(payload).decode()))
            for rsv1, payload in recording.extension.raw
        ]
        assert all(rsv1 for rsv1, _, _ in decoded), "a frame to a deflate member went plain"
        kinds = {type(m) for _, _, m in decoded}
        assert {Welcome, Joined, Message} <= kinds <= {Welcome, Joined, Presence, Message, Ack}
        wire.append([payload for _, payload, m in decoded if isinstance(m, Message)])
    assert all(len(payloads) == MESSAGES for payloads in wire)
    assert all(payloads == wire[0] for payloads in wire), "members got different compressed bytes"
    # and compressed: the longest body's frame is far smaller than the body
    assert min(len(payload) for payload in wire[0]) < len(bodies[-1]) // 4
    assert max(len(payload) for payload in wire[0]) < len(bodies[-1]) // 4


async def _closed_with(client: Client) -> int | None:
    try:
        while True:
            await asyncio.wait_for(client.conn.recv(), 10)
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None


async def test_compressed_input_zlib_refuses_closes_1007(start_server, keys: KeyPair) -> None:
    server = start_server(ws_deflate="shared")
    client, recording = await _connect(server, keys, "garbler")
    assert recording.extension is not None
    recording.extension.replace_next = NOT_DEFLATE
    await client.send(Join(room="lobby"))  # its frame goes out as NOT_DEFLATE
    assert await _closed_with(client) == 1007
    # the connection before it, and the server, are fine: a second client chats
    other, _ = await _connect(server, keys, "other")
    assert (await other.join("lobby")).members == ["other"]
    await other.close()


async def test_a_message_inflating_past_max_frame_bytes_closes_1009(
    start_server, keys: KeyPair
) -> None:
    server = start_server(ws_deflate="shared", max_frame_bytes=4096)
    client, recording = await _connect(server, keys, "bomber")
    await client.send_raw("x" * 5000)  # a few dozen bytes compressed
    assert recording.extension is not None
    assert await _closed_with(client) == 1009
    fine, _ = await _connect(server, keys, "fine")
    await fine.send_raw("{" * 4000)  # inflates under the bound: bad_request, no close
    assert (await fine.recv()).code == "bad_request"  # type: ignore[union-attr]
    await fine.close()
