"""Which node serves which room: one Redis, or a Redis Cluster's slots, with a client per node.

The history store sends each node its rooms' commit scripts (and ``WAIT``) on that node's
own connection, and the broker holds one subscription connection per node: both ask a
:class:`Topology` where a room's channel (``chat:{room}``, the slot of every key of the
room) is served and for a plain client of that node. On one Redis that is always the one
node (:class:`OneRedis`); on a cluster (:class:`ClusterSlots`) it is the slot map as
``CLUSTER SLOTS`` last told, read again (:meth:`Topology.refresh`) after a connection
error, a ``MOVED`` reply or a moved subscription.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import random
from typing import Final, Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisError

from chat_server.errors import BrokerUnavailable
from chat_server.redis_rooms import CONNECTION_ERRORS, connect_redis, node_url

__all__ = ["ONE_NODE", "ClusterSlots", "OneRedis", "Topology"]

#: the node name a single Redis is known by
ONE_NODE: Final = "redis"
#: how long reading the slots waits for one node before it asks the next
NODE_ANSWER_S: Final = 1.0


class Topology(Protocol):
    """Where each channel is served, and a client for each node."""

    def node_of(self, channel: str) -> str:
        """The name of the node serving ``channel`` (as last read)."""

    async def refresh(self) -> None:
        """Read which node serves which slot again (raises connection errors)."""

    def client(self, node: str) -> Redis:
        """A client of ``node`` (subscriptions get their own connection from it)."""

    async def probe(self) -> None:
        """Return once Redis answers (raises connection errors or BrokerUnavailable)."""


class OneRedis:
    """A single Redis: one node serving every channel."""

    def __init__(self, client: Redis) -> None:
        self._client = client

    def node_of(self, channel: str) -> str:
        """Always the one node."""
        return ONE_NODE

    async def refresh(self) -> None:
        """Nothing moves on one Redis."""

    def client(self, node: str) -> Redis:
        """The shared client."""
        return self._client

    async def probe(self) -> None:
        """PING the one Redis."""
        await self._client.ping()


class ClusterSlots:
    """A Redis Cluster's slots as ``CLUSTER SLOTS`` last told, and a client per primary."""

    def __init__(self, cluster: RedisCluster, url: str) -> None:
        self._cluster = cluster
        self._url = url
        #: sorted slot-range starts, and for each range its end and primary ("host:port")
        self._starts: list[int] = []
        self._ranges: list[tuple[int, str]] = []
        self._clients: dict[str, Redis] = {}

    def node_of(self, channel: str) -> str:
        """The primary serving ``channel``'s slot ("" if no node serves it)."""
        slot = key_slot(channel.encode())
        index = bisect.bisect_right(self._starts, slot) - 1
        if index < 0:
            return ""
        end, node = self._ranges[index]
        return node if slot <= end else ""

    async def refresh(self) -> None:
        """Ask the nodes the cluster client knows, one after another, until one answers."""
        error: BaseException | None = None
        await self._cluster.initialize()  # learns the seeds' nodes once (no-op after)
        nodes = self._cluster.get_nodes()
        random.shuffle(nodes)
        for node in nodes:
            try:
                # a frozen node (stopped, not dead) would hold the whole refresh for the
                # socket timeout: ask the next one after a moment
                slots = await asyncio.wait_for(
                    self._cluster.cluster_slots(target_nodes=node), NODE_ANSWER_S
                )
            except (*CONNECTION_ERRORS, RedisError, TimeoutError) as exc:
                error = exc
                continue
            table = sorted(
                (start, end, f"{primary['primary'][0]}:{primary['primary'][1]}")
                for (start, end), primary in slots.items()
            )
            self._starts = [start for start, _, _ in table]
            self._ranges = [(end, node) for _, end, node in table]
            return
        raise BrokerUnavailable(f"no cluster node answered CLUSTER SLOTS: {error!r}")

    def client(self, node: str) -> Redis:
        """A client of ``node`` with the seeds' credentials."""
        found = self._clients.get(node)
        if found is None:
            host, _, port = node.rpartition(":")
            found = self._clients[node] = connect_redis(node_url(self._url, host, int(port)))  # type: ignore[assignment]
        return found  # type: ignore[return-value]

    async def probe(self) -> None:
        """Some node answers with the slot map (a node that is down leaves its rooms in
        doubt, not the whole cluster)."""
        await self.refresh()

    async def close(self) -> None:
        """Close the per-node clients."""
        for client in self._clients.values():
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()
