"""Durable room history in Redis Streams, shared by every process on every machine.

With ``BROKER=redis`` this store replaces SQLite, on one Redis (a primary, with
replicas if wanted) or, with ``REDIS_CLUSTER=on``, a Redis Cluster: each commit script
touches one room, so each room lives on the primary serving its slot, and a pipeline
sends each primary its rooms' share. Give it ``maxmemory-policy noeviction``: evicting a
stream loses history (a lost ``seq`` key alone is recovered from its stream's last ID).
Each room's keys, channel and stored entries are laid out by
:mod:`chat_server.redis_rooms`.

**One lane per node.** Each node (each primary of a cluster) has its own queue and writer
task, so one primary's commits, its ``WAIT`` and publishes never wait on another's; a
room's sends go to the lane of the node serving it and stay there while any of them is
unsettled, so a room's batches commit one after another, in order, also when its slot
moves to a promoted replica meanwhile. Lanes report as they settle: rooms on different
nodes interleave, each room's batches stay in commit order (the
:class:`~chat_server.store.base.BatchLedger` a drain waits on keeps its promise whatever
order they come in).

**One atomic step.** A lane's batch from the group commit becomes one pipeline (a room
whose slot moved meanwhile goes to its new node, on that node's own connection) holding one
``EVALSHA`` per room; the script (:data:`COMMIT_SCRIPT`) numbers the room's messages
from its ``seq`` key, appends them to the stream, trims it and records the commit
marker. A script runs atomically and a failed one numbers nothing (it checks that the
stream accepts the first ID before it writes anything).

**Durable before seen.** Redis replicates asynchronously, so a primary that dies after
answering loses what its replica had not received. With ``ack_replicas`` above 0
(``REDIS_ACK_REPLICAS``) the node's pipeline ends with ``WAIT ack_replicas``
:data:`ACK_WAIT_MS` on the same connection (``WAIT`` counts that connection's writes,
and a script cannot call it); only when it confirms does a second script
(:data:`PUBLISH_SCRIPT`) raise the room's durable ``seq`` and ``SPUBLISH`` the batch as
one payload ``M<first seq> [entry, ...]``, and only then is it acked. Processes hear a
room's batches published after ``WAIT``, possibly out of ``seq`` order; the feed fills
what is missing from the stream, never past the durable ``seq`` (every write before a
confirmed one is on the replicas too: replication keeps the primary's order), and
``history`` reads no further. With 0, the commit script marks durable and publishes in
the same atomic step.

**Acks.** ``on_batch`` reports a message committed only once it is durable as asked;
broadcasting to this process's members is the broker's job (it hears the published
payload). With ``appendfsync always`` Redis writes and fsyncs the AOF before it sends
any reply or published message of that event-loop turn, so what was acked or seen
survives a crash of Redis; with ``everysec`` up to about a second of acked messages can
be lost when Redis itself crashes, unless a replica holds them (``WAIT``); without AOF,
RDB or a replica, a Redis restart loses the history.

**Outages.** A pipeline that fails with a connection error or does not answer within
:data:`COMMIT_ANSWER_S`, a ``WAIT`` that finds fewer replicas than asked, and a room whose
node answers ``MOVED``, ``ASK``, ``TRYAGAIN`` or ``CLUSTERDOWN`` leave that room's share
*in doubt*: its script may have run, or may still run. The store reads the slots again
and sends the share again, with backoff, for up to :data:`IN_DOUBT_WAIT_S`; the commit
marker makes the script idempotent (a batch that ran already answers its first ``seq``
again, stores nothing and writes only the marker's expiry, so the ``WAIT`` after it
covers the first run; one older than the marker's is refused), so each message is
stored once and acked as soon as it is durable. Only if that takes longer is the share
answered ``unavailable``, and then it may still be stored (a retry with the same ``ref``
gets its ``seq``).

**Two answers.** Reachability is a node's, kept in a
:class:`~chat_server.redis_nodes.NodeHealth` table: a node whose request failed is
*unreachable*, one whose commit was confirmed on fewer replicas than asked (after a
failover, until the old node rejoins; a lost replica) is *short*. Sends to its rooms are
then answered ``unavailable`` at once (``submit`` raises, and what waits in the queues
for it is answered, unwritten) rather than acked where one more failure would lose them,
while the in-doubt shares above settle within their bound; reads of an unreachable
node's rooms are refused too. A probe per refused node reads the slots again and asks
the node its role and replicas (``INFO replication``), with backoff up to
:data:`~chat_server.redis_rooms.BACKOFF_MAX_S`, until it is a primary with enough
replicas online (or serves no slot any more: its rooms moved): then its rooms' sends
are taken again. Reads take one of their node's turns
(:class:`~chat_server.redis_nodes.NodeGate`); a node whose turns stay taken answers that
one read ``unavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any, Final, NamedTuple

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from chat_server.errors import BrokerUnavailable, StoreError, StoreUnavailable
from chat_server.messages import Message
from chat_server.redis_nodes import (
    NodeEvent,
    NodeHealth,
    NodeState,
    OneRedis,
    Topology,
    online_replicas,
)
from chat_server.redis_rooms import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    CLOSE_WAIT_S,
    CONNECTION_ERRORS,
    RedisClient,
    raise_if_cancelled,
    room_channel,
    run_scripts,
    stream_key,
    stream_messages,
)
from chat_server.store.base import BatchCallback, BatchLedger, LedgerStore, StoreStats
from chat_server.store.redis_scripts import (
    ACK_WAIT_MS,
    COMMIT_SCRIPT,
    ELSEWHERE_ERRORS,
    PUBLISH_SCRIPT,
    CommitCalls,
    Outcome,
    commit_outcome,
    history_call,
    parse_answer,
    pipeline,
    publish_call,
    publish_outcome,
)
from chat_server.tail import COMMIT_BUCKETS_S, PlainHistogram
from chatlab.supervision import RESTART, STOP, supervisor

__all__ = ["COMMIT_SCRIPT", "RedisHistoryStore"]

log = logging.getLogger("chat_server.store")

#: how long a batch whose reply was lost waits for Redis to come back and settle it
IN_DOUBT_WAIT_S: Final = 10.0
#: how long a node's commit pipeline (its WAIT included) or publish may take before the
#: node is taken for unreachable (a frozen node holds a connection open, answering nothing)
COMMIT_ANSWER_S: Final = ACK_WAIT_MS / 1000 + 2.0
#: how long a read may take before its node is taken for unreachable
READ_ANSWER_S: Final = 2.0
#: how long a refused node's probe waits for its answer
PROBE_ANSWER_S: Final = 1.0

#: a submission: the message, its context, its ledger ticket
_Item = tuple[Message, Any, int]
#: one room's share of a batch
_Group = tuple[str, list[_Item]]


class _Refusal(NamedTuple):
    """Why a node's rooms refuse sends: the counted reason and the error's detail."""

    reason: str
    detail: str


class _Lane:
    """One node's writer: its queue (up to ``batch_max`` taken into each commit) and task.

    A room's sends go to the lane of the node serving it, and stay on that lane while any
    of them is queued or unsettled there (so a room's later batch never overtakes one in
    doubt, even once its slot moved to a promoted replica); then the next send goes to
    the lane of the node serving the room by then."""

    __slots__ = ("node", "queue", "task", "wakeup")

    def __init__(self, node: str) -> None:
        self.node = node
        self.queue: deque[_Item] = deque()
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class RedisHistoryStore(LedgerStore):
    """A :class:`HistoryStore` on Redis Streams with group commit, one writer per node.

    ``submit`` queues at most ``queue_max`` messages in all (beyond that, or while the
    room's node is refused, it raises ``StoreUnavailable`` and queues nothing); each
    node's writer takes up to ``batch_max`` at a time into one pipeline, so whatever
    queued while the previous pipeline was out goes into the next. ``writer`` names this
    process in the commit markers and must be unique among the processes sharing Redis.
    Every method is called from the event loop that called :meth:`start`.
    """

    def __init__(
        self,
        *,
        client: RedisClient,
        writer: str,
        on_batch: BatchCallback | None = None,
        queue_max: int = 10000,
        batch_max: int = 1000,
        history_max: int = 0,
        commit_seconds: PlainHistogram | None = None,
        send_ref_window_s: float = 0,
        topology: Topology | None = None,
        ack_replicas: int = 0,
        in_doubt_wait_s: float = IN_DOUBT_WAIT_S,
    ) -> None:
        """Configure the store; nothing is connected until :meth:`start`.

        ``commit_seconds`` receives each batch's commit time (its pipelines' round trips,
        ``WAIT`` included). ``topology`` says which node serves each room (default: the
        one Redis ``client`` is); ``ack_replicas`` is how many of its replicas must hold
        a commit before it is published and acked; a batch that cannot be settled within
        ``in_doubt_wait_s`` is answered unavailable.
        """
        self.commit_seconds = (
            PlainHistogram(COMMIT_BUCKETS_S) if commit_seconds is None else commit_seconds
        )
        if queue_max < 1 or batch_max < 1 or history_max < 0:
            raise ValueError("queue_max and batch_max must be at least 1, history_max 0 or more")
        self._client = client
        if topology is None:
            if isinstance(client, RedisCluster):
                raise ValueError("a Redis Cluster client needs its topology (ClusterSlots)")
            topology = OneRedis(client)
        self._topology = topology
        self._ack_replicas = ack_replicas
        self._in_doubt_wait_s = in_doubt_wait_s
        self._health = NodeHealth()
        self._commit_calls = CommitCalls(
            writer=writer,
            history_max=history_max,
            send_ref_window_s=send_ref_window_s,
            ack_replicas=ack_replicas,
        )
        self._ledger = BatchLedger(on_batch)
        self._queue_max = queue_max
        self._batch_max = batch_max
        self._started = False
        #: one lane per node ever written to
        self._lanes: dict[str, _Lane] = {}
        #: rooms with sends queued or unsettled, and the lane they are on
        self._room_lanes: dict[str, _Lane] = {}
        self._room_items: Counter[str] = Counter()
        #: every item taken into a commit and not reported yet, by ticket
        self._unsettled: dict[int, _Item] = {}
        self._queued = 0
        #: one probe per refused node, until it takes sends again
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._accepting = False
        self._closed = False
        self._batch_no = 0
        self._last_seq: dict[str, int] = {}

    # ---- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Load the commit script; StoreUnavailable if Redis is unreachable."""
        if self._started or self._closed:
            raise StoreError("history store already started (or closed)")
        self._started = True
        try:
            await self._topology.refresh()
            await self._client.script_load(COMMIT_SCRIPT.source)
            await self._client.script_load(PUBLISH_SCRIPT.source)
        except (RedisError, OSError, BrokerUnavailable) as exc:
            self._closed = True
            raise StoreUnavailable(f"cannot reach Redis: {exc}") from exc
        self._accepting = True

    async def close(self) -> None:
        """Stop accepting and flush (an in-doubt batch waits a bounded time); keeps the client."""
        if self._closed:
            return
        self._accepting = False
        self._closed = True
        for lane in self._lanes.values():
            lane.wakeup.set()
        writers = [lane.task for lane in self._lanes.values() if lane.task is not None]
        if writers:
            await asyncio.gather(*writers, return_exceptions=True)
        probes = list(self._probes.values())
        for probe in probes:
            probe.cancel()
        if probes:
            await asyncio.wait(probes, timeout=CLOSE_WAIT_S)

    # ---- writes ----------------------------------------------------------------------

    def submit(self, message: Message, context: Any) -> None:
        """Queue ``message`` (``seq`` 0) for its node's next group commit; never blocks.

        Raises ``StoreUnavailable`` and queues nothing when the store is not started or
        closing, the room's node is known unreachable or short of replicas (or no node
        serves its slot), or ``queue_max`` messages already wait.
        """
        if not self._accepting:
            self._ledger.refused("closed")
            raise StoreUnavailable(f"history store {'closed' if self._closed else 'not started'}")
        room = message.room
        node = self._topology.node_of(room_channel(room))
        if not self._health.takes_sends(node):
            reason = self._refusal(node)
            self._ledger.refused(reason.reason)
            raise StoreUnavailable(reason.detail)
        if self._queued >= self._queue_max:
            self._ledger.refused("queue_full")
            raise StoreUnavailable("history store overloaded")
        lane = self._room_lanes.get(room)
        if lane is None:
            lane = self._room_lanes[room] = self._lane(node)
        lane.queue.append((message, context, self._ledger.submitted()))
        self._room_items[room] += 1
        self._queued += 1
        lane.wakeup.set()

    def last_seq(self, room: str) -> int:
        """The last ``seq`` this process committed to ``room`` (other processes' are not seen)."""
        return self._last_seq.get(room, 0)

    def stats(self) -> StoreStats:
        """The ledger's counters, the queues' depth, the primaries now short of replicas or
        unreachable, the requests refused as their node was busy."""
        return dataclasses.replace(
            self._ledger.stats(queue_depth=self._queued),
            primaries_short_of_replicas=self._health.count(NodeState.SHORT),
            primaries_unreachable=self._health.count(NodeState.UNREACHABLE),
            node_busy_refusals=self._topology.busy_refusals(),
        )

    def _lane(self, node: str) -> _Lane:
        """``node``'s lane, its writer started if new."""
        lane = self._lanes.get(node)
        if lane is None:
            lane = self._lanes[node] = _Lane(node)
            # no ack can come for its rooms without the writer: the process stops if it ends
            lane.task = supervisor().start(
                "chat-history-writer", functools.partial(self._write_batches, lane), STOP
            )
        return lane

    def _refusal(self, node: str) -> _Refusal:
        """Why sends to ``node``'s rooms are refused now: the counted reason (see
        :data:`~chat_server.store.base.REFUSAL_REASONS`) and the error's detail."""
        if not node:
            return _Refusal(
                "no_node", "history store unavailable: no Redis node serves the room (a failover?)"
            )
        if self._health.state(node) is NodeState.SHORT:
            return _Refusal(
                "node_short_of_replicas",
                f"history store unavailable: Redis node {node} holds fewer replicas than"
                " REDIS_ACK_REPLICAS asks",
            )
        return _Refusal(
            "node_unreachable", f"history store unavailable: Redis node {node} is unreachable"
        )

    def _report(self, items: list[_Item], error: StoreError | None) -> None:
        """Report ``items`` (settled) to the ledger; their rooms may change lanes after."""
        room_items = self._room_items
        for message, _, ticket in items:
            self._unsettled.pop(ticket, None)
            room = message.room
            room_items[room] -= 1
            if room_items[room] <= 0:
                del room_items[room]
                self._room_lanes.pop(room, None)
        self._ledger.report(
            [(message, context) for message, context, _ in items],
            error,
            [ticket for _, _, ticket in items],
        )

    async def _write_batches(self, lane: _Lane) -> None:
        """A lane's writer: one pipeline at a time, until closed and its queue is empty."""
        queue = lane.queue
        while True:
            while not queue:
                if self._closed:
                    return
                lane.wakeup.clear()
                await lane.wakeup.wait()
            # one turn of the loop first: sends already read from the clients' sockets join
            # this batch rather than the next (group commit at no wait: a lane commits on
            # its own node's cycle, so its batches are smaller than one writer's for all)
            await asyncio.sleep(0)
            batch = [queue.popleft() for _ in range(min(len(queue), self._batch_max))]
            self._queued -= len(batch)
            for item in batch:
                self._unsettled[item[2]] = item
            started = time.perf_counter()
            try:
                await self._commit(batch)
                self.commit_seconds.observe(time.perf_counter() - started)
            except Exception:
                log.exception("history store: a batch of %d failed unexpectedly", len(batch))
                left = [item for item in batch if item[2] in self._unsettled]
                if left:
                    self._report(left, StoreError("history store failed"))

    async def _commit(self, batch: list[_Item]) -> None:
        """Commit ``batch`` (one script call per room, each node its share) and report each
        room's part once it is settled: durable and published, refused, or in doubt too long."""
        rooms: dict[str, list[_Item]] = {}
        for item in batch:
            rooms.setdefault(item[0].room, []).append(item)
        self._batch_no += 1
        token = str(self._batch_no)
        by_node: dict[str, list[_Group]] = {}
        for group in rooms.items():
            node = self._topology.node_of(room_channel(group[0]))
            if self._health.takes_sends(node):
                by_node.setdefault(node, []).append(group)
            else:  # refused meanwhile: not written, answered at once
                self._report(group[1], StoreUnavailable(self._refusal(node).detail))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._in_doubt_wait_s
        delay = BACKOFF_MIN_S
        while by_node:
            if len(by_node) == 1:  # a lane's batch is one node's: no task to gather
                [(node, groups)] = by_node.items()
                pending = await self._commit_on(node, groups, token)
            else:  # rooms whose slot moved while they stayed on this lane
                unsettled = await asyncio.gather(
                    *(self._commit_on(node, groups, token) for node, groups in by_node.items())
                )
                pending = [group for groups in unsettled for group in groups]
            if not pending:
                return
            if loop.time() + delay > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)
            with contextlib.suppress(RedisError, OSError, StoreError, BrokerUnavailable):
                await self._topology.refresh()
            by_node = {}
            for group in pending:
                by_node.setdefault(self._topology.node_of(room_channel(group[0])), []).append(group)
        else:
            return  # every room refused before it was written
        log.warning(
            "history store: %d messages in %d rooms stayed in doubt for %.0f s (their Redis"
            " node or its replicas unreachable): answered unavailable, though they may yet"
            " be stored",
            sum(len(items) for _, items in pending),
            len(pending),
            self._in_doubt_wait_s,
        )
        self._report(
            [item for _, items in pending for item in items],
            StoreUnavailable("history store unavailable: the commit could not be settled"),
        )

    async def _commit_on(self, node: str, groups: list[_Group], token: str) -> list[_Group]:
        """Run ``groups``' commit scripts on ``node`` with ``WAIT`` behind them on the same
        connection; publish and report what is durable; return the groups still in doubt."""
        if not node:  # no node serves the slot (a failover under way): ask again later
            return groups
        client = self._topology.client(node)
        calls = self._commit_calls.call
        try:
            async with asyncio.timeout(COMMIT_ANSWER_S):
                replies = await pipeline(
                    client,
                    [calls(room, [m for m, _, _ in items], token) for room, items in groups],
                    self._ack_replicas,
                )
        except (*CONNECTION_ERRORS, TimeoutError) as exc:
            self._node_failed(node, exc)
            return groups
        replicas = replies.replicas
        if replies.wait_error is not None:
            log.warning("history store: WAIT on %s failed: %s", node, replies.wait_error)
        durable: list[tuple[_Group, tuple[int, dict[int, int]]]] = []
        unsettled: list[_Group] = []
        ran = False
        for group, reply in zip(groups, replies.scripts, strict=True):
            outcome = commit_outcome(reply, replicas, self._ack_replicas)
            if outcome is Outcome.SETTLED:
                durable.append((group, parse_answer(reply)))
                ran = True
            elif outcome is Outcome.IN_DOUBT:
                unsettled.append(group)
                ran = ran or not isinstance(reply, Exception)
            elif outcome is Outcome.REFUSED:
                log.warning("history store: Redis refused a commit: %s", reply)
                self._report(group[1], StoreUnavailable(f"history store unavailable: {reply}"))
            else:
                log.error("history store: commit to %s failed: %s", group[0], reply)
                self._report(group[1], StoreError(f"history store failed: {reply}"))
        if ran:
            self._note_replicas(node, replicas)
        if durable:
            unsettled.extend(await self._publish(node, client, durable))
        return unsettled

    def _note_replicas(self, node: str, replicas: int) -> None:
        """At least one commit script ran on ``node`` (answered, not an error) and ``WAIT``
        counted ``replicas``: healthy, or short. Called only then: a pipeline where no
        script ran says nothing of the node's replicas."""
        short = replicas < self._ack_replicas
        before, after = self._health.event(node, NodeEvent.SHORT if short else NodeEvent.HEALTHY)
        if after is before:
            return
        if short:
            log.warning(
                "history store: %s confirmed a commit on %d of the %d replicas asked"
                " (REDIS_ACK_REPLICAS); its rooms' sends are answered unavailable until it"
                " has them",
                node,
                replicas,
                self._ack_replicas,
            )
            self._refused(node)
        else:
            log.info("history store: %s takes sends again", node)

    def _node_failed(self, node: str, exc: BaseException) -> None:
        """A request to ``node`` failed on its connection or did not answer in time."""
        before, after = self._health.event(node, NodeEvent.FAILED)
        if after is not before:
            log.warning(
                "history store: Redis node %s unreachable (%r); its rooms' sends are answered"
                " unavailable meanwhile",
                node,
                exc,
            )
            self._refused(node)

    def _refused(self, node: str) -> None:
        """``node`` stopped taking sends: answer what waits for it in the queues (nothing of
        it was written), and probe it until it takes them again."""
        error = StoreUnavailable(self._refusal(node).detail)
        for lane in list(self._lanes.values()):  # a report's callback may open a lane
            keep: deque[_Item] = deque()
            refused: list[_Item] = []
            for item in lane.queue:
                if self._topology.node_of(room_channel(item[0].room)) == node:
                    refused.append(item)
                else:
                    keep.append(item)
            if refused:
                lane.queue.clear()
                lane.queue.extend(keep)
                self._queued -= len(refused)
                self._report(refused, error)
        probe = self._probes.get(node)
        if probe is None or probe.done():
            self._probes[node] = supervisor().start(
                "chat-history-probe", functools.partial(self._probe, node), RESTART
            )

    async def _probe(self, node: str) -> None:
        """Ask ``node`` (with backoff) for its role and replicas until it takes sends again:
        a primary with as many replicas online as asked, or serving no slot any more."""
        delay = BACKOFF_MIN_S
        while not self._health.takes_sends(node):
            raise_if_cancelled()
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, BACKOFF_MAX_S)
            with contextlib.suppress(RedisError, OSError, BrokerUnavailable):
                await self._topology.refresh()
            if not self._topology.serves(node):
                self._health.event(node, NodeEvent.HEALTHY)
                log.info("history store: %s serves no room now; its rooms moved", node)
                break
            try:
                async with asyncio.timeout(PROBE_ANSWER_S):
                    replication = await self._topology.client(node).info("replication")
            except (*CONNECTION_ERRORS, RedisError, TimeoutError):
                continue
            if replication.get("role") != "master":
                continue  # demoted: the next reading of the slots moves its rooms
            replicas = online_replicas(replication)
            if replicas >= self._ack_replicas:
                self._health.event(node, NodeEvent.HEALTHY)
                log.info("history store: %s answers with %d replicas; takes sends", node, replicas)
            else:
                self._health.event(node, NodeEvent.SHORT)  # reachable again, still short
        self._probes.pop(node, None)

    async def _publish(
        self, node: str, client: Redis, durable: list[tuple[_Group, tuple[int, dict[int, int]]]]
    ) -> list[_Group]:
        """Mark durable, publish (unless the commit script did) and report each group;
        return those whose publishing failed (they stay in doubt)."""
        if self._ack_replicas:
            calls = [
                publish_call(room, [m for m, _, _ in items], answer)
                for (room, items), answer in durable
            ]
            try:
                async with asyncio.timeout(COMMIT_ANSWER_S):
                    replies = (await pipeline(client, calls, 0)).scripts
            except (*CONNECTION_ERRORS, TimeoutError) as exc:
                self._node_failed(node, exc)
                return [group for group, _ in durable]
        else:
            replies = [None] * len(durable)
        unsettled = []
        for (group, answer), reply in zip(durable, replies, strict=True):
            if publish_outcome(reply) is Outcome.IN_DOUBT:
                log.info("history store: publishing to %s failed (%s); retried", group[0], reply)
                unsettled.append(group)
            else:
                self._settled(group, answer)
        return unsettled

    def _settled(self, group: _Group, answer: tuple[int, dict[int, int]]) -> None:
        """Give ``group``'s messages their seqs and report them committed."""
        room, items = group
        first, repeats = answer
        fresh = 0
        for i, (message, _, _) in enumerate(items):
            if i in repeats:  # stored before (an idempotent send): its seq
                message.seq = repeats[i]
            else:
                message.seq = first + fresh
                fresh += 1
        if fresh:
            self._last_seq[room] = max(self._last_seq.get(room, 0), first + fresh - 1)
        self._report(items, None)

    # ---- reads -------------------------------------------------------------------------

    async def _read(self, room: str, call: Callable[[Redis], Awaitable[Any]]) -> Any:
        """Run a read on the node serving ``room``, holding one of its turns; map Redis
        trouble to ``StoreUnavailable`` (that node unreachable, slow or busy; the slot
        moving) or ``StoreError``."""
        if not self._started or self._closed:
            raise StoreUnavailable("history store closed" if self._closed else "not started")
        channel = room_channel(room)
        for attempt in range(2):
            node = self._topology.node_of(channel)
            if not self._health.takes_reads(node):
                raise StoreUnavailable(self._refusal(node).detail)
            try:
                async with self._topology.gate(node).turn(), asyncio.timeout(READ_ANSWER_S):
                    return await call(self._topology.client(node))
            except ELSEWHERE_ERRORS as exc:  # the slot moved (or is moving): read it again
                if attempt:
                    raise StoreUnavailable(f"history store unavailable: {exc}") from exc
                with contextlib.suppress(RedisError, OSError, BrokerUnavailable):
                    await self._topology.refresh()
            except BrokerUnavailable as exc:  # the node's turns are all taken (NodeBusy)
                raise StoreUnavailable(f"history store unavailable: {exc}") from exc
            except (*CONNECTION_ERRORS, TimeoutError) as exc:
                self._node_failed(node, exc)
                raise StoreUnavailable(f"history store unavailable: {exc!r}") from exc
            except RedisError as exc:
                raise StoreError(f"history store failed: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def history(self, room: str, before: int | None, limit: int) -> list[Message]:
        """The latest ``limit`` messages with ``seq < before`` (no bound when None), ascending."""
        if limit <= 0 or (before is not None and before <= 1):
            return []
        call = history_call(room, before, limit)

        async def read(client: Redis) -> Any:
            (entries,) = await run_scripts(client, [call])
            if isinstance(entries, Exception):
                raise entries
            return entries

        entries = await self._read(room, read)
        entries.reverse()  # a script's XREVRANGE: each entry's fields as a flat list
        pairs = [(eid, dict(zip(f[::2], f[1::2], strict=True))) for eid, f in entries]
        return stream_messages(room, pairs)

    async def after(self, room: str, after_seq: int, limit: int) -> list[Message]:
        """Up to ``limit`` stored messages with ``seq > after_seq``, ascending: not bounded
        by the room's durable seq (the replay bounds them by what this process delivered)."""
        if limit <= 0:
            return []
        start = "-" if after_seq < 0 else str(after_seq + 1)
        entries = await self._read(
            room, lambda client: client.xrange(stream_key(room), start, "+", count=limit)
        )
        return stream_messages(room, entries)
