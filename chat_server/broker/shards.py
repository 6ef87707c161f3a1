"""Sharded pub/sub for the Redis broker: each room's channel heard on the node serving it.

A room's messages and presence changes are ``SPUBLISH``\\ ed on its channel
(``chat:{room}``, in the room's slot), which only the node serving that slot carries.
:class:`ShardedSubscriptions` keeps **one subscription connection per node** that
serves a room this process holds (one in all on a single Redis, which is one node
serving every slot), ``SSUBSCRIBE``\\ s each room's channel there and reports what it
hears. It follows the cluster:

- a **slot that moves** (resharding, a manual failover) makes the old node end the
  subscription itself (a ``sunsubscribe`` this process did not ask for), and an
  ``SSUBSCRIBE`` that reaches a node no longer serving the slot is answered
  ``MOVED``: either way the slots are read again (``CLUSTER SLOTS``) and the room is
  subscribed on its new node;
- a **connection that fails** (a node restarted, failed over, or dropped a subscriber
  past ``client-output-buffer-limit``) is made again with backoff, after reading the
  slots again (a failed primary's slots are then served by its promoted replica);
- the slots are also read again whenever :meth:`ShardedSubscriptions.check` is called
  (the broker does it with each lease renewal), so a move no node announced is
  followed within that period.

Each event of a room's subscription goes to the room's one owner
(:class:`~chat_server.broker.shared_room.SharedRoom`), which keeps where it stands: one
confirmed again after it was lost makes the room read its state and what it missed from
the streams, as after any outage. Why not redis-py's own cluster pub/sub: it resubscribes
by itself after a reconnect or a slot move, without telling its user that messages may
have been missed meanwhile, and that is exactly what the broker must know.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from redis.asyncio.client import PubSub
from redis.exceptions import MovedError, RedisError, ResponseError

from chat_server.broker.room_life import SubEvent, SubState
from chat_server.broker.shared_room import Action, SharedRoom
from chat_server.errors import BrokerUnavailable
from chat_server.redis_nodes import Topology, slot_of
from chat_server.redis_rooms import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    CLOSE_WAIT_S,
    CONNECTION_ERRORS,
    channel_room,
    raise_if_cancelled,
    room_channel,
)
from chatlab.supervision import RESTART, supervisor

log = logging.getLogger("chat_server.broker")


class _Sub:
    """One room's subscription: where it was asked for, and the joins waiting for it. Where
    it stands there (:data:`~chat_server.broker.room_life.SUB_TRANSITIONS`) is its room's,
    the owner of all the room's state."""

    __slots__ = ("channel", "node", "room", "waiters")

    def __init__(self, room: SharedRoom) -> None:
        self.room = room
        self.channel = room_channel(room.name)
        #: the node whose link carries (or will carry) the SSUBSCRIBE
        self.node = ""
        self.waiters: list[asyncio.Future[None]] = []

    @property
    def confirmed(self) -> bool:
        """True while the node confirmed it (the room's messages are heard)."""
        return self.room.live

    @property
    def state(self) -> SubState:
        """Where it stands on its node."""
        return self.room.sub_state


class _Link:
    """The subscription connection to one node."""

    __slots__ = ("ever_up", "name", "pending_unsubscribes", "pubsub", "rooms", "task", "up")

    def __init__(self, name: str) -> None:
        self.name = name
        self.rooms: set[str] = set()
        self.pubsub: PubSub | None = None
        self.up = False
        self.ever_up = False
        #: SUNSUBSCRIBEs sent and not confirmed yet, by channel: any other sunsubscribe
        #: is the node's own (the slot moved)
        self.pending_unsubscribes: Counter[bytes] = Counter()
        self.task: asyncio.Task[None] | None = None


class ShardedSubscriptions:
    """This process' subscriptions to its rooms' channels, one connection per node.

    ``on_message(room, data)`` gets every published payload of a subscribed room (a
    room that moved may be heard twice for a moment: the feed drops repeats). Each event
    of a room's subscription (sent, confirmed, dropped) goes to the room
    (:meth:`SharedRoom.subscription <chat_server.broker.shared_room.SharedRoom.subscription>`)
    and what it returns to ``on_actions(room, actions)`` (a subscription confirmed again
    after it was lost: a new snapshot); ``on_reconnected()`` hears a link that came back
    after failing.
    """

    def __init__(
        self,
        topology: Topology,
        *,
        on_message: Callable[[str, bytes], None],
        on_actions: Callable[[SharedRoom, list[Action]], None],
        on_reconnected: Callable[[], None],
    ) -> None:
        self._topology = topology
        self._on_message = on_message
        self._on_actions = on_actions
        self._on_reconnected = on_reconnected
        self._rooms: dict[str, _Sub] = {}
        self._links: dict[str, _Link] = {}
        self._lock = asyncio.Lock()
        self._checker: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self._closing = False
        self.reconnects = 0
        self.moves = 0

    async def start(self) -> None:
        """Read the slots; BrokerUnavailable if no node answers."""
        try:
            await self._topology.refresh()
        except CONNECTION_ERRORS as exc:
            raise BrokerUnavailable(f"cannot read the cluster's slots: {exc}") from exc

    # ---- rooms -------------------------------------------------------------------------

    async def subscribe(self, shared: SharedRoom) -> None:
        """Return once the room's channel is subscribed on its node; BrokerUnavailable if
        that node's connection is down (or goes down meanwhile)."""
        room = shared.name
        sub = self._rooms.get(room)
        if sub is None:
            sub = self._rooms[room] = _Sub(shared)
            self._place(room, sub, self._topology.node_of(sub.channel))
        if sub.confirmed:
            return
        link = self._links.get(sub.node)
        if link is not None and link.ever_up and not link.up:
            raise BrokerUnavailable(f"Redis pub/sub to {link.name} is reconnecting")
        waiter = asyncio.get_running_loop().create_future()
        sub.waiters.append(waiter)
        await waiter

    def unsubscribe(self, room: str) -> None:
        """Stop hearing ``room``."""
        sub = self._rooms.pop(room, None)
        if sub is None:
            return
        _fail_all(sub, BrokerUnavailable(f"room {room} released"))
        link = self._links.get(sub.node)
        if link is not None:
            link.rooms.discard(room)
            if link.up and link.pubsub is not None:
                self._send_unsubscribe(link, link.pubsub, sub.channel)

    def check(self) -> None:
        """Read the slots again in the background and move rooms whose slot moved."""
        if self._checker is None or self._checker.done():
            self._checker = supervisor().spawn(self._reconcile(), "chat-broker-slots")

    def stats(self) -> dict[str, Any]:
        """Counters for /stats."""
        return {
            "nodes": len(self._links),
            "nodes_connected": sum(link.up for link in self._links.values()),
            "reconnects": self.reconnects,
            "moves": self.moves,
        }

    @property
    def connected(self) -> bool:
        """True while every node link is up."""
        return all(link.up for link in self._links.values())

    async def close(self) -> None:
        """Close every connection."""
        self._closing = True
        tasks = [link.task for link in self._links.values() if link.task is not None]
        if self._checker is not None:
            tasks.append(self._checker)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)

    # ---- placing rooms on links --------------------------------------------------------

    def _place(self, room: str, sub: _Sub, node: str) -> None:
        """Put ``room`` on ``node``'s link (started if new); subscribe there if it is up."""
        sub.node = node
        link = self._links.get(node)
        if link is None:
            link = self._links[node] = _Link(node)
            link.task = supervisor().start("chat-broker-pubsub", lambda: self._hold(link), RESTART)
        link.rooms.add(room)
        if link.up and link.pubsub is not None:
            self._send_subscribe(link.pubsub, sub)

    async def _reconcile(self) -> None:
        """Read the slots again; move every room whose node is not its slot's now."""
        async with self._lock:
            try:
                await self._topology.refresh()
            except (*CONNECTION_ERRORS, BrokerUnavailable) as exc:
                log.info("broker: could not read the cluster's slots (%s); later", exc)
                return
            for room, sub in list(self._rooms.items()):
                node = self._topology.node_of(sub.channel)
                if not node:
                    continue
                if node != sub.node:
                    self._move(room, sub, node)
                elif sub.state is SubState.WANTED:  # its node ended it; the slots say it is here
                    link = self._links.get(node)
                    if link is not None and link.up and link.pubsub is not None:
                        self._send_subscribe(link.pubsub, sub)

    def _move(self, room: str, sub: _Sub, node: str) -> None:
        """Subscribe ``room`` on ``node`` instead (what was missed meanwhile is read back)."""
        log.info("broker: room %s moved from %s to %s", room, sub.node, node)
        self.moves += 1
        old = self._links.get(sub.node)
        if old is not None:
            old.rooms.discard(room)
            if old.up and old.pubsub is not None and sub.state is not SubState.WANTED:
                self._send_unsubscribe(old, old.pubsub, sub.channel)
        self._step(sub, SubEvent.DROPPED)
        self._place(room, sub, node)

    def _send_subscribe(self, pubsub: PubSub, sub: _Sub) -> None:
        # one channel per SSUBSCRIBE: a cluster refuses several slots in one
        self._step(sub, SubEvent.SENT)
        self._background(pubsub.ssubscribe(sub.channel), f"SSUBSCRIBE {sub.channel}")

    def _send_unsubscribe(self, link: _Link, pubsub: PubSub, channel: str) -> None:
        link.pending_unsubscribes[channel.encode()] += 1
        self._background(pubsub.sunsubscribe(channel), f"SUNSUBSCRIBE {channel}")

    def _background(self, request: Any, what: str) -> None:
        """Send a (un)subscribe; its confirmation comes through the link's reader, and a
        failed send shows as the link failing."""

        async def send() -> None:
            try:
                await request
            except (RedisError, OSError) as exc:
                log.info("broker: %s failed (%s); the reconnect redoes it", what, exc)

        task = supervisor().spawn(send(), "chat-broker-subscribe")
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    # ---- one link per node -------------------------------------------------------------

    async def _hold(self, link: _Link) -> None:
        """Hold ``link``: (re)connect with backoff, subscribe its rooms, dispatch; end when
        it fails with no room left on it."""
        delay = BACKOFF_MIN_S
        loop = asyncio.get_running_loop()
        down_since: float | None = None
        while not self._closing:
            raise_if_cancelled()
            pubsub = self._topology.client(link.name).pubsub()
            try:
                await pubsub.connect()
                link.pubsub = pubsub
                link.up = link.ever_up = True
                for room in list(link.rooms):
                    self._send_subscribe(pubsub, self._rooms[room])
                if down_since is not None:
                    log.info(
                        "broker: pub/sub to %s back after %.1f s; %d rooms resubscribed",
                        link.name,
                        loop.time() - down_since,
                        len(link.rooms),
                    )
                    self.reconnects += 1
                    down_since = None
                    self._on_reconnected()
                delay = BACKOFF_MIN_S
                await self._read(link, pubsub)
            except (*CONNECTION_ERRORS, ResponseError) as exc:
                if down_since is None:
                    down_since = loop.time()
                    log.warning(
                        "broker: pub/sub connection lost (%s: %s); reconnecting", link.name, exc
                    )
            except Exception:
                if down_since is None:
                    down_since = loop.time()
                log.exception("broker: the pub/sub link to %s failed; starting it again", link.name)
            finally:
                link.up = False
                link.pubsub = None
                link.pending_unsubscribes.clear()
                for room in link.rooms:
                    sub = self._rooms.get(room)
                    if sub is not None:
                        self._step(sub, SubEvent.DROPPED)
                        _fail_all(sub, BrokerUnavailable("Redis pub/sub connection lost"))
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
            await self._reconcile()  # a failover may have given its slots to another node
            if not link.rooms:
                del self._links[link.name]
                return
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _read(self, link: _Link, pubsub: PubSub) -> None:
        """Dispatch every message of ``link`` until it fails."""
        get_message = pubsub.get_message
        on_message = self._on_message
        rooms = self._rooms
        while True:
            try:
                message = await get_message(timeout=1.0)
            except MovedError as moved:  # an SSUBSCRIBE reached a node that lost the slot
                self._moved(link, moved.slot_id, f"{moved.host}:{moved.port}")
                continue
            if message is None:
                continue
            kind = message["type"]
            if kind == "smessage":
                room = channel_room(message["channel"])
                if room in rooms:
                    try:
                        on_message(room, message["data"])
                    except Exception:
                        log.exception("broker: a pub/sub message could not be handled: %r", message)
            elif kind == "ssubscribe":
                self._confirmed(link, channel_room(message["channel"]))
            elif kind == "sunsubscribe":
                channel: bytes = message["channel"]
                if link.pending_unsubscribes[channel] > 0:
                    link.pending_unsubscribes[channel] -= 1
                else:
                    self._dropped_by_node(link, channel_room(channel))

    def _moved(self, link: _Link, slot: int, node: str) -> None:
        """``node`` serves ``slot`` now: subscribe its rooms still waiting here there."""
        for room in list(link.rooms):
            sub = self._rooms[room]
            if not sub.confirmed and slot_of(sub.channel) == slot:
                self._move(room, sub, node)
        self.check()

    def _confirmed(self, link: _Link, room: str) -> None:
        sub = self._rooms.get(room)
        if sub is None or sub.node != link.name or sub.confirmed:
            return
        actions = sub.room.subscription(SubEvent.CONFIRMED)
        waiters, sub.waiters = sub.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        if actions:
            self._on_actions(sub.room, actions)

    def _dropped_by_node(self, link: _Link, room: str) -> None:
        """The node ended a subscription by itself: the room's slot moved."""
        sub = self._rooms.get(room)
        if sub is None or sub.node != link.name:
            return
        log.info("broker: %s ended the subscription of room %s (slot moved)", link.name, room)
        self._step(sub, SubEvent.DROPPED)
        self.check()

    def _step(self, sub: _Sub, event: SubEvent) -> None:
        """Tell the room of its subscription's ``event``; apply what it returns."""
        actions = sub.room.subscription(event)
        if actions:
            self._on_actions(sub.room, actions)


def _fail_all(sub: _Sub, exc: BaseException) -> None:
    waiters, sub.waiters = sub.waiters, []
    for waiter in waiters:
        if not waiter.done():
            waiter.set_exception(exc)
            waiter.exception()
