"""Fan-out and presence between processes through Redis sharded pub/sub (``BROKER=redis``).

The process hears the channel of each room it has members in (and only those): the
core's ``room_opened`` calls :meth:`RedisBroker.subscribe`, and the service, once the
core returned a closed room, :meth:`RedisBroker.unsubscribe`;
:class:`~chat_server.broker.shards.ShardedSubscriptions` holds one subscription
connection per node serving such a room (one in all on a single Redis) and follows
slot moves and failovers of a cluster. Messages are published by the history store's
commit script (:mod:`chat_server.store.redis`), not by this broker: it only listens.
Each held room's state is one :class:`~chat_server.broker.shared_room.SharedRoom`: its
lifecycle, its feed (which keeps ``seq`` order, drops duplicates and holds messages
behind a gap while the gap is read back from the room's stream), and the acks waiting
for their message. The broker tells it what happened and applies what it returns in
one place (:meth:`RedisBroker._apply`).

**Joining a room this process does not hold yet** takes a round trip first
(:meth:`prepare`): ``SSUBSCRIBE`` on the room's node, wait for its confirmation, then
one snapshot of the room (its ``seq``, presence version and shared member set, read by
one script). Everything published after the confirmation is heard, everything before
it is at most the snapshot's ``seq``: nothing is missed, and the feed drops what is
heard twice.

**Presence across processes** lives in each room's own keys
(:mod:`chat_server.broker.presence`): how many processes hold each user, which users
each process holds, a version bumped and published with each change, and each
holding process' lease. So each process tells the users some *other* process holds
from those only it holds (the room's view is those plus its own local users): the
echo of its own write, heard after the user already left here, changes nothing. Each
process renews its lease in every room it holds users in, every third of
``PRESENCE_LEASE_S``; the renewal releases, with leave events, the processes whose lease
there ran out, so a killed process' members vanish within about ``PRESENCE_LEASE_S``. A
process that finds its own lease in a room had run out writes its users there again; one
that failed to write presence, or whose subscription connection came back, writes its
whole local presence again once Redis answers.

**Outages.** A subscription connection that fails (a node restarted or failed over, or
dropped a subscriber past ``client-output-buffer-limit``) is made again with backoff; a
room whose slot moved is subscribed on its new node; either way the room gets a new
snapshot and the missed messages are read from its stream. Joins that need a new room
while its node is away fail with ``unavailable``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any, Final

from redis.exceptions import RedisError

from chat_server.broker.base import Broker, BrokerListener
from chat_server.broker.presence import presence_call, renew_call, snapshot_call
from chat_server.broker.shards import ShardedSubscriptions
from chat_server.broker.shared_room import Ack, Action, Announce, Deliver, SharedRoom, Then
from chat_server.errors import BrokerUnavailable
from chat_server.messages import Message
from chat_server.redis_nodes import Topology
from chat_server.redis_rooms import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    CLOSE_WAIT_S,
    CONNECTION_ERRORS,
    RedisClient,
    decode_published,
    raise_if_cancelled,
    read_range,
    room_channel,
    run_scripts,
)
from chatlab.supervision import RESTART, supervisor

log = logging.getLogger("chat_server.broker")

#: a join waits at most this long for its room's subscription and snapshot
PREPARE_TIMEOUT_S: Final = 5.0
#: messages read from a stream per request while filling a gap
FILL_PAGE: Final = 1000
#: how long one page of a gap may take to read
FILL_ANSWER_S: Final = 2.0


class RedisBroker(Broker):
    """One process' side of the shared rooms: subscriptions, ordered delivery and presence.

    Reports to the :class:`~chat_server.broker.base.BrokerListener` given to
    :meth:`report_to`: ``delivered`` gets each message of a subscribed room once, in
    ``seq`` order; ``ack`` each send committed here (:meth:`committed`), after its
    message was delivered here; ``announce`` hears each change of a room's shared member
    set; ``local_users`` and ``local_rooms`` are the truth presence writes converge to.
    """

    def __init__(
        self,
        *,
        client: RedisClient,
        topology: Topology,
        worker: str,
        lease_s: float,
    ) -> None:
        self._client = client
        self._topology = topology
        self._worker = worker
        self._lease_ms = int(lease_s * 1000)
        self._heartbeat_s = lease_s / 3
        self._renew_answer_s = max(self._heartbeat_s, 1.0)
        self._reports: BrokerListener | None = None
        self._rooms: dict[str, SharedRoom] = {}
        #: each held room's opening: done once it is ready (what joins preparing it wait for)
        self._ready: dict[str, asyncio.Future[None]] = {}
        self._subscriptions = ShardedSubscriptions(
            topology,
            on_message=self._on_published,
            on_actions=self._apply,
            on_reconnected=self._reconnected,
        )
        self._presence_queue: dict[tuple[str, str], None] = {}
        self._presence_wakeup = asyncio.Event()
        self._presence_resync = False
        #: rooms whose users this process must write again (its lease there had run out)
        self._presence_rewrite: set[str] = set()
        #: rooms where Redis may hold users of this process (a superset: each is renewed)
        self._held_rooms: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    # ---- life cycle ------------------------------------------------------------------

    def report_to(self, listener: BrokerListener) -> None:
        """Report deliveries, jumps and presence to ``listener`` (before :meth:`start`)."""
        self._reports = listener

    async def start(self) -> None:
        """Reach Redis, read a cluster's slots, start the lease and presence tasks;
        BrokerUnavailable if unreachable."""
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            raise BrokerUnavailable(f"cannot reach Redis: {exc}") from exc
        await self._subscriptions.start()
        # each keeps a Redis state alive for as long as this process runs: restarted if it fails
        self._keep("chat-broker-lease", self._keep_lease)
        self._keep("chat-broker-presence", self._write_presence)

    async def close(self) -> None:
        """Stop listening, give up every lease (members leave at once), disconnect."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
            for task in pending:
                log.error("broker: task %s did not end when cancelled", task.get_name())
        rooms = sorted(self._held_rooms | set(self._listening().local_rooms()))
        # per node, each bounded: a frozen node keeps its rooms' leases (they lapse), not the
        # others' releases or the process' exit
        releases = [renew_call(room, self._worker, 0, self._lease_ms) for room in rooms]
        results = await self._run_per_node(rooms, releases, CLOSE_WAIT_S)
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            log.warning(
                "broker: could not release presence in %d rooms: %r", len(errors), errors[0]
            )
        await self._subscriptions.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str, room: str) -> asyncio.Task[Any]:
        """One room's work (REPORT: a failure is logged and counted by the supervisor)."""
        return self._own(supervisor().spawn(coro, name, room))

    def _keep(self, name: str, work: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Long-lived work, restarted with backoff by the supervisor when it raises."""
        self._own(supervisor().start(name, work, RESTART))

    def _own(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- rooms, for the service and the core ----------------------------------------------

    def is_ready(self, room: str) -> bool:
        """True when ``room`` is subscribed and its snapshot applied (a join needs no wait)."""
        entry = self._rooms.get(room)
        return entry is not None and entry.ready

    async def prepare(self, room: str) -> None:
        """Subscribe to ``room`` and apply its snapshot; BrokerUnavailable if that fails."""
        entry = self._rooms.get(room)
        if entry is None:
            entry = self._rooms[room] = SharedRoom(room)
            ready = self._ready[room] = asyncio.get_running_loop().create_future()
            self._spawn(self._open(entry, ready), "chat-broker-open", room)
        ready = self._ready[room]
        entry.waiters += 1
        try:
            await asyncio.wait_for(asyncio.shield(ready), PREPARE_TIMEOUT_S)
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
        entry.opened()

    def unsubscribe(self, room: str) -> None:
        """The core closed ``room``: ack what waited for its delivery, stop hearing it
        (unless a join is setting it up again)."""
        entry = self._rooms.get(room)
        if entry is not None:
            self._apply(entry, entry.closed_by_core())
            self.release(room)

    def release(self, room: str) -> None:
        """Drop ``room``'s subscription if no member and no waiting join needs it."""
        entry = self._rooms.get(room)
        if entry is None or not entry.releasable:
            return
        self._drop(entry, BrokerUnavailable(f"room {room} released"))

    def _drop(self, entry: SharedRoom, why: BrokerUnavailable) -> None:
        """Forget a held room: it is closed, its opening failed if pending, unsubscribed."""
        room = entry.name
        del self._rooms[room]
        _fail(self._ready.pop(room), why)
        entry.released()
        self._subscriptions.unsubscribe(room)

    def committed(self, items: Sequence[tuple[Message, object]]) -> None:
        """Sends the store committed here (each room's in commit order): ack each once this
        process delivered its message (at once when its room is not delivered here)."""
        rooms = self._rooms
        for message, sender in items:
            entry = rooms.get(message.room)
            if entry is None:
                self._listening().ack(sender, message)
            else:
                self._apply(entry, entry.committed(message, sender))

    def acks_waiting(self) -> int:
        """Acks waiting for their message's delivery, in every room."""
        return sum(entry.acks_waiting for entry in self._rooms.values())

    def release_acks(self) -> None:
        """Ack every send still waiting for its delivery (the process is stopping)."""
        for entry in list(self._rooms.values()):
            self._apply(entry, entry.release_acks())

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
            "connected": self._subscriptions.connected,
            **self._subscriptions.stats(),
        }

    # ---- the one place a room's actions happen ---------------------------------------------

    def _apply(self, entry: SharedRoom, actions: list[Action]) -> None:
        """Do what ``entry`` returned, in order: deliver and ack through the listener,
        announce presence, start the reads it asked for."""
        if not actions:
            return
        reports = self._listening()
        for action in actions:
            if isinstance(action, Deliver):
                reports.delivered(action.message)
            elif isinstance(action, Ack):
                reports.ack(action.sender, action.message)
            elif isinstance(action, Announce):
                reports.announce(entry.name, action.user, action.present)
            elif action is Then.READ_GAP:
                self._spawn(self._fill(entry), "chat-broker-fill", entry.name)
            elif action is Then.READ_SNAPSHOT:
                self._spawn(self._resnapshot(entry), "chat-broker-snapshot", entry.name)

    # ---- subscriptions -----------------------------------------------------------------

    async def _open(self, entry: SharedRoom, ready: asyncio.Future[None]) -> None:
        """Subscribe to the room, wait for the confirmation, apply its snapshot."""
        room = entry.name
        try:
            await self._subscriptions.subscribe(entry)
            entry.subscribed()
            await self._snapshot(entry)
        except (RedisError, OSError, BrokerUnavailable, asyncio.CancelledError) as exc:
            why = BrokerUnavailable(f"cannot set up room {room}: {exc!r}")
            _fail(ready, why)
            if self._rooms.get(room) is entry and not entry.in_use:
                self._drop(entry, why)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if not ready.done():
            ready.set_result(None)

    async def _snapshot(self, entry: SharedRoom) -> None:
        """Read the room's seq, presence version and members atomically; apply them (the
        room is in SNAPSHOT; a failed read raises, leaving the state to the caller)."""
        room = entry.name
        # messages and presence heard while the reply is on its way may be newer than it
        asked_at = entry.snapshot_asked()
        (reply,) = await self._run_per_node(
            [room], [snapshot_call(room, self._worker, self._lease_ms)]
        )
        if isinstance(reply, Exception):
            raise reply
        durable, version, flat, mine, stored = reply
        counts = {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        mine_users = {user.decode() for user in mine}
        actions = entry.snapshot_taken(
            int(durable),
            int(version),
            counts,
            mine_users,
            int(stored),
            asked_at=asked_at,
        )
        self._apply(entry, actions)

    def _reconnected(self) -> None:
        """A subscription connection came back: its node may have lost presence writes."""
        self._presence_resync = True
        self._presence_wakeup.set()

    async def _resnapshot(self, entry: SharedRoom) -> None:
        """Read a snapshot of a room in SNAPSHOT, with backoff, while the room is held."""
        delay = BACKOFF_MIN_S
        while not entry.closed:
            try:
                await self._snapshot(entry)
                return
            except (RedisError, OSError, BrokerUnavailable) as exc:
                log.info("broker: snapshot of %s failed (%s); retrying", entry.name, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _fill(self, entry: SharedRoom) -> None:
        """Read the room's gap from its stream and deliver it, page by page; after a
        failed read, wait (doubling up to BACKOFF_MAX_S) before the next try."""
        room = entry.name
        delay_s = entry.fill_delay_s
        try:
            if delay_s:
                await asyncio.sleep(delay_s * (0.5 + random.random()))
            while (gap := entry.gap) is not None:
                after, upto = gap
                page = await self._read_gap(room, after, upto)
                if entry.closed:
                    return
                self._apply(entry, entry.fill_page(page))
                if len(page) < FILL_PAGE:
                    self._apply(entry, entry.fill_done(upto))
            delay_s = 0.0
        except (RedisError, OSError, BrokerUnavailable) as exc:
            delay_s = min(max(delay_s * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
            log.info(
                "broker: reading the gap of %s failed (%r); again in about %.2f s",
                room,
                exc,
                delay_s,
            )
        except BaseException:
            entry.filling = False
            raise
        self._apply(entry, entry.fill_ended(delay_s))

    async def _read_gap(self, room: str, after: int, upto: int) -> list[Message]:
        """One page of ``room``'s stream from the node serving it, holding one of its turns."""
        node = self._topology.node_of(room_channel(room))
        if not node:
            raise BrokerUnavailable(f"no Redis node serves room {room} now (a failover?)")
        async with self._topology.gate(node).turn(), asyncio.timeout(FILL_ANSWER_S):
            return await read_range(self._topology.client(node), room, after, upto, FILL_PAGE)

    # ---- what the subscriptions hear --------------------------------------------------------

    def _on_published(self, room: str, data: bytes) -> None:
        """A payload published on a subscribed room's channel: messages or a presence change."""
        entry = self._rooms.get(room)
        if entry is None:
            return
        kind = data[:1]
        if kind == b"M":
            actions = entry.messages(decode_published(room, data))
        elif kind == b"D":  # stored before, durable now: read back into the feed
            actions = entry.durable(int(data[1:]))
        else:  # P<version> +user <count> <process> / -user <count> <process>
            head, change, count, worker = data.split(b" ", 3)
            actions = entry.presence(
                int(head[1:]),
                change[1:].decode(),
                change[:1] == b"+",
                int(count),
                worker.decode() == self._worker,
            )
        self._apply(entry, actions)

    # ---- presence and the leases ----------------------------------------------------------

    async def _keep_lease(self) -> None:
        """Every third of the lease: renew it in every held room (releasing expired
        processes there); rewrite rooms where it had run out; follow moved slots."""
        while True:
            raise_if_cancelled()
            await asyncio.sleep(self._heartbeat_s)
            self._subscriptions.check()
            try:
                await self._renew_leases()
            except (RedisError, OSError) as exc:
                log.info("broker: lease renewal failed (%s)", exc)
                self._presence_resync = True

    async def _renew_leases(self) -> None:
        """Renew this process' lease in every held room, one pipeline per node, the nodes
        at once: a frozen or failing node delays only its own rooms' renewals."""
        by_node: dict[str, list[str]] = {}
        node_of = self._topology.node_of
        for room in sorted(self._held_rooms):
            by_node.setdefault(node_of(room_channel(room)), []).append(room)
        if not by_node:
            return
        released = sum(
            await asyncio.gather(*(self._renew_on(node, rooms) for node, rooms in by_node.items()))
        )
        if released:
            log.info("broker: released the presence of %d processes whose lease ran out", released)
        if self._presence_rewrite:
            log.warning(
                "broker: this process' lease had run out in %d rooms; writing presence again",
                len(self._presence_rewrite),
            )
            self._presence_wakeup.set()

    async def _renew_on(self, node: str, rooms: list[str]) -> int:
        """Renew the lease in ``rooms`` on ``node``; how many expired processes it released."""
        if not node:
            return 0  # no node serves them now (a failover): the next renewal
        calls = [renew_call(room, self._worker, self._lease_ms, self._lease_ms) for room in rooms]
        try:
            # within about a heartbeat: the next renewal of the other nodes' rooms is not held
            async with self._topology.gate(node).turn(), asyncio.timeout(self._renew_answer_s):
                replies = await run_scripts(self._topology.client(node), calls)
        except (*CONNECTION_ERRORS, RedisError, BrokerUnavailable, TimeoutError) as exc:
            log.info("broker: lease renewal on %s failed (%r)", node, exc)
            self._presence_resync = True
            return 0
        released = 0
        for room, reply in zip(rooms, replies, strict=True):
            if isinstance(reply, Exception):  # e.g. MOVED: the slots are read again meanwhile
                log.info("broker: lease renewal in %s failed (%s)", room, reply)
                self._presence_resync = True
                continue
            released += int(reply[0])
            if reply[1]:
                self._presence_rewrite.add(room)
        return released

    async def _write_presence(self) -> None:
        """Write presence changes in order, as the local truth is when written."""
        delay = BACKOFF_MIN_S
        while True:
            raise_if_cancelled()
            await self._presence_wakeup.wait()
            self._presence_wakeup.clear()
            resync = self._presence_resync
            rewrite = self._presence_rewrite
            self._presence_rewrite = set()
            queued = list(self._presence_queue)
            self._presence_queue.clear()
            try:
                if resync:
                    self._presence_resync = False
                    await self._write_exact(self._held_rooms | set(self._listening().local_rooms()))
                else:
                    if rewrite:
                        await self._write_exact(rewrite)
                    if queued:
                        await self._write_changes(queued)
                delay = BACKOFF_MIN_S
            except (*CONNECTION_ERRORS, RedisError, BrokerUnavailable, TimeoutError) as exc:
                log.info("broker: presence write failed (%r); writing all again later", exc)
                self._presence_resync = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                self._presence_wakeup.set()

    async def _write_changes(self, changes: list[tuple[str, str]]) -> None:
        local_users = self._listening().local_users
        calls = []
        for room, user in changes:
            mode = "+" if user in local_users(room) else "-"
            if mode == "+":
                self._held_rooms.add(room)
            calls.append(presence_call(room, self._worker, self._lease_ms, mode, (user,)))
        self._held(changes, await self._run_per_node([room for room, _ in changes], calls))

    async def _write_exact(self, rooms: Collection[str]) -> None:
        """Make Redis hold exactly this process' local users in each of ``rooms``."""
        local = self._listening().local_rooms()
        ordered = sorted(rooms)
        self._held_rooms.update(ordered)
        calls = [
            presence_call(room, self._worker, self._lease_ms, "exact", tuple(local.get(room, ())))
            for room in ordered
        ]
        self._held([(room, "") for room in ordered], await self._run_per_node(ordered, calls))

    async def _run_per_node(
        self, rooms: list[str], calls: list[Any], timeout_s: float = PREPARE_TIMEOUT_S
    ) -> list[Any]:
        """Run each room's call on the node serving it, one pipeline per node, the nodes at
        once; each call's reply, or the error its node failed with (a node that is down or
        frozen fails only its own rooms' calls, within ``timeout_s``)."""
        by_node: dict[str, list[int]] = {}
        for index, room in enumerate(rooms):
            by_node.setdefault(self._topology.node_of(room_channel(room)), []).append(index)
        replies: list[Any] = [None] * len(calls)

        async def run(node: str, indexes: list[int]) -> None:
            try:
                if not node:
                    raise BrokerUnavailable("no Redis node serves the room (a failover?)")
                async with self._topology.gate(node).turn(), asyncio.timeout(timeout_s):
                    answers = await run_scripts(
                        self._topology.client(node), [calls[i] for i in indexes]
                    )
            except (*CONNECTION_ERRORS, RedisError, BrokerUnavailable, TimeoutError) as exc:
                answers = [exc] * len(indexes)
            for index, answer in zip(indexes, answers, strict=True):
                replies[index] = answer

        await asyncio.gather(*(run(node, indexes) for node, indexes in by_node.items()))
        return replies

    def _held(self, writes: list[tuple[str, str]], replies: list[Any]) -> None:
        """Keep the rooms where Redis holds users of this process; then raise the first error
        (the rooms written on other nodes are kept too)."""
        error: Exception | None = None
        for (room, _), reply in zip(writes, replies, strict=True):
            if isinstance(reply, Exception):
                error = error or reply
            elif int(reply) > 0:
                self._held_rooms.add(room)
            else:
                self._held_rooms.discard(room)
        if error is not None:
            raise error


def _fail(future: asyncio.Future[None], exc: BaseException) -> None:
    """Fail ``future`` unless done, marking the exception seen (its waiters may be gone)."""
    if not future.done():
        future.set_exception(exc)
        future.exception()
