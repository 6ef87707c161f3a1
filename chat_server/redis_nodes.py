"""Which node serves which room: one Redis, or a Redis Cluster's slots, with a client per node.

The history store sends each node its rooms' commit scripts (and ``WAIT``) on that node's
own connection, and the broker holds one subscription connection per node: both ask a
:class:`Topology` where a room's channel (``chat:{room}``, the slot of every key of the
room) is served and for a plain client of that node. On one Redis that is always the one
node (:class:`OneRedis`); on a cluster (:class:`ClusterSlots`) it is the slot map as
``CLUSTER SLOTS`` last told, read again (:meth:`Topology.refresh`) after a connection
error, a ``MOVED`` reply or a moved subscription.

Each node has a :class:`NodeGate` (at most ``REDIS_NODE_CONNECTIONS`` requests of this
process in flight to it, a request waiting at most ``REDIS_POOL_WAIT_S`` for its turn, then
refused with :class:`~chat_server.errors.NodeBusy`: back-pressure on that one request, never
"Redis is down"), and the history store keeps each node's health in a :class:`NodeHealth`
table: whether its rooms' sends are taken, refused at once, or probed back.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import enum
import functools
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisError

from chat_server.errors import BrokerUnavailable, NodeBusy
from chat_server.redis_rooms import CONNECTION_ERRORS, connect_redis, node_url

__all__ = [
    "ONE_NODE",
    "ClusterSlots",
    "NodeEvent",
    "NodeGate",
    "NodeHealth",
    "NodeState",
    "OneRedis",
    "Topology",
    "slot_of",
]

#: the node name a single Redis is known by
ONE_NODE: Final = "redis"
#: how long reading the slots waits for one node before it asks the next
NODE_ANSWER_S: Final = 1.0
#: defaults of REDIS_NODE_CONNECTIONS and REDIS_POOL_WAIT_S
NODE_CONNECTIONS: Final = 64
POOL_WAIT_S: Final = 1.0


class NodeState(enum.StrEnum):
    """What the history store knows of one node."""

    #: its rooms' sends are taken
    OK = "ok"
    #: its last commit confirmed on fewer replicas than REDIS_ACK_REPLICAS: sends refused,
    #: reads served; a probe watches its replicas
    SHORT = "short"
    #: a request to it failed (connection error, no answer in time): sends and reads
    #: refused; a probe watches for it
    UNREACHABLE = "unreachable"


class NodeEvent(enum.StrEnum):
    """What the store learns of a node."""

    #: a commit (or read) failed on the connection, or did not answer in time
    FAILED = "failed"
    #: a commit answered, confirmed on fewer replicas than asked
    SHORT = "short"
    #: a commit confirmed on enough replicas, or a probe found the node a primary with
    #: enough replicas online (or serving no slot any more: nothing goes there)
    HEALTHY = "healthy"


#: (state, event) -> the state after it; every pair is listed
NODE_TRANSITIONS: Final[Mapping[tuple[NodeState, NodeEvent], NodeState]] = {
    (NodeState.OK, NodeEvent.FAILED): NodeState.UNREACHABLE,
    (NodeState.OK, NodeEvent.SHORT): NodeState.SHORT,
    (NodeState.OK, NodeEvent.HEALTHY): NodeState.OK,
    (NodeState.SHORT, NodeEvent.FAILED): NodeState.UNREACHABLE,
    (NodeState.SHORT, NodeEvent.SHORT): NodeState.SHORT,
    (NodeState.SHORT, NodeEvent.HEALTHY): NodeState.OK,
    # an answer, even a short one, says the node is reachable
    (NodeState.UNREACHABLE, NodeEvent.FAILED): NodeState.UNREACHABLE,
    (NodeState.UNREACHABLE, NodeEvent.SHORT): NodeState.SHORT,
    (NodeState.UNREACHABLE, NodeEvent.HEALTHY): NodeState.OK,
}


class NodeHealth:
    """Each node's :class:`NodeState` (OK until told otherwise), moved by
    :data:`NODE_TRANSITIONS`; no I/O."""

    def __init__(self) -> None:
        self._states: dict[str, NodeState] = {}

    def state(self, node: str) -> NodeState:
        """``node``'s state now."""
        return self._states.get(node, NodeState.OK)

    def event(self, node: str, event: NodeEvent) -> tuple[NodeState, NodeState]:
        """Apply ``event`` to ``node``; its state before and after."""
        before = self.state(node)
        after = NODE_TRANSITIONS[(before, event)]
        if after is NodeState.OK:
            self._states.pop(node, None)
        else:
            self._states[node] = after
        return before, after

    def takes_sends(self, node: str) -> bool:
        """True when sends to ``node``'s rooms are taken (a node is known and OK)."""
        return bool(node) and node not in self._states

    def takes_reads(self, node: str) -> bool:
        """True when reads of ``node``'s rooms are tried (known and not unreachable)."""
        return bool(node) and self._states.get(node) is not NodeState.UNREACHABLE

    def count(self, state: NodeState) -> int:
        """How many nodes are in ``state`` (not OK)."""
        return sum(1 for known in self._states.values() if known is state)

    def troubled(self) -> dict[str, NodeState]:
        """The nodes not OK, and their states."""
        return dict(self._states)


class NodeGate:
    """At most ``limit`` requests in flight to one node; each waits at most ``wait_s`` for
    its turn, then :class:`~chat_server.errors.NodeBusy` (for that request only)."""

    def __init__(self, name: str, limit: int, wait_s: float) -> None:
        self.name = name
        self.limit = limit
        self.wait_s = wait_s
        self._turns = asyncio.Semaphore(limit)
        #: turns held now
        self.in_flight = 0
        #: requests refused because the node was busy the whole wait
        self.refused = 0

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold one of the node's turns for the ``async with`` body."""
        try:
            async with asyncio.timeout(self.wait_s):
                await self._turns.acquire()
        except TimeoutError:
            self.refused += 1
            raise NodeBusy(
                f"Redis node {self.name}: {self.limit} requests in flight for {self.wait_s} s"
                " (REDIS_NODE_CONNECTIONS)"
            ) from None
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._turns.release()


class NodeGates:
    """One :class:`NodeGate` per node, made when first asked for."""

    def __init__(self, limit: int = NODE_CONNECTIONS, wait_s: float = POOL_WAIT_S) -> None:
        self._limit = limit
        self._wait_s = wait_s
        self._gates: dict[str, NodeGate] = {}

    def __call__(self, node: str) -> NodeGate:
        """``node``'s gate."""
        gate = self._gates.get(node)
        if gate is None:
            gate = self._gates[node] = NodeGate(node, self._limit, self._wait_s)
        return gate

    def refused(self) -> int:
        """Requests refused as busy, on every node."""
        return sum(gate.refused for gate in self._gates.values())


def online_replicas(replication: Mapping[str, Any]) -> int:
    """How many replicas ``INFO replication`` (as redis-py parses it) shows online."""
    return sum(
        1
        for key, value in replication.items()
        if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
    )


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

    def gate(self, node: str) -> NodeGate:
        """``node``'s bound on requests in flight."""

    def serves(self, node: str) -> bool:
        """True when ``node`` serves some slot (as last read)."""

    def busy_refusals(self) -> int:
        """Requests refused as busy (:class:`NodeGate`) so far, on every node."""


class OneRedis:
    """A single Redis: one node serving every channel."""

    def __init__(self, client: Redis, gates: NodeGates | None = None) -> None:
        self._client = client
        self.gate = gates or NodeGates()

    def serves(self, node: str) -> bool:
        """The one node serves every slot."""
        return node == ONE_NODE

    def busy_refusals(self) -> int:
        """Requests refused as busy so far."""
        return self.gate.refused()

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


@functools.lru_cache(maxsize=1 << 16)
def slot_of(channel: str) -> int:
    """The cluster slot of ``channel``, remembered: it never changes for a name, and
    redis-py's CRC16 is a Python loop over the name's bytes that every send would ask
    for three times (its submit, its batch, its node's share)."""
    return key_slot(channel.encode())


class ClusterSlots:
    """A Redis Cluster's slots as ``CLUSTER SLOTS`` last told, and a client per primary."""

    def __init__(self, cluster: RedisCluster, url: str, gates: NodeGates | None = None) -> None:
        self._cluster = cluster
        self._url = url
        self.gate = gates or NodeGates()
        #: the refresh under way, shared by whoever asks meanwhile
        self._refreshing: asyncio.Future[None] | None = None
        #: sorted slot-range starts, and for each range its end and primary ("host:port")
        self._starts: list[int] = []
        self._ranges: list[tuple[int, str]] = []
        self._clients: dict[str, Redis] = {}

    def node_of(self, channel: str) -> str:
        """The primary serving ``channel``'s slot ("" if no node serves it)."""
        slot = slot_of(channel)
        index = bisect.bisect_right(self._starts, slot) - 1
        if index < 0:
            return ""
        end, node = self._ranges[index]
        return node if slot <= end else ""

    def serves(self, node: str) -> bool:
        """True when ``node`` serves some slot (as last read)."""
        return any(primary == node for _, primary in self._ranges)

    def busy_refusals(self) -> int:
        """Requests refused as busy so far, on every node."""
        return self.gate.refused()

    async def refresh(self) -> None:
        """Read the slots again (one read at a time: a caller meanwhile shares it)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._read_slots())
            # its callers may all be gone (cancelled) when it fails: seen here, raised to them
            self._refreshing.add_done_callback(_seen)
        await asyncio.shield(self._refreshing)

    async def _read_slots(self) -> None:
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


def _seen(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
