"""One websocket of the driver: picows' callbacks, the receive hot path, permessage-deflate."""

from __future__ import annotations

import asyncio
import zlib
from collections import Counter, deque
from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING

from picows import WSFrame, WSListener, WSMsgType, WSTransport
from websockets.extensions.permessage_deflate import (
    ClientPerMessageDeflateFactory,
    PerMessageDeflate,
)
from websockets.frames import Frame, Opcode
from websockets.headers import build_extension, parse_extension

from bench.lab.driver.frames import DIGITS, MARKER, header_bytes

if TYPE_CHECKING:
    from bench.lab.driver.run import Driver

#: bytes one connection may hold unsent; past it its sends are dropped and counted
MAX_BUFFERED_BYTES = 4 * 2**20
#: sends per connection remembered for ack latency; past it the oldest are forgotten
MAX_PENDING_ACKS = 65_536
#: largest frame accepted from the server
MAX_FRAME_BYTES = 2**20
_MARKER_LEN, _MARKER_END = len(MARKER), len(MARKER) + DIGITS


class SetupError(Exception):
    """A connection could not be opened or joined; the message says why."""


class Connection(WSListener):  # type: ignore[misc]
    """One websocket: its send frame, and picows' callbacks for what it receives."""

    __slots__ = (
        "ack_sent_ns",
        "close_code",
        "digits",
        "driver",
        "frame",
        "index",
        "last_error",
        "members",
        "paused",
        "record_ack",
        "record_digits",
        "record_received_ns",
        "ref_digits",
        "seen",
        "send",
        "transport",
        "wake",
        "wire_bytes",
    )

    def __init__(
        self,
        driver: Driver,
        index: int,
        members: int,
        frame: bytearray,
        digits: slice,
        *,
        ref_digits: slice | None = None,
    ) -> None:
        super().__init__()
        self.driver = driver
        self.index = index
        self.members = members
        self.frame = frame
        self.digits = digits
        self.ref_digits = ref_digits
        self.record_digits = driver.delivery_digits.extend
        self.record_received_ns = driver.delivery_received_ns.append
        self.record_ack = driver.ack_us.append
        # scheduled times of sends not acked yet, in order (chat: one ack per send)
        self.ack_sent_ns: deque[int] = deque(maxlen=MAX_PENDING_ACKS if driver.acks else 0)
        self.transport: WSTransport | None = None
        self.send: Callable[..., None] = _not_connected
        self.paused = False
        self.seen: Counter[str] = Counter()
        self.wake: asyncio.Future[None] | None = None
        self.close_code = ""
        self.last_error = ""
        # the deliveries' bytes as they came off the wire (header and payload, compressed
        # where deflate is on), ever: the driver sums them into each step at its flush
        self.wire_bytes = 0

    # picows callbacks ----------------------------------------------------------------------

    def on_ws_connected(self, transport: WSTransport) -> None:
        self.transport = transport
        self.send = transport.send

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        """The hot path: keep a delivery's digits and receive time (_flush parses them);
        anything else goes to :meth:`_other_frame`. It is :meth:`received` inlined (one
        Python call fewer per frame)."""
        payload = frame.get_payload_as_bytes()
        at = payload.find(MARKER)
        if at >= 0:
            self.record_digits(payload[at + _MARKER_LEN : at + _MARKER_END])
            self.record_received_ns(perf_counter_ns())
            size = len(payload)
            self.wire_bytes += size + 2 if size < 126 else size + header_bytes(size)
            return
        self._other_frame(transport, frame, payload)

    def received(
        self, transport: WSTransport, frame: WSFrame, payload: bytes, wire_size: int
    ) -> None:
        """:meth:`on_ws_frame` for a payload already read (DeflateConnection inflates it;
        ``wire_size`` is its payload's size as it came off the wire)."""
        at = payload.find(MARKER)
        if at >= 0:
            self.record_digits(payload[at + _MARKER_LEN : at + _MARKER_END])
            self.record_received_ns(perf_counter_ns())
            self.wire_bytes += wire_size + header_bytes(wire_size)
            return
        self._other_frame(transport, frame, payload)

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        self.driver.connection_lost(self)
        self._wake()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    # the rest ------------------------------------------------------------------------------

    def _other_frame(self, transport: WSTransport, frame: WSFrame, payload: bytes) -> None:
        """Anything but a delivery: acks, errors, the setup replies, close."""
        msg_type = frame.msg_type
        if msg_type == WSMsgType.CLOSE:
            self.close_code = str(frame.get_close_code().value)
            transport.send_close(frame.get_close_code(), frame.get_close_message())
            transport.disconnect()
            return
        if msg_type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return  # pings are answered by picows; pongs are not ours
        kind = self.driver.frame_kind(payload)
        if kind == "ack":
            if self.ack_sent_ns:
                self.record_ack((perf_counter_ns() - self.ack_sent_ns.popleft()) // 1000)
            return
        if kind == "presence":
            return
        self.seen[kind] += 1
        if kind == "error":
            if self.ack_sent_ns:
                self.ack_sent_ns.popleft()  # the send it answers will get no ack
            self.last_error, ref = self.driver.error_of(payload)
            self.driver.count_error(self.last_error)
            if self.last_error == "unavailable" and ref and self.ref_digits is not None:
                self.driver.retry_later(self.index, int(ref))
        elif kind not in ("welcome", "joined"):
            self.driver.count_error(f"unexpected {kind}")
        self._wake()

    def _wake(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    async def wait_for(self, kind: str) -> None:
        """Return once a frame of ``kind`` came; raise SetupError on an error frame or close."""
        while not self.seen[kind]:
            if self.seen["error"]:
                raise SetupError(f"connection {self.index}: {self.last_error} before {kind}")
            if self.transport is None or self.transport.is_disconnected:
                raise SetupError(f"connection {self.index}: closed before {kind}")
            self.wake = asyncio.get_running_loop().create_future()
            await self.wake

    def buffer_full(self) -> bool:
        """True when this connection holds more unsent bytes than :data:`MAX_BUFFERED_BYTES`."""
        assert self.transport is not None
        buffered = self.transport.underlying_transport.get_write_buffer_size()
        return bool(buffered > MAX_BUFFERED_BYTES)


#: the permessage-deflate offer, as browsers make it (and websockets' client by default)
_DEFLATE_FACTORY = ClientPerMessageDeflateFactory(
    client_max_window_bits=True, compress_settings={"memLevel": 5}
)
DEFLATE_OFFER = build_extension([(_DEFLATE_FACTORY.name, _DEFLATE_FACTORY.get_request_params())])
_OPCODES = {WSMsgType.TEXT: Opcode.TEXT, WSMsgType.BINARY: Opcode.BINARY}
_DEFLATE_TAIL = b"\x00\x00\xff\xff"
#: compressed payloads without context takeover and what they inflate to, shared by every
#: connection: a room's members get the same bytes for one broadcast (``WS_DEFLATE=shared``
#: compresses it once), so the driver inflates it once too; emptied when this full
_INFLATED_MAX = 4096
_inflated: dict[bytes, bytes] = {}


def negotiated_deflate(extensions_header: str | None) -> PerMessageDeflate | None:
    """The compressor the server's ``Sec-WebSocket-Extensions`` reply agreed on, or None."""
    if not extensions_header:
        return None
    for name, params in parse_extension(extensions_header):
        if name == _DEFLATE_FACTORY.name:
            return _DEFLATE_FACTORY.process_response_params(params, [])
    return None


class DeflateConnection(Connection):
    """A :class:`Connection` that offered permessage-deflate (RFC 7692): once the server
    accepted it, what it sends is compressed (rsv1 set) and what arrives compressed is
    inflated, by websockets' sans-I/O :class:`PerMessageDeflate` (context takeover kept);
    without context takeover, a payload is inflated once for every connection it reaches."""

    __slots__ = ("deflate", "deflate_params", "send_raw")

    def on_ws_connected(self, transport: WSTransport) -> None:
        super().on_ws_connected(transport)
        # the server's reply, as it came (Step.deflate_params)
        self.deflate_params = transport.response.headers.get("Sec-WebSocket-Extensions") or ""
        self.deflate = negotiated_deflate(self.deflate_params)
        if self.deflate is not None:
            self.send_raw = transport.send
            self.send = self._send_deflated

    def _send_deflated(self, msg_type: WSMsgType, message: bytes | bytearray) -> None:
        frame = self.deflate.encode(Frame(_OPCODES[msg_type], message))
        self.send_raw(msg_type, frame.data, True, True)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        payload = frame.get_payload_as_bytes()
        wire_size = len(payload)
        deflate = self.deflate
        if frame.rsv1 and deflate is not None:
            if frame.fin and frame.msg_type in _OPCODES:
                # the hot path, a whole compressed message: inflate it with the extension's
                # own decoder, without building websockets Frames (RFC 7692 7.2.2: append
                # the empty block's tail the sender removed)
                if deflate.remote_no_context_takeover:
                    inflated = _inflated.get(payload)
                    if inflated is None:
                        if len(_inflated) >= _INFLATED_MAX:
                            _inflated.clear()
                        decoder = zlib.decompressobj(wbits=-deflate.remote_max_window_bits)
                        inflated = decoder.decompress(payload + _DEFLATE_TAIL, MAX_FRAME_BYTES)
                        _inflated[payload] = inflated
                    payload = inflated
                else:
                    payload = deflate.decoder.decompress(payload + _DEFLATE_TAIL, MAX_FRAME_BYTES)
            else:
                compressed = Frame(_OPCODES[frame.msg_type], payload, frame.fin, True)
                payload = bytes(deflate.decode(compressed, max_size=MAX_FRAME_BYTES).data)
        self.received(transport, frame, payload, wire_size)


def _not_connected(*_: object) -> None:
    raise RuntimeError("send before the connection was opened")
