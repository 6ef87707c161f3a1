"""Fan-out and presence between processes through Redis pub/sub (``BROKER=redis``).

Each process holds **one** pub/sub connection, subscribed to the channel of each
room it has members in (and only those): the core's ``room_opened`` and
``room_closed`` call :meth:`RedisBroker.subscribe` and
:meth:`RedisBroker.unsubscribe`. Messages are published by the history store's
commit script (:mod:`chat_server.store.redis`), not by this broker: it only
listens, and delivers what it hears to the local core through a
:class:`~chat_server.broker.feed.RoomFeed` per room, which keeps ``seq`` order,
drops duplicates and holds messages behind a gap while the gap is read back
from the room's stream.

**Joining a room this process does not hold yet** takes a round trip first
(:meth:`prepare`): ``SUBSCRIBE``, wait for its confirmation, then one snapshot
of the room (its ``seq``, presence version and shared member set, read
atomically). Everything published after the confirmation is heard, everything
before it is at most the snapshot's ``seq``: nothing is missed, and the feed
drops what is heard twice.

**Presence across processes.** Per room, ``chat:{room}:users`` counts for each
user the processes holding it, ``chat:{room}:w:<process>`` lists the users this
process holds, and every process' arrival or departure bumps ``chat:{room}:pv``
and is published (``P<version> +user <count> <process>`` / ``-user ...``: the
count after it and the process whose holding changed) on the room's channel, by
one script. So each process tells the users some *other* process holds from
those only it holds (the room's view is those plus its own local users): the
echo of its own write, heard after the user already left here, changes nothing.
Each process renews a lease (its score in the ``chat:workers`` sorted
set, in Redis' own clock) every third of ``PRESENCE_LEASE_S``; the same script
removes every process whose lease ran out, with leave events for its users, so
a killed process' members vanish within about ``PRESENCE_LEASE_S``. A process
that finds its own lease had run out, or that failed to write presence, writes
its whole local presence again once Redis answers.

**Outages.** A listener that loses its connection (Redis restarted, or Redis
dropped a subscriber past ``client-output-buffer-limit``) reconnects with
backoff, resubscribes every room, takes new snapshots and reads the missed
messages from the streams. The listener task is supervised: if it ever ends for
another reason, the error is logged and it is started again, never silently
lost. Joins that need a new room while Redis is away fail with ``unavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Collection, Coroutine
from typing import Any, Final

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from chat_server.broker.base import Broker, BrokerListener
from chat_server.broker.feed import RoomFeed
from chat_server.errors import BrokerUnavailable
from chat_server.redis_rooms import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    CLOSE_WAIT_S,
    CONNECTION_ERRORS,
    channel_room,
    decode_published,
    raise_if_cancelled,
    read_range,
    room_channel,
    seq_key,
)

log = logging.getLogger("chat_server.broker")

#: a join waits at most this long for its room's subscription and snapshot
PREPARE_TIMEOUT_S: Final = 5.0
#: messages read from a stream per request while filling a gap
FILL_PAGE: Final = 1000

LEASES_KEY: Final = "chat:workers"
USERS_KEY: Final = "chat:{%s}:users"
VERSION_KEY: Final = "chat:{%s}:pv"
HELD_KEY: Final = "chat:{%s}:w:%s"
ROOMS_KEY: Final = "chat:worker:%s:rooms"

_PRESENCE_LIB: Final = """
local USERS, VERSION, HELD, ROOMS, CHANNEL = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local function announce(room, user, sign, count, worker)
  local v = redis.call('INCR', string.format(VERSION, room))
  local event = 'P' .. string.format('%d', v) .. ' ' .. sign .. user .. ' '
    .. string.format('%d', count) .. ' ' .. worker
  redis.call('PUBLISH', string.format(CHANNEL, room), event)
end
local function arrive(room, worker, user)
  if redis.call('SADD', string.format(HELD, room, worker), user) == 1 then
    redis.call('SADD', string.format(ROOMS, worker), room)
    announce(room, user, '+', redis.call('HINCRBY', string.format(USERS, room), user, 1), worker)
  end
end
local function depart(room, worker, user)
  if redis.call('SREM', string.format(HELD, room, worker), user) == 1 then
    local users = string.format(USERS, room)
    local count = redis.call('HINCRBY', users, user, -1)
    if count <= 0 then
      redis.call('HDEL', users, user)
      count = 0
    end
    announce(room, user, '-', count, worker)
  end
end
local function release(worker)
  local rooms = string.format(ROOMS, worker)
  for _, room in ipairs(redis.call('SMEMBERS', rooms)) do
    for _, user in ipairs(redis.call('SMEMBERS', string.format(HELD, room, worker))) do
      depart(room, worker, user)
    end
  end
  redis.call('DEL', rooms)
  redis.call('ZREM', KEYS[1], worker)
end
"""

PRESENCE_SCRIPT: Final = (
    _PRESENCE_LIB
    + """
-- KEYS[1] the leases; ARGV[1..5] key and channel templates, ARGV[6] this process, ARGV[7]
-- room, ARGV[8] 'exact' (these are all its users here), '+' (arrived) or '-' (departed),
-- ARGV[9..] users
local worker, room, mode = ARGV[6], ARGV[7], ARGV[8]
if mode == 'exact' then
  local wanted = {}
  for i = 9, #ARGV do wanted[ARGV[i]] = true end
  for _, user in ipairs(redis.call('SMEMBERS', string.format(HELD, room, worker))) do
    if not wanted[user] then depart(room, worker, user) end
  end
  for i = 9, #ARGV do arrive(room, worker, ARGV[i]) end
elseif mode == '+' then
  for i = 9, #ARGV do arrive(room, worker, ARGV[i]) end
else
  for i = 9, #ARGV do depart(room, worker, ARGV[i]) end
end
if redis.call('SCARD', string.format(HELD, room, worker)) == 0 then
  redis.call('SREM', string.format(ROOMS, worker), room)
end
return 1
"""
)

LEASE_SCRIPT: Final = (
    _PRESENCE_LIB
    + """
-- KEYS[1] the leases; ARGV[1..5] key and channel templates, ARGV[6] this process, ARGV[7]
-- lease in ms (0: give up the lease and release everything now)
-- Returns {processes released, 1 if this process had no lease (new, or it had run out)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local worker, lease = ARGV[6], tonumber(ARGV[7])
if lease == 0 then
  release(worker)
  return {1, 0}
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, dead in ipairs(expired) do release(dead) end
local added = redis.call('ZADD', KEYS[1], now + lease, worker)
return {#expired, added}
"""
)

#: the scripts' templates: a room's channel is spelled by room_channel(), nowhere else
_TEMPLATES: Final = (USERS_KEY, VERSION_KEY, HELD_KEY, ROOMS_KEY, room_channel("%s"))


class _Room:
    """A room this process subscribes to: its feed and the I/O state around it."""

    __slots__ = ("feed", "filling", "in_use", "ready", "snapshotting", "waiters")

    def __init__(self, feed: RoomFeed, ready: asyncio.Future[None]) -> None:
        self.feed = feed
        self.ready = ready
        #: joins waiting in prepare()
        self.waiters = 0
        #: the core holds members here (between subscribe and unsubscribe)
        self.in_use = False
        self.filling = False
        self.snapshotting = False


class RedisBroker(Broker):
    """One process' side of the shared rooms: subscriptions, ordered delivery and presence.

    Reports to the :class:`~chat_server.broker.base.BrokerListener` given to
    :meth:`report_to`: ``delivered`` gets each message of a subscribed room once, in
    ``seq`` order; ``jumped`` hears when a room's ``last_seq`` moved without a delivery
    (trimmed history); ``closed`` hears each room the core closed; ``announce`` hears
    each change of a room's shared member set; ``local_users`` and ``local_rooms`` are
    the truth presence writes converge to.
    """

    def __init__(
        self,
        *,
        client: Redis,
        worker: str,
        lease_s: float,
    ) -> None:
        self._client = client
        self._worker = worker
        self._lease_ms = int(lease_s * 1000)
        self._heartbeat_s = lease_s / 3
        self._reports: BrokerListener | None = None
        self._rooms: dict[str, _Room] = {}
        self._pubsub: PubSub | None = None
        self._connected = False
        self._confirmations: dict[bytes, deque[asyncio.Future[None]]] = {}
        self._presence_queue: dict[tuple[str, str], None] = {}
        self._presence_wakeup = asyncio.Event()
        self._presence_resync = False
        # registered scripts load themselves again after NOSCRIPT (a restarted Redis)
        self._presence_script = client.register_script(PRESENCE_SCRIPT)
        self._lease = client.register_script(LEASE_SCRIPT)
        self._listener: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self.listener_restarts = 0
        self.reconnects = 0

    # ---- life cycle ------------------------------------------------------------------

    def report_to(self, listener: BrokerListener) -> None:
        """Report deliveries, jumps and presence to ``listener`` (before :meth:`start`)."""
        self._reports = listener

    async def start(self) -> None:
        """Take this process' lease and start the listener; BrokerUnavailable if unreachable."""
        try:
            await self._renew_lease()
        except (RedisError, OSError) as exc:
            raise BrokerUnavailable(f"cannot reach Redis: {exc}") from exc
        self._start_listener()
        self._spawn(self._keep_lease(), "chat-broker-lease")
        self._spawn(self._write_presence(), "chat-broker-presence")

    async def close(self) -> None:
        """Stop listening, give up the lease (members leave at once), disconnect."""
        self._closing = True
        tasks = [*self._tasks, *([self._listener] if self._listener else [])]
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
            for task in pending:
                log.error("broker: task %s did not end when cancelled", task.get_name())
        try:
            await self._lease_script(0)
        except (RedisError, OSError) as exc:
            log.warning("broker: could not release this process' presence: %s", exc)
        if self._pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._pubsub.aclose()

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("broker: task %s failed", task.get_name(), exc_info=task.exception())

    # ---- rooms, for the service and the core ----------------------------------------------

    def is_ready(self, room: str) -> bool:
        """True when ``room`` is subscribed and its snapshot applied (a join needs no wait)."""
        entry = self._rooms.get(room)
        return entry is not None and entry.feed.synced

    async def prepare(self, room: str) -> None:
        """Subscribe to ``room`` and apply its snapshot; BrokerUnavailable if that fails."""
        entry = self._rooms.get(room)
        if entry is None:
            if not self._connected:
                raise BrokerUnavailable("Redis pub/sub is reconnecting")
            loop = asyncio.get_running_loop()
            reports = self._listening()
            feed = RoomFeed(room, reports.delivered, reports.jumped, reports.announce)
            entry = self._rooms[room] = _Room(feed, loop.create_future())
            self._spawn(self._open(entry), f"chat-broker-open-{room}")
        entry.waiters += 1
        try:
            await asyncio.wait_for(asyncio.shield(entry.ready), PREPARE_TIMEOUT_S)
        except TimeoutError:
            raise BrokerUnavailable(f"room {room} not ready in {PREPARE_TIMEOUT_S} s") from None
        finally:
            entry.waiters -= 1

    def subscribe(self, room: str) -> None:
        """The core opened ``room`` (after :meth:`prepare`): keep it while it has members."""
        entry = self._rooms.get(room)
        if entry is None:
            log.error("broker: room %s opened without prepare(); it gets no messages", room)
            return
        entry.in_use = True

    def unsubscribe(self, room: str) -> None:
        """The core closed ``room``: stop hearing it (unless a join is setting it up again)."""
        entry = self._rooms.get(room)
        if entry is not None:
            entry.in_use = False
            self.release(room)
        self._listening().closed(room)

    def release(self, room: str) -> None:
        """Drop ``room``'s subscription if no member and no waiting join needs it."""
        entry = self._rooms.get(room)
        if entry is None or entry.in_use or entry.waiters:
            return
        del self._rooms[room]
        _fail(entry.ready, BrokerUnavailable(f"room {room} released"))
        if self._pubsub is not None and self._connected:
            self._spawn(self._unsubscribe(room), f"chat-broker-unsubscribe-{room}")

    def last_seq(self, room: str) -> int:
        """The last ``seq`` of ``room`` delivered in this process (0 if not subscribed)."""
        entry = self._rooms.get(room)
        return 0 if entry is None else entry.feed.last_seq

    def members(self, room: str) -> Collection[str]:
        """The room's users some other process holds, as last heard (this process' own
        users are the core's)."""
        entry = self._rooms.get(room)
        return () if entry is None else entry.feed.members

    def presence_changed(self, room: str, user: str) -> None:
        """``user``'s first connection arrived in ``room`` here, or its last left: write it."""
        self._presence_queue[(room, user)] = None
        self._presence_wakeup.set()

    def _listening(self) -> BrokerListener:
        if self._reports is None:
            raise RuntimeError("RedisBroker.report_to() was not called before use")
        return self._reports

    def stats(self) -> dict[str, Any]:
        """Counters for /stats."""
        return {
            "worker": self._worker,
            "subscribed_rooms": len(self._rooms),
            "connected": self._connected,
            "reconnects": self.reconnects,
            "listener_restarts": self.listener_restarts,
        }

    # ---- subscriptions -----------------------------------------------------------------

    async def _open(self, entry: _Room) -> None:
        """Subscribe to the room, wait for the confirmation, apply its snapshot."""
        room = entry.feed.room
        try:
            await self._subscribe([room])
            await self._snapshot(entry)
        except (RedisError, OSError, BrokerUnavailable, asyncio.CancelledError) as exc:
            _fail(entry.ready, BrokerUnavailable(f"cannot set up room {room}: {exc!r}"))
            if self._rooms.get(room) is entry and not entry.in_use:
                del self._rooms[room]
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if not entry.ready.done():
            entry.ready.set_result(None)

    async def _subscribe(self, rooms: list[str]) -> None:
        """SUBSCRIBE to the rooms' channels; return once Redis confirmed each one."""
        pubsub = self._pubsub
        if pubsub is None or not self._connected:
            raise BrokerUnavailable("Redis pub/sub is reconnecting")
        loop = asyncio.get_running_loop()
        waiting = []
        channels = [room_channel(room) for room in rooms]
        for channel in channels:
            confirmed = loop.create_future()
            self._confirmations.setdefault(channel.encode(), deque()).append(confirmed)
            waiting.append(confirmed)
        await pubsub.subscribe(*channels)
        await asyncio.gather(*waiting)

    async def _unsubscribe(self, room: str) -> None:
        if self._pubsub is None:
            return
        try:
            await self._pubsub.unsubscribe(room_channel(room))
        except (RedisError, OSError) as exc:
            log.info("broker: unsubscribe from %s failed (%s); the reconnect drops it", room, exc)

    async def _snapshot(self, entry: _Room) -> None:
        """Read the room's seq, presence version and members atomically; apply them."""
        room = entry.feed.room
        entry.snapshotting = True
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.get(seq_key(room))
            pipe.get(VERSION_KEY % room)
            pipe.hgetall(USERS_KEY % room)
            pipe.smembers(HELD_KEY % (room, self._worker))
            seq, version, users, mine = await pipe.execute()
        finally:
            entry.snapshotting = False
        if self._rooms.get(room) is not entry:
            return
        counts = {user.decode(): int(count) for user, count in users.items()}
        entry.feed.snapshot(int(seq or 0), int(version or 0), counts, {u.decode() for u in mine})
        self._after_feed(entry)

    def _after_feed(self, entry: _Room) -> None:
        """Start the I/O the feed asks for: reading a gap, or a new snapshot."""
        feed = entry.feed
        if feed.gap is not None and not entry.filling and self._connected:
            entry.filling = True
            self._spawn(self._fill(entry), f"chat-broker-fill-{feed.room}")
        if feed.needs_snapshot and not entry.snapshotting and self._connected:
            entry.snapshotting = True
            self._spawn(self._resnapshot(entry), f"chat-broker-snapshot-{feed.room}")

    async def _resnapshot(self, entry: _Room) -> None:
        try:
            await self._snapshot(entry)
        except (RedisError, OSError) as exc:
            log.info("broker: snapshot of %s failed (%s); retried later", entry.feed.room, exc)

    async def _fill(self, entry: _Room) -> None:
        """Read the feed's gap from the room's stream and deliver it, page by page."""
        feed = entry.feed
        try:
            while (gap := feed.gap) is not None:
                after, upto = gap
                page = await read_range(self._client, feed.room, after, upto, FILL_PAGE)
                if self._rooms.get(feed.room) is not entry:
                    return
                feed.fill_page(page)
                if len(page) < FILL_PAGE:
                    feed.fill_done(upto)
        except (RedisError, OSError) as exc:
            log.info("broker: reading the gap of %s failed (%s); retried later", feed.room, exc)
        finally:
            entry.filling = False
        self._after_feed(entry)

    # ---- the listener ------------------------------------------------------------------

    def _start_listener(self) -> None:
        self._listener = asyncio.create_task(self._listen(), name="chat-broker-listener")
        self._listener.add_done_callback(self._listener_done)

    def _listener_done(self, task: asyncio.Task[None]) -> None:
        """Never lose the listener: whatever ended it, log and start it again."""
        if self._closing:
            return
        self._connected = False
        self.listener_restarts += 1
        if task.cancelled():
            log.error("broker: the pub/sub listener was cancelled; starting it again")
        else:
            log.error(
                "broker: the pub/sub listener ended; starting it again",
                exc_info=task.exception(),
            )
        delay = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** min(self.listener_restarts, 8))
        asyncio.get_running_loop().call_later(delay, self._start_listener)

    async def _listen(self) -> None:
        """Hold the pub/sub connection: (re)connect with backoff, resubscribe, dispatch."""
        delay = BACKOFF_MIN_S
        down_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            raise_if_cancelled()
            pubsub = self._client.pubsub()
            reader: asyncio.Task[None] | None = None
            try:
                await pubsub.connect()
                self._pubsub = pubsub
                self._connected = True
                reader = asyncio.create_task(self._read(pubsub), name="chat-broker-reader")
                await self._resume()
                if down_since is not None:
                    log.info(
                        "broker: pub/sub back after %.1f s; %d rooms resubscribed",
                        loop.time() - down_since,
                        len(self._rooms),
                    )
                    self.reconnects += 1
                    down_since = None
                delay = BACKOFF_MIN_S
                await reader
            except (*CONNECTION_ERRORS, BrokerUnavailable) as exc:
                if down_since is None:
                    down_since = loop.time()
                    log.warning("broker: pub/sub connection lost (%s); reconnecting", exc)
            finally:
                self._connected = False
                self._pubsub = None
                if reader is not None:
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError, *CONNECTION_ERRORS):
                        await reader
                self._fail_pending()
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _resume(self) -> None:
        """After (re)connecting: resubscribe every held room, snapshot it, fill what was missed."""
        ready = [room for room, entry in self._rooms.items() if entry.ready.done()]
        if not ready:
            return
        await self._subscribe(ready)
        self._presence_resync = True
        self._presence_wakeup.set()
        for room in ready:
            entry = self._rooms.get(room)
            if entry is not None:
                await self._snapshot(entry)

    def _fail_pending(self) -> None:
        """The connection is gone: joins still setting up a room fail, confirmations too."""
        for queue in self._confirmations.values():
            for confirmed in queue:
                _fail(confirmed, BrokerUnavailable("Redis pub/sub connection lost"))
        self._confirmations.clear()

    async def _read(self, pubsub: PubSub) -> None:
        """Dispatch every pub/sub message until the connection fails."""
        get_message = pubsub.get_message
        on_message = self._on_message
        try:
            while True:
                message = await get_message(timeout=1.0)
                if message is not None:
                    try:
                        on_message(message)
                    except Exception:
                        log.exception("broker: a pub/sub message could not be handled: %r", message)
        finally:
            # whoever waits for a confirmation from this connection must not wait forever
            self._fail_pending()

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "message":
            channel: bytes = message["channel"]
            room = channel_room(channel)
            entry = self._rooms.get(room)
            if entry is None:
                return
            data: bytes = message["data"]
            if data[:1] == b"M":
                entry.feed.messages(decode_published(room, data))
            else:  # P<version> +user <count> <process> / -user <count> <process>
                head, change, count, worker = data.split(b" ", 3)
                entry.feed.presence(
                    int(head[1:]),
                    change[1:].decode(),
                    change[:1] == b"+",
                    int(count),
                    worker.decode() == self._worker,
                )
            if entry.feed.gap is not None or entry.feed.needs_snapshot:
                self._after_feed(entry)
        elif kind == "subscribe":
            channel = message["channel"]
            waiting = self._confirmations.get(channel)
            if waiting:
                confirmed = waiting.popleft()
                if not waiting:
                    del self._confirmations[channel]
                if not confirmed.done():
                    confirmed.set_result(None)

    # ---- presence and the lease ----------------------------------------------------------

    async def _lease_script(self, lease_ms: int) -> list[int]:
        return await self._lease(  # type: ignore[no-any-return]
            keys=[LEASES_KEY], args=[*_TEMPLATES, self._worker, str(lease_ms)]
        )

    async def _renew_lease(self) -> bool:
        """Renew this process' lease, releasing expired ones; True if ours had run out."""
        released, ours_was_missing = await self._lease_script(self._lease_ms)
        if released:
            log.info("broker: released the presence of %d processes whose lease ran out", released)
        return bool(ours_was_missing)

    async def _keep_lease(self) -> None:
        """Renew the lease every third of it; if it had run out, write presence again."""
        while True:
            raise_if_cancelled()
            await asyncio.sleep(self._heartbeat_s)
            try:
                if await self._renew_lease():
                    log.warning("broker: this process' lease had run out; writing presence again")
                    self._presence_resync = True
                    self._presence_wakeup.set()
            except (RedisError, OSError) as exc:
                log.info("broker: lease renewal failed (%s)", exc)
                self._presence_resync = True

    async def _write_presence(self) -> None:
        """Write presence changes in order, as the local truth is when written."""
        delay = BACKOFF_MIN_S
        while True:
            raise_if_cancelled()
            await self._presence_wakeup.wait()
            self._presence_wakeup.clear()
            resync = self._presence_resync
            queued = list(self._presence_queue)
            self._presence_queue.clear()
            try:
                if resync:
                    self._presence_resync = False
                    await self._write_all_presence()
                elif queued:
                    await self._write_changes(queued)
                delay = BACKOFF_MIN_S
            except (RedisError, OSError) as exc:
                log.info("broker: presence write failed (%s); writing all again later", exc)
                self._presence_resync = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                self._presence_wakeup.set()

    async def _write_changes(self, changes: list[tuple[str, str]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for room, user in changes:
            mode = "+" if user in self._listening().local_users(room) else "-"
            await self._presence_script(
                keys=[LEASES_KEY], args=[*_TEMPLATES, self._worker, room, mode, user], client=pipe
            )
        await pipe.execute()

    async def _write_all_presence(self) -> None:
        """Make Redis hold exactly this process' local presence, in every room."""
        local = self._listening().local_rooms()
        held = await self._client.smembers(ROOMS_KEY % self._worker)
        rooms = set(local) | {room.decode() for room in held}
        pipe = self._client.pipeline(transaction=False)
        for room in rooms:
            args = [*_TEMPLATES, self._worker, room, "exact", *local.get(room, ())]
            await self._presence_script(keys=[LEASES_KEY], args=args, client=pipe)
        await pipe.execute()
        await self._renew_lease()


def _fail(future: asyncio.Future[None], exc: BaseException) -> None:
    """Fail ``future`` unless done, marking the exception seen (its waiters may be gone)."""
    if not future.done():
        future.set_exception(exc)
        future.exception()
