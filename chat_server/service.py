"""The chat service: the core wired to the history store and the broker, on the event loop.

The transport calls :meth:`ChatService.open`, :meth:`~ChatService.on_frame` and
:meth:`~ChatService.close` for each connection; everything that waits (history
reads, paced replay, the store's group commit) is orchestrated here, while the
rules live in :mod:`chat_server.core`. A ``send`` is acked and broadcast only in
:meth:`~ChatService._on_batch`, after the store committed it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from chat_server.broker.memory import MemoryBroker
from chat_server.codecs.base import Codec
from chat_server.core.chat import ChatCore, CloseConnection, SendFrame, Session
from chat_server.errors import ChatError, ErrorCode, ProtocolError, StoreError
from chat_server.messages import History, HistoryRequest, Join, Leave, Message, Send
from chat_server.settings import Settings
from chat_server.store.base import BatchResult
from chat_server.store.sqlite import SqliteHistoryStore

log = logging.getLogger("chat_server")

REPLAY_PAGE = 200
#: REGRESSION=blocking_loop: how long each send blocks the event loop
BLOCKING_LOOP_S = 0.001

SendPaced = Callable[[bytes], Awaitable[None]]


class ChatService:
    """One process's chat: sessions, rooms, durable history and fan-out."""

    def __init__(self, settings: Settings, codec: Codec) -> None:
        self.settings = settings
        self.codec = codec
        self.store = SqliteHistoryStore(
            path=settings.chat_db,
            on_batch=self._on_batch,
            synchronous=settings.chat_db_synchronous,
            queue_max=settings.store_queue_max,
            # REGRESSION=commit_per_message: one transaction per message, no group commit
            batch_max=1
            if settings.regression == "commit_per_message"
            else settings.store_batch_max,
            history_max=settings.history_max,
        )
        self.broker = MemoryBroker(self._deliver)
        self.core = ChatCore(
            codec,
            self.store.last_seq,
            max_body_chars=settings.max_body_chars,
            max_protocol_errors=settings.max_protocol_errors,
            rate_limit_per_s=settings.rate_limit_per_s,
            rate_limit_burst=settings.rate_limit_burst,
            room_opened=self.broker.subscribe,
            room_closed=self.broker.unsubscribe,
        )
        self.decode = codec.decode_client
        self.draining = False
        self._paced: dict[Session, SendPaced] = {}
        self._replays: dict[tuple[Session, str], asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._handlers: dict[type, Callable[[Session, Any], None]] = {
            Send: self._send,
            Join: self._join,
            Leave: self._leave,
            HistoryRequest: self._history,
        }
        # deliberate mistakes for the lab, chosen once here (REGRESSION, loud at start)
        if settings.regression == "encode_per_recipient":
            self.core.deliver = self.core.deliver_encoding_per_recipient  # type: ignore[method-assign]
        if settings.regression == "blocking_loop":
            self._handlers[Send] = self._send_blocking

    async def start(self) -> None:
        """Open the history store and the broker."""
        await self.store.start()
        await self.broker.start()

    # ---- connections, called by the transport ------------------------------------------

    def open(
        self, user: str, send: SendFrame, send_paced: SendPaced, close: CloseConnection
    ) -> Session:
        """Register a connection that passed the handshake; sends ``welcome``."""
        session = self.core.open_session(user, send, close, time.monotonic())
        self._paced[session] = send_paced
        return session

    def disconnect(self, session: Session) -> None:
        """Forget a connection that closed, for whatever reason."""
        self.core.close_session(session)
        self._paced.pop(session, None)
        for room in list(session.rooms):
            self._cancel_replay(session, room)

    @property
    def connections(self) -> int:
        """Open sessions."""
        return len(self.core.sessions)

    def on_frame(self, session: Session, frame: bytes | str) -> None:
        """Handle one received frame: rate limit, decode, dispatch; errors become frames."""
        core = self.core
        if session.closed:
            return
        if not core.take_token(session, time.monotonic()):
            core.rate_limited(session, time.monotonic())
            return
        try:
            message = self.decode(frame)
            self._handlers[type(message)](session, message)
        except ProtocolError as exc:
            core.fail(session, exc)
        except Exception:
            log.exception("internal error while handling a frame from %s", session.user)
            core.fail(session, ProtocolError(ErrorCode.INTERNAL, "the server failed"))

    # ---- handlers --------------------------------------------------------------------

    def _send(self, session: Session, message: Send) -> None:
        stored = self.core.accept_send(session, message, time.time_ns() // 1_000_000)
        if self.draining:
            raise ProtocolError(ErrorCode.UNAVAILABLE, "server is shutting down", message.ref)
        try:
            self.store.submit(stored, session)
        except StoreError as exc:
            raise ProtocolError(exc.code, str(exc), message.ref) from None

    def _on_batch(self, result: BatchResult) -> None:
        core = self.core
        if result.error is not None:
            error = ProtocolError(result.error.code, f"not stored: {result.error}")
            for message, session in result.items:
                core.store_failed(session, message, error)
            return
        publish = self.broker.publish
        ack = core.ack
        for message, session in result.items:
            publish(message)
            ack(session, message)

    def _deliver(self, message: Message) -> None:
        self.core.deliver(message)

    def _send_blocking(self, session: Session, message: Send) -> None:
        """REGRESSION=blocking_loop: a blocking call on the event loop before each send.

        The classic ``time.sleep`` where ``await asyncio.sleep`` was meant (or a
        synchronous database or HTTP client inside a handler): every connection
        waits while it runs.
        """
        time.sleep(BLOCKING_LOOP_S)
        self._send(session, message)

    def _join(self, session: Session, message: Join) -> None:
        if self.core.join(session, message):
            self._cancel_replay(session, message.room)
            task = self._spawn(self._replay(session, message.room, message.since or 0))
            self._replays[(session, message.room)] = task

    def _leave(self, session: Session, message: Leave) -> None:
        self.core.leave(session, message)
        self._cancel_replay(session, message.room)

    def _history(self, session: Session, message: HistoryRequest) -> None:
        limit = self.core.check_history(message)
        self._spawn(self._answer_history(session, message.room, message.before, limit))

    # ---- waiting work ----------------------------------------------------------------

    async def _replay(self, session: Session, room: str, since: int) -> None:
        """Send stored messages after ``since`` at the client's reading pace, then go live."""
        encode = self.codec.encode_server
        send_paced = self._paced.get(session)
        cursor = since
        try:
            while send_paced is not None and not self.core.replay_caught_up(session, room, cursor):
                page = await self.store.after(room, cursor, REPLAY_PAGE)
                if not page:
                    # trimmed or not yet readable: nothing stored after the cursor
                    cursor = max(cursor, self.store.last_seq(room))
                    continue
                for stored in page:
                    await send_paced(encode(stored))
                cursor = page[-1].seq
        except (ChatError, ConnectionError) as exc:
            log.info("replay of %s for %s stopped: %s", room, session.user, exc)
            if not session.closed:
                self.core.fail(session, ProtocolError(ErrorCode.UNAVAILABLE, "replay failed"))
        finally:
            if self._replays.get((session, room)) is asyncio.current_task():
                del self._replays[(session, room)]

    def _cancel_replay(self, session: Session, room: str) -> None:
        task = self._replays.pop((session, room), None)
        if task is not None:
            task.cancel()

    async def _answer_history(
        self, session: Session, room: str, before: int | None, limit: int
    ) -> None:
        """Read a page and send it, cut from the oldest end to fit ``MAX_HISTORY_BYTES``."""
        try:
            page = await self.store.history(room, before, limit)
        except StoreError as exc:
            self.core.fail(session, ProtocolError(exc.code, f"history not read: {exc}"))
            return
        if session.closed:
            return
        frame = self.history_frame(room, page)
        session.send(frame)

    def history_frame(self, room: str, page: list[Message]) -> bytes:
        """Encode a history reply holding the newest messages of ``page`` that fit the limit."""
        encode = self.codec.encode_server
        max_bytes = self.settings.max_history_bytes
        frame = encode(History(room=room, messages=page))
        while len(frame) > max_bytes and page:
            keep = min(len(page) - 1, len(page) * max_bytes // len(frame))
            page = page[len(page) - keep :] if keep > 0 else []
            frame = encode(History(room=room, messages=page))
        return frame

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- shutdown --------------------------------------------------------------------

    async def drain(self) -> None:
        """Refuse new sends, then commit what was accepted and deliver its messages and acks."""
        self.draining = True
        await self.store.flush()

    async def close(self) -> None:
        """Stop background work and close the store and broker."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.store.close()
        await self.broker.close()

    def stats(self) -> dict[str, Any]:
        """Counters for /stats and tests."""
        return {
            "connections": self.connections,
            "rooms": len(self.core.rooms),
            "draining": self.draining,
            "store": dataclasses.asdict(self.store.stats()),
        }
