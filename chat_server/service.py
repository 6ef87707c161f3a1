"""The chat service: the core wired to the history store and the broker, on the event loop.

The transport calls :meth:`ChatService.open`, :meth:`~ChatService.on_frame` and
:meth:`~ChatService.close` for each connection; everything that waits (history
reads, paced replay, the store's group commit) is orchestrated here, while the
rules live in :mod:`chat_server.core`. A ``send`` is acked and broadcast only in
:meth:`~ChatService._on_batch`, after the store committed it.

Two wirings, chosen once at start by ``BROKER``:

``memory``
    SQLite history, and the in-process broker: a committed batch is published
    (delivered to the room's members) and acked at once.
``redis``
    Redis history and broker, shared by every process. The store's commit
    script publishes, so a committed batch is only acked here; members hear the
    message from the broker's pub/sub listener. An ack waits until this process
    has delivered its message, so the sender sees its ``message`` before its
    ``ack`` as with one process. Joining a room this process does not hold yet
    waits for the broker to subscribe; the session's later frames wait behind
    the join, in order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

from chat_server.broker.base import Broker
from chat_server.broker.memory import MemoryBroker
from chat_server.codecs.base import Codec
from chat_server.core.chat import ChatCore, CloseConnection, SendFrame, Session
from chat_server.core.idempotency import RecentSends
from chat_server.core.validation import check_room, check_since
from chat_server.errors import (
    BrokerUnavailable,
    ChatError,
    ErrorCode,
    ProtocolError,
    StoreError,
)
from chat_server.messages import History, HistoryRequest, Join, Leave, Message, Send
from chat_server.metrics import Counters
from chat_server.settings import Settings
from chat_server.store.base import BatchResult, HistoryStore
from chat_server.store.sqlite import SqliteHistoryStore, WriterThreadHook

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from chat_server.broker.redis import RedisBroker

log = logging.getLogger("chat_server")

REPLAY_PAGE = 200
#: REGRESSION=blocking_loop: how long each send blocks the event loop
BLOCKING_LOOP_S = 0.001

#: frames a session may send while its join waits for the broker; past it: unavailable
HELD_FRAMES_MAX = 256
#: on SIGTERM with BROKER=redis: how long acks may wait for their message's delivery
ACK_DRAIN_WAIT_S = 2.0

SendPaced = Callable[[bytes], Awaitable[None]]
Frame = bytes | str


class ChatService:
    """One process's chat: sessions, rooms, durable history and fan-out.

    ``worker_index`` is this process' place among ``WORKERS`` (None when it runs
    alone); ``worker_id`` names it uniquely among every process sharing Redis.
    ``writer_hook`` (``PROFILE=cprofile``) runs on the SQLite history writer thread.
    """

    def __init__(
        self,
        settings: Settings,
        codec: Codec,
        worker_index: int | None = None,
        writer_hook: WriterThreadHook | None = None,
    ) -> None:
        self.settings = settings
        self.codec = codec
        self.worker_index = worker_index
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        # REGRESSION=commit_per_message: one transaction per message, no group commit
        batch_max = 1 if settings.regression == "commit_per_message" else settings.store_batch_max
        self.store: HistoryStore
        self.broker: Broker
        self._redis: Redis | None = None
        self._shared: RedisBroker | None = None
        self._pending_acks: dict[str, deque[tuple[Message, Session]]] = {}
        self.recent_sends = RecentSends(
            round(settings.send_ref_window_s * 1000), settings.send_ref_max
        )
        self._held: dict[Session, deque[Frame]] = {}
        self.counters = Counters()
        core_wiring: dict[str, Any]
        if settings.broker == "redis":
            core_wiring = self._wire_redis(settings, batch_max)
        else:
            self.store = SqliteHistoryStore(
                path=settings.chat_db,
                on_batch=self._reported,
                synchronous=settings.chat_db_synchronous,
                queue_max=settings.store_queue_max,
                batch_max=batch_max,
                history_max=settings.history_max,
                writer_hook=writer_hook,
                commit_on=settings.store_commit_place,
                checkpoint_pages=settings.chat_db_checkpoint_pages,
                checkpointer_idle=settings.chat_db_checkpointer == "idle",
                commit_interval_ms=settings.chat_db_commit_interval_ms,
                wal_max_bytes=settings.chat_db_wal_max_bytes,
                commit_seconds=self.counters.commit_seconds,
            )
            self.broker = MemoryBroker(self._deliver)
            core_wiring = {
                "last_seq": self.store.last_seq,
                "room_opened": self.broker.subscribe,
                "room_closed": self.broker.unsubscribe,
            }
        self.core = ChatCore(
            codec,
            max_body_chars=settings.max_body_chars,
            max_protocol_errors=settings.max_protocol_errors,
            rate_limit_per_s=settings.rate_limit_per_s,
            rate_limit_burst=settings.rate_limit_burst,
            **core_wiring,
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
        if self._shared is not None:
            self._handlers[Join] = self._join_shared
            self.on_frame = self._on_frame_holding  # type: ignore[method-assign]

    def _wire_redis(self, settings: Settings, batch_max: int) -> dict[str, Any]:
        """BROKER=redis: Redis history and broker on one client; returns the core's seams."""
        from chat_server.broker.redis import RedisBroker  # noqa: PLC0415 (only when chosen)
        from chat_server.store.redis import RedisHistoryStore, connect_redis  # noqa: PLC0415

        self._redis = connect_redis(settings.redis_url)
        self.store = RedisHistoryStore(
            client=self._redis,
            writer=self.worker_id,
            on_batch=self._reported_shared,
            queue_max=settings.store_queue_max,
            batch_max=batch_max,
            history_max=settings.history_max,
            commit_seconds=self.counters.commit_seconds,
            send_ref_window_s=settings.send_ref_window_s,
        )
        self.broker = self._shared = RedisBroker(
            client=self._redis,
            worker=self.worker_id,
            lease_s=settings.presence_lease_s,
            deliver=self._deliver_shared,
            jumped=self._release_acks,
            announce=self._announce,
            local_users=self._local_users,
            local_rooms=self._local_rooms,
        )
        return {
            "last_seq": self._shared.last_seq,
            "room_opened": self._shared.subscribe,
            "room_closed": self._room_closed_shared,
            "remote_members": self._shared.members,
            "presence_changed": self._shared.presence_changed,
        }

    async def start(self) -> None:
        """Open the history store and the broker; StoreError or BrokerUnavailable if unreachable."""
        try:
            await self.store.start()
            await self._load_recent_sends()
            await self.broker.start()
        except (StoreError, BrokerUnavailable):
            if self._redis is not None:
                await self._redis.aclose()
            raise

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
        self._held.pop(session, None)
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
        self.counters.frames_in += 1
        if not core.take_token(session, time.monotonic()):
            core.rate_limited(session, time.monotonic(), self._ref_of(frame))
            return
        self._dispatch(session, frame)

    def _ref_of(self, frame: Frame) -> str | None:
        """The ``ref`` of a refused frame that is a ``send`` (None otherwise): the client
        learns which send to retry. Decoding here costs only frames already refused."""
        try:
            message = self.decode(frame)
        except ProtocolError as exc:
            return exc.ref
        return message.ref if isinstance(message, Send) else None

    def _dispatch(self, session: Session, frame: Frame) -> None:
        """Decode one frame that drew its token and run its handler; errors become frames."""
        try:
            message = self.decode(frame)
            self._handlers[type(message)](session, message)
        except ProtocolError as exc:
            self.core.fail(session, exc)
        except Exception:
            log.exception("internal error while handling a frame from %s", session.user)
            self.core.fail(session, ProtocolError(ErrorCode.INTERNAL, "the server failed"))

    def _on_frame_holding(self, session: Session, frame: Frame) -> None:
        """BROKER=redis: as :meth:`on_frame`, but frames wait behind a join that waits."""
        held = self._held.get(session)
        if held is None:
            ChatService.on_frame(self, session, frame)
            return
        core = self.core
        if session.closed:
            return
        if not core.take_token(session, time.monotonic()):
            core.rate_limited(session, time.monotonic(), self._ref_of(frame))
            return
        if len(held) >= HELD_FRAMES_MAX:
            core.fail(session, ProtocolError(ErrorCode.UNAVAILABLE, "too many frames in a join"))
            return
        held.append(frame)

    def _release_held(self, session: Session) -> None:
        """Handle the frames that waited behind a join, in order, until another join waits."""
        held = self._held.pop(session, None)
        while held and not session.closed:
            self._dispatch(session, held.popleft())
            again = self._held.get(session)
            if again is not None:
                again.extend(held)
                return

    # ---- handlers --------------------------------------------------------------------

    def _send(self, session: Session, message: Send) -> None:
        stored = self.core.accept_send(session, message, time.time_ns() // 1_000_000)
        if self.draining:
            raise ProtocolError(ErrorCode.UNAVAILABLE, "server is shutting down", message.ref)
        if stored.ref is not None and self._answer_repeat(session, stored):
            return
        try:
            self.store.submit(stored, session)
        except StoreError as exc:
            raise ProtocolError(exc.code, str(exc), message.ref) from None
        if stored.ref is not None:
            self.recent_sends.submitted(stored)

    def _on_batch(self, result: BatchResult) -> None:
        core = self.core
        if result.error is not None:
            error = ProtocolError(result.error.code, f"not stored: {result.error}")
            for message, session in result.items:
                core.store_failed(session, message, error)
            return
        publish = self.broker.publish
        ack = self.core.ack
        counters = self.counters
        observe_ack = counters.observe_ack_latency_ms
        observe_delivery = counters.delivery_latency.observe
        # the transports write each connection's frames of this batch together, once
        # the loop iteration ends: one clock reading serves the whole batch
        now_ms = time.time_ns() / 1e6
        for message, session in result.items:
            publish(message)
            latency_ms = now_ms - message.ts
            observe_delivery(latency_ms)
            observe_ack(latency_ms)
            ack(session, message)

    def _ack(self, session: Session, message: Message) -> None:
        """Ack a durable message and count its latency from accept (``ts``) to now."""
        self.counters.observe_ack_latency_ms(time.time_ns() / 1e6 - message.ts)
        self.core.ack(session, message)

    def _deliver(self, message: Message) -> None:
        self.core.deliver(message)

    # ---- idempotent sends: a ref repeated with the same body is answered, not stored -----

    def _answer_repeat(self, session: Session, stored: Message) -> bool:
        """True when ``stored`` repeats a remembered send: acked with its seq, or waiting."""
        earlier = self.recent_sends.repeat_of(stored)
        if earlier is None:
            return False
        if earlier.seq:
            stored.seq = earlier.seq
            self.core.ack(session, stored)
        else:
            earlier.wait(session)  # answered with the original's outcome
        return True

    def _reported(self, result: BatchResult) -> None:
        self._on_batch(result)
        self._remember_outcomes(result)

    def _reported_shared(self, result: BatchResult) -> None:
        self._on_batch_shared(result)
        self._remember_outcomes(result)

    def _remember_outcomes(self, result: BatchResult) -> None:
        """Record the batch's seqs for its refs; answer the repeats that waited for them."""
        recent = self.recent_sends
        core = self.core
        if result.error is None:
            for message, _ in result.items:
                if message.ref is not None:
                    for session in recent.committed(message):
                        core.ack(session, message)
            return
        error = ProtocolError(result.error.code, f"not stored: {result.error}")
        for message, _ in result.items:
            if message.ref is not None:
                for session in recent.failed(message):
                    core.store_failed(session, message, error)

    async def _load_recent_sends(self) -> None:
        """Remember the sends with a ref that the store holds from the last window."""
        recent = self.recent_sends
        if not recent.window_ms:
            return
        since_ms = time.time_ns() // 1_000_000 - recent.window_ms
        for message in await self.store.recent_sends(since_ms, recent.max_entries):
            recent.load(message)
        if recent:
            log.info(
                "remembering %d sends with a ref from the last %d ms", len(recent), recent.window_ms
            )

    # ---- BROKER=redis: acks after delivery, joins after subscribing, shared presence ------

    def _on_batch_shared(self, result: BatchResult) -> None:
        """Ack what Redis committed once this process delivered it (the store published it)."""
        if result.error is not None:
            self._on_batch(result)
            return
        assert self._shared is not None
        core = self.core
        last_seq = self._shared.last_seq
        pending = self._pending_acks
        for message, session in result.items:
            room = message.room
            waiting = pending.get(room)
            if waiting is not None:
                waiting.append((message, session))
            elif room in core.rooms and last_seq(room) < message.seq:
                pending[room] = deque([(message, session)])
            else:
                self._ack(session, message)

    def _deliver_shared(self, message: Message) -> None:
        self.core.deliver(message)
        self.counters.delivery_latency.observe(time.time_ns() / 1e6 - message.ts)
        if self._pending_acks and message.room in self._pending_acks:
            self._release_acks(message.room, message.seq)

    def _release_acks(self, room: str, upto: int) -> None:
        """Ack the room's waiting sends with ``seq <= upto``."""
        waiting = self._pending_acks.get(room)
        if not waiting:
            return
        ack = self._ack
        while waiting and waiting[0][0].seq <= upto:
            message, session = waiting.popleft()
            ack(session, message)
        if not waiting:
            del self._pending_acks[room]

    def _room_closed_shared(self, room: str) -> None:
        assert self._shared is not None
        self._shared.unsubscribe(room)
        self._release_acks(room, 2**63)

    def _announce(self, room: str, user: str, present: bool) -> None:
        self.core.remote_presence(room, user, present)

    def _local_users(self, room_name: str) -> Collection[str]:
        room = self.core.rooms.get(room_name)
        return () if room is None else room.users.keys()

    def _local_rooms(self) -> dict[str, Collection[str]]:
        return {name: list(room.users) for name, room in self.core.rooms.items()}

    def _join_shared(self, session: Session, message: Join) -> None:
        """Join now if the broker holds the room; else subscribe first, holding later frames."""
        assert self._shared is not None
        check_since(message.since)
        check_room(message.room)
        if self._shared.is_ready(message.room):
            self._join(session, message)
            return
        self._held[session] = deque()
        self._spawn(self._join_when_ready(session, message))

    async def _join_when_ready(self, session: Session, message: Join) -> None:
        assert self._shared is not None
        room = message.room
        try:
            await self._shared.prepare(room)
            if not session.closed:
                self._join(session, message)
        except BrokerUnavailable as exc:
            log.info("join of %s by %s refused: %s", room, session.user, exc)
            if not session.closed:
                self.core.fail(session, ProtocolError(ErrorCode.UNAVAILABLE, f"cannot join: {exc}"))
        except ProtocolError as exc:
            self.core.fail(session, exc)
        except Exception:
            log.exception("internal error while %s joined %s", session.user, room)
            self.core.fail(session, ProtocolError(ErrorCode.INTERNAL, "the server failed"))
        finally:
            if room not in self.core.rooms:
                self._shared.release(room)
            self._release_held(session)

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
        last_seq = self.core.last_seq
        cursor = since
        try:
            while send_paced is not None and not self.core.replay_caught_up(session, room, cursor):
                page = await self.store.after(room, cursor, REPLAY_PAGE)
                # what this process has not delivered yet comes live, not from the replay
                upto = last_seq(room)
                page = [stored for stored in page if stored.seq <= upto]
                if not page:
                    # trimmed, or nothing delivered after the cursor that is stored
                    cursor = max(cursor, upto)
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
        if self._pending_acks:
            # messages committed but not heard back yet: give delivery a moment, then ack
            deadline = time.monotonic() + ACK_DRAIN_WAIT_S
            while self._pending_acks and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            for room in list(self._pending_acks):
                self._release_acks(room, 2**63)

    async def close(self) -> None:
        """Stop background work and close the store and broker."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # the broker first: it gives up this process' presence through the shared client
        await self.broker.close()
        await self.store.close()
        if self._redis is not None:
            await self._redis.aclose()

    def _store_notable(self) -> dict[str, Any]:
        notable = getattr(self.store, "notable", None)  # the SQLite store's slow events
        return {} if notable is None else notable()

    def stats(self) -> dict[str, Any]:
        """Counters for /stats and tests."""
        stats = {
            "connections": self.connections,
            "rooms": len(self.core.rooms),
            "draining": self.draining,
            "store": dataclasses.asdict(self.store.stats()),
            "tail": {**self.counters.tail_summary(), **self._store_notable()},
            "worker": {"pid": os.getpid(), "index": self.worker_index, "id": self.worker_id},
            "sends_remembered": len(self.recent_sends),
            "repeated_sends": self.recent_sends.repeats,
        }
        if self._shared is not None:
            stats["broker"] = self._shared.stats()
            stats["pending_acks"] = sum(map(len, self._pending_acks.values()))
        return stats
