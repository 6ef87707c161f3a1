"""The chat service: the core, the history store and the broker, on the event loop.

The transport calls :meth:`ChatService.open`, :meth:`~ChatService.on_frame` and
:meth:`~ChatService.disconnect` for each connection; everything that waits (history
reads, paced replay, the store's group commit) is orchestrated here, while the
rules live in :mod:`chat_server.core`. Its parts are built by
:mod:`chat_server.wiring` and passed in; nothing here asks which backend is in use.

The way out is one-way: the store reports each committed batch to
:meth:`~ChatService.committed`, which hands it to the
:class:`~chat_server.delivery.base.Delivery`: with one process it delivers each
message through the core and acks it; with rooms shared through a broker the
messages come back through the broker and each send is acked once its message is
delivered here. The delivery never calls the service: it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from chat_server.broker.base import Broker
from chat_server.codecs.base import Codec
from chat_server.core.chat import ChatCore, CloseConnection, SendFrame, Session
from chat_server.core.idempotency import RecentSends
from chat_server.delivery.base import Delivery, Payload
from chat_server.errors import (
    BrokerUnavailable,
    ChatError,
    ProtocolError,
    StoreError,
    Unavailable,
)
from chat_server.messages import History, HistoryRequest, Join, Leave, Message, Send
from chat_server.metrics import Counters
from chat_server.overload import REFUSAL
from chat_server.store.base import BatchResult, HistoryStore, StoreStats
from chatlab.supervision import supervisor

log = logging.getLogger("chat_server")

REPLAY_PAGE = 200

SendPaced = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True)
class Worker:
    """This process among its peers: ``index`` among ``WORKERS`` (None when it runs
    alone) and ``id``, unique among every process sharing Redis."""

    index: int | None
    id: str


class ChatService:
    """One process's chat: sessions, rooms, durable history and fan-out.

    ``delivery`` delivers what the store commits (here or through the broker).
    ``blocking_send_s`` is REGRESSION=blocking_loop's stall before each send (0: none),
    ``busy_send_s`` REGRESSION=cpu_per_send's CPU burnt before each send (0: none).
    ``release`` is awaited after the store and broker close, or when they fail to
    start (the Redis client both share).
    """

    def __init__(
        self,
        *,
        codec: Codec,
        core: ChatCore,
        store: HistoryStore,
        broker: Broker,
        delivery: Delivery,
        counters: Counters,
        recent_sends: RecentSends,
        worker: Worker,
        max_history_bytes: int,
        blocking_send_s: float = 0.0,
        busy_send_s: float = 0.0,
        release: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        self.codec = codec
        self.core = core
        self.store = store
        self.broker = broker
        self.delivery = delivery
        self.counters = counters
        self.recent_sends = recent_sends
        self.worker = worker
        self.max_history_bytes = max_history_bytes
        self.decode = codec.decode_client
        self.draining = False
        self._paced: dict[Session, SendPaced] = {}
        self._replays: dict[tuple[Session, str], asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gate = delivery.gate
        self._shedder = counters.overload
        self._blocking_send_s = blocking_send_s
        self._busy_send_s = busy_send_s
        self._release = release
        # chosen once here: the handler of each message kind
        self._handlers: dict[type, Callable[[Session, Any], None]] = {
            Send: self._send if not (blocking_send_s or busy_send_s) else self._send_blocking,
            Join: self._join,
            Leave: self._leave,
            HistoryRequest: self._history,
        }
        store.report_to(self.committed)

    async def start(self) -> None:
        """Open the history store and the broker; StoreError or BrokerUnavailable if unreachable."""
        try:
            await self.store.start()
            await self._load_recent_sends()
            await self.broker.start()
        except (StoreError, BrokerUnavailable):
            for release in self._release:
                await release()
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
        closed = self.core.close_session(session)
        if closed:
            self.delivery.rooms_closed(closed)
        self._paced.pop(session, None)
        self.delivery.forget(session)
        for room in list(session.rooms):
            self._cancel_replay(session, room)

    def on_frame(self, session: Session, frame: Payload) -> None:
        """Handle one received frame: rate limit, decode, dispatch; errors become frames.

        A frame sent while the session's join waits for the broker waits behind it.
        """
        core = self.core
        if session.closed:
            return
        self.counters.frames_in += 1
        if not core.allow_frame(session, time.monotonic()):
            core.rate_limited(session, time.monotonic(), self._ref_of(frame))
            return
        try:
            handle_now = self._gate(session, frame)
        except ChatError as exc:
            self.core.fail(session, exc)
            return
        if handle_now:
            self.dispatch(session, frame)

    def on_control_frame(self, session: Session) -> bool:
        """A ping, or a pong nobody asked for, draws a frame of the session's rate allowance
        like any frame (the contract: every incoming frame does); False when none is left:
        a ping is then not answered, and enough refusals close the connection with 1008."""
        core = self.core
        if session.closed:
            return False
        now = time.monotonic()
        if core.allow_frame(session, now):
            return True
        core.control_frame_limited(session, now)
        return False

    def dispatch(self, session: Session, frame: Payload) -> None:
        """Decode one frame that drew its allowance and run its handler; errors become frames."""
        try:
            message = self.decode(frame)
            self._handlers[type(message)](session, message)
        except ChatError as exc:
            self.core.fail(session, exc)
        except Exception:
            log.exception("internal error while handling a frame from %s", session.user)
            self.core.fail(session, ChatError("the server failed"))

    @contextlib.contextmanager
    def _answering(self, session: Session, doing: str) -> Iterator[None]:
        """The edge of a background task for ``session``: a :class:`ChatError` raised
        inside becomes its error frame; anything else is logged and answered ``internal``."""
        try:
            yield
        except ChatError as exc:
            log.info("%s for %s failed: %s", doing, session.user, exc)
            if not session.closed:
                self.core.fail(session, exc)
        except Exception:
            log.exception("internal error in %s for %s", doing, session.user)
            if not session.closed:
                self.core.fail(session, ChatError("the server failed"))

    def _ref_of(self, frame: Payload) -> str | None:
        """The ``ref`` of a refused frame that is a ``send`` (None otherwise): the client
        learns which send to retry. Decoding here costs only frames already refused."""
        try:
            message = self.decode(frame)
        except ProtocolError as exc:
            return exc.ref
        return message.ref if isinstance(message, Send) else None

    # ---- what the transport and the metrics read -------------------------------------------

    @property
    def connections(self) -> int:
        """Open sessions."""
        return len(self.core.sessions)

    @property
    def room_count(self) -> int:
        """Rooms with at least one member here."""
        return len(self.core.rooms)

    def errors_sent(self) -> dict[str, int]:
        """Error frames sent, by code."""
        return dict(self.core.errors_sent)

    def store_stats(self) -> StoreStats:
        """The history store's counters."""
        return self.store.stats()

    # ---- handlers --------------------------------------------------------------------

    def _send(self, session: Session, message: Send) -> None:
        if self._shedder.refusing(time.monotonic()):  # the loop is behind: refuse, no work done
            self._shedder.refuse()
            raise Unavailable(REFUSAL, message.ref)
        stored = self.core.accept_send(session, message, time.time_ns() // 1_000_000)
        if self.draining:
            raise Unavailable("server is shutting down", message.ref)
        if stored.ref is not None and self._answer_repeat(session, stored):
            return
        try:
            self.store.submit(stored, session)
        except StoreError as exc:
            exc.ref = message.ref  # the send the refusal answers
            raise
        if stored.ref is not None:
            self.recent_sends.submitted(stored)

    def _send_blocking(self, session: Session, message: Send) -> None:
        """REGRESSION=blocking_loop or cpu_per_send: a blocking call on the event loop
        before each send.

        ``blocking_loop`` sleeps: the classic ``time.sleep`` where ``await asyncio.sleep``
        was meant (or a synchronous database or HTTP client inside a handler), the core
        idle while every connection waits. ``cpu_per_send`` computes: a CPU-heavy
        synchronous call in the handler (a password hash, a pure-Python parser), the core
        busy. A send the load shedder refuses does none of the handler's work, so it
        does not block either.
        """
        if not self._shedder.refusing(time.monotonic()):
            if self._blocking_send_s:
                time.sleep(self._blocking_send_s)
            if self._busy_send_s:
                until = time.perf_counter() + self._busy_send_s
                while time.perf_counter() < until:
                    pass
        self._send(session, message)

    def _join(self, session: Session, message: Join) -> None:
        """Join now when the room is ready; else wait for it, the session's frames held."""
        if self.delivery.join_ready(session, message):
            self._join_now(session, message)
        else:
            self.spawn(self._join_when_ready(session, message), "chat-join")

    def _join_now(self, session: Session, message: Join) -> None:
        """Join a ready room; replay from ``since`` when asked."""
        if self.core.join(session, message):
            self._cancel_replay(session, message.room)
            task = self.spawn(
                self._replay(session, message.room, message.since or 0), "chat-replay"
            )
            self._replays[(session, message.room)] = task

    async def _join_when_ready(self, session: Session, message: Join) -> None:
        """Wait for the room, join it, then handle the frames held meanwhile, in order."""
        room = message.room
        try:
            with self._answering(session, f"the join of {room}"):
                try:
                    await self.delivery.prepare(room)
                except BrokerUnavailable as exc:
                    raise Unavailable(f"cannot join: {exc}") from exc
                if not session.closed:
                    self._join_now(session, message)
        finally:
            held = self.delivery.joined(session, room)
            gate = self._gate
            # a held join may wait again: the gate then holds the frames after it
            while held and not session.closed:
                frame = held.popleft()
                with self._answering(session, "a frame held behind a join"):
                    if gate(session, frame):
                        self.dispatch(session, frame)

    def _leave(self, session: Session, message: Leave) -> None:
        if self.core.leave(session, message):
            self.delivery.rooms_closed([message.room])
        self._cancel_replay(session, message.room)

    def _history(self, session: Session, message: HistoryRequest) -> None:
        limit = self.core.check_history(message)
        self.spawn(
            self._answer_history(session, message.room, message.before, limit), "chat-history"
        )

    # ---- what the store reports ------------------------------------------------------

    def committed(self, result: BatchResult) -> None:
        """One batch's outcome (each room's in commit order): deliver and ack, or tell each
        sender why not."""
        if result.error is None:
            self.delivery.committed(result.items)
            self._remember_outcomes(result, None)
            return
        # one answer for the whole batch: each sender hears it with its own ref
        error = ProtocolError(result.error.code, f"not stored: {result.error}")
        core = self.core
        for message, session in result.items:
            core.store_failed(session, message, error)
        self._remember_outcomes(result, error)

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

    def _remember_outcomes(self, result: BatchResult, error: ChatError | None) -> None:
        """Record the batch's seqs for its refs; answer the repeats that waited for them
        (with ``error`` when the batch failed)."""
        recent = self.recent_sends
        core = self.core
        if error is None:
            for message, _ in result.items:
                if message.ref is not None:
                    for session in recent.committed(message):
                        core.ack(session, message)
            return
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

    # ---- waiting work ----------------------------------------------------------------

    async def _replay(self, session: Session, room: str, since: int) -> None:
        """Send stored messages after ``since`` at the client's reading pace, then go live."""
        send_paced = self._paced.get(session)
        try:
            with self._answering(session, f"the replay of {room}"):
                await self._replay_pages(session, room, since, send_paced)
        finally:
            if self._replays.get((session, room)) is asyncio.current_task():
                del self._replays[(session, room)]

    async def _replay_pages(
        self, session: Session, room: str, cursor: int, send_paced: SendPaced | None
    ) -> None:
        """Page through the store from ``cursor`` until the live stream has caught up."""
        encode = self.codec.encode_server
        last_seq = self.core.last_seq
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
            raise Unavailable("replay failed") from exc

    def _cancel_replay(self, session: Session, room: str) -> None:
        task = self._replays.pop((session, room), None)
        if task is not None:
            task.cancel()

    async def _answer_history(
        self, session: Session, room: str, before: int | None, limit: int
    ) -> None:
        """Read a page and send it, cut from the oldest end to fit ``MAX_HISTORY_BYTES``."""
        with self._answering(session, f"the history of {room}"):
            try:
                page = await self.store.history(room, before, limit)
            except StoreError as exc:
                raise ProtocolError(exc.code, f"history not read: {exc}") from exc
            if not session.closed:
                session.send(self.history_frame(room, page))

    def history_frame(self, room: str, page: list[Message]) -> bytes:
        """Encode a history reply holding the newest messages of ``page`` that fit the limit."""
        encode = self.codec.encode_server
        max_bytes = self.max_history_bytes
        frame = encode(History(room=room, messages=page))
        while len(frame) > max_bytes and page:
            keep = min(len(page) - 1, len(page) * max_bytes // len(frame))
            page = page[len(page) - keep :] if keep > 0 else []
            frame = encode(History(room=room, messages=page))
        return frame

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a task the service owns: cancelled at :meth:`close`; one that
        raises is logged and counted by the process's supervisor (REPORT: a request's work)."""
        task = supervisor().spawn(coro, name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- shutdown --------------------------------------------------------------------

    async def drain(self) -> None:
        """Refuse new sends, then commit what was accepted and deliver its messages and acks."""
        self.draining = True
        await self.store.flush()
        await self.delivery.drain()

    async def close(self) -> None:
        """Stop background work and close the store and broker."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # the broker first: it gives up this process' presence through the shared client
        await self.broker.close()
        await self.store.close()
        for release in self._release:
            await release()

    def stats(self) -> dict[str, Any]:
        """Counters for /stats and tests."""
        stats = {
            "connections": self.connections,
            "rooms": self.room_count,
            "draining": self.draining,
            "store": dataclasses.asdict(self.store.stats()),
            "tail": {**self.counters.tail_summary(), **self.store.notable()},
            "worker": {"pid": os.getpid(), "index": self.worker.index, "id": self.worker.id},
            "sends_remembered": len(self.recent_sends),
            "repeated_sends": self.recent_sends.repeats,
            **self.delivery.stats(),
        }
        return stats
