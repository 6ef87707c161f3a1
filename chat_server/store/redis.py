"""Durable room history in Redis Streams, shared by every process on every machine.

With ``BROKER=redis`` this store replaces SQLite, on one Redis (a primary, with
replicas if wanted) or, with ``REDIS_CLUSTER=on``, a Redis Cluster: each commit script
touches one room, so each room lives on the primary serving its slot, and a pipeline
sends each primary its rooms' share. Give it ``maxmemory-policy noeviction``: evicting a
stream loses history (a lost ``seq`` key alone is recovered from its stream's last ID).
Each room's keys, channel and stored entries are laid out by
:mod:`chat_server.redis_rooms`.

**One atomic step.** A batch from the group commit becomes one pipeline per node
(each primary of a cluster gets its rooms' share, on its own connection) holding one
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

**Outages.** A pipeline that fails with a connection error, a ``WAIT`` that finds fewer
replicas than asked, and a room whose node answers ``MOVED``, ``ASK``, ``TRYAGAIN`` or
``CLUSTERDOWN`` leave that room's share *in doubt*: its script may have run, or may
still run. The store reads the slots again and sends the share again, with backoff,
for up to :data:`IN_DOUBT_WAIT_S`; the commit marker makes the script idempotent (a
batch that ran already answers its first ``seq`` again, stores nothing and writes only
the marker's expiry, so the ``WAIT`` after it covers the first run; one older than the
marker's is refused), so each message is stored once and acked as soon as it is
durable. Only if that takes longer is the share answered ``unavailable``, and then it
may still be stored (a retry with the same ``ref`` gets its ``seq``). So a primary with
fewer replicas than asked (after a failover, until the old node rejoins) answers its
rooms' sends ``unavailable`` rather than ack what one more failure would lose. While
Redis is unreachable, ``submit`` raises ``StoreUnavailable`` at once, and a probe
reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    TryAgainError,
)

from chat_server.errors import BrokerUnavailable, StoreError, StoreUnavailable
from chat_server.messages import Message
from chat_server.redis_nodes import OneRedis, Topology
from chat_server.redis_rooms import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    CLOSE_WAIT_S,
    CONNECTION_ERRORS,
    Entry,
    RedisClient,
    Script,
    commit_key,
    durable_key,
    encode_entry,
    legacy_send_ref_key,
    raise_if_cancelled,
    room_channel,
    run_scripts,
    send_key,
    seq_key,
    stream_key,
    stream_messages,
)
from chat_server.store.base import BatchCallback, BatchLedger, LedgerStore, StoreStats
from chat_server.tail import COMMIT_BUCKETS_S, PlainHistogram
from chatlab.supervision import RESTART, STOP, supervisor

__all__ = ["COMMIT_SCRIPT", "RedisHistoryStore"]

log = logging.getLogger("chat_server.store")

#: how long a batch whose reply was lost waits for Redis to come back and settle it
IN_DOUBT_WAIT_S: Final = 10.0
#: replies saying Redis did not run a command but may later (answered ``unavailable``)
TRANSIENT_ERRORS: Final = (
    BusyLoadingError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
)
#: replies saying the node did not run the script because another serves the slot now, or
#: its keys are moving: the slots are read again and it is sent again (while in doubt)
ELSEWHERE_ERRORS: Final = (AskError, ClusterDownError, MovedError, TryAgainError)
#: how long a commit's WAIT waits for its replicas; short of them the batch stays in doubt
ACK_WAIT_MS: Final = 1000

COMMIT_SCRIPT: Final = Script("""
-- KEYS[1] the room's seq, KEYS[2] its stream, KEYS[3] this writer's commit marker,
-- KEYS[4] the room's durable seq,
-- KEYS[5..] two send-ref keys of each message that has a digest below, in order: its own
-- (``sent:``, one per ref and body) and the one-per-ref key of the earlier layout
-- ARGV[1] the room's channel, ARGV[2] the batch number (rising with each batch of this
-- writer), ARGV[3] HISTORY_MAX (0: all), ARGV[4] SEND_REF_WINDOW_S (0: off),
-- ARGV[5] "1" when no replica is waited for (mark durable and publish here), else "0"
-- (the store does both once WAIT confirmed the batch),
-- ARGV[6..5+n] the messages as JSON arrays [user, body, ts, ref], ARGV[6+n..5+2n] each
-- message's body digest when it has a ref and the window is on, else "".
-- Returns the answer "<first seq>[ <index>:<seq>...]": the new messages are numbered
-- from the first seq in order; each listed index (0-based) repeats the send stored
-- with that seq within the window (same user, ref and body) and is not stored or
-- published again.
local marker = redis.call('GET', KEYS[3])
if marker then
  -- this batch ran already (a retry after a lost reply): answer as it did, storing
  -- nothing; an older batch arriving late must not run after a newer one did
  local done, done_answer = string.match(marker, '^(%d+) (.+)$')
  if tonumber(done) == tonumber(ARGV[2]) then
    -- still a write: the WAIT after this retry then covers the batch's first run
    redis.call('EXPIRE', KEYS[3], 86400)
    return done_answer
  end
  if tonumber(done) > tonumber(ARGV[2]) then
    return redis.error_reply('STALE batch ' .. ARGV[2] .. ' arrived after batch ' .. done)
  end
end
local last_seq = redis.call('GET', KEYS[1])
if not last_seq and redis.call('EXISTS', KEYS[2]) == 1 then
  -- the seq key is gone but the stream is not: go on after the stream's last ID
  local info = redis.call('XINFO', 'STREAM', KEYS[2])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last_seq = string.match(info[i + 1], '^(%d+)') end
  end
end
local first = tonumber(last_seq or '0') + 1
local n = (#ARGV - 5) / 2
local window = tonumber(ARGV[4])
local answer = {string.format('%d', first)}
local fresh = {}
local fresh_refs = {}
local in_batch = {}
local ref_keys = 4
for i = 1, n do
  local digest = ARGV[5 + n + i]
  local repeated = nil
  if digest ~= '' then
    local key, legacy = KEYS[ref_keys + 1], KEYS[ref_keys + 2]
    ref_keys = ref_keys + 2
    repeated = in_batch[key] or redis.call('GET', key)
    if not repeated then
      -- stored by a process of the earlier layout (a rolling upgrade): it kept the
      -- newest body per ref, with its own seq
      local stored = redis.call('GET', legacy)
      if stored then
        local stored_digest, stored_seq = string.match(stored, '^(%x+) (%d+)$')
        if stored_digest == digest then repeated = stored_seq end
      end
    end
    if not repeated then
      fresh_refs[#fresh + 1] = {key, legacy, digest}
      in_batch[key] = string.format('%d', first + #fresh)
    end
  end
  if repeated then
    answer[#answer + 1] = string.format('%d:%s', i - 1, repeated)
  else
    fresh[#fresh + 1] = ARGV[5 + i]
  end
end
-- the first XADD fails (and the script stops) before anything is written if the
-- stream is ahead of the seq key; the later ones cannot fail after it succeeded
for i = 1, #fresh do
  redis.call('XADD', KEYS[2], string.format('%d-0', first + i - 1), 'm', fresh[i])
  local send_ref = fresh_refs[i]
  if send_ref then
    local seq = string.format('%d', first + i - 1)
    redis.call('SET', send_ref[1], seq, 'EX', window)
    -- what a process of the earlier layout reads (the newest body per ref)
    redis.call('SET', send_ref[2], send_ref[3] .. ' ' .. seq, 'EX', window)
  end
end
if ARGV[5] == '0' and #fresh > 0 and redis.call('EXISTS', KEYS[4]) == 0 then
  -- the room's first commit that waits for replicas: what it held before stays readable
  -- (it was acked without waiting), the new messages only once WAIT confirms them
  redis.call('SET', KEYS[4], string.format('%d', first - 1))
end
local reply = table.concat(answer, ' ')
redis.call('SET', KEYS[3], ARGV[2] .. ' ' .. reply, 'EX', 86400)
if #fresh == 0 then return reply end
local last = first + #fresh - 1
redis.call('SET', KEYS[1], string.format('%d', last))
local keep = tonumber(ARGV[3])
if keep > 0 and last > keep then
  redis.call('XTRIM', KEYS[2], 'MINID', string.format('%d-0', last - keep + 1))
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[4], string.format('%d', last))
  redis.call('SPUBLISH', ARGV[1],
    'M' .. string.format('%d', first) .. ' [' .. table.concat(fresh, ',') .. ']')
end
return reply
""")

PUBLISH_SCRIPT: Final = Script("""
-- After WAIT confirmed a batch on this node: raise the room's durable seq and publish.
-- KEYS[1] the room's durable seq; ARGV[1] the room's channel, ARGV[2] the batch's
-- highest seq (new or repeated), ARGV[3] its new messages' payload ("" if none).
local durable = tonumber(redis.call('GET', KEYS[1]) or '0')
local upto = tonumber(ARGV[2])
if upto > durable then redis.call('SET', KEYS[1], ARGV[2]) end
if ARGV[3] ~= '' then
  redis.call('SPUBLISH', ARGV[1], ARGV[3])
elseif upto > durable then
  -- nothing new, but what was stored before it is durable now: feeds read it back
  redis.call('SPUBLISH', ARGV[1], 'D' .. ARGV[2])
end
return durable
""")

HISTORY_SCRIPT: Final = Script("""
-- KEYS[1] the room's stream, KEYS[2] its durable seq, KEYS[3] its seq (stands in for a
-- room written before the durable seq existed); ARGV[1] the highest seq wanted ("+":
-- any), ARGV[2] how many. The latest ones up to both, newest first.
local bound = redis.call('GET', KEYS[2]) or redis.call('GET', KEYS[3]) or '0'
local upto = tonumber(bound)
if ARGV[1] ~= '+' and tonumber(ARGV[1]) < upto then upto = tonumber(ARGV[1]) end
if upto < 1 then return {} end
return redis.call('XREVRANGE', KEYS[1], string.format('%d', upto), '-', 'COUNT', ARGV[2])
""")


def _body_digest(message: Message) -> str:
    """What the commit script tells a repeated send by: its body's digest."""
    return hashlib.blake2b(message.body.encode(), digest_size=8).hexdigest()


def _parse_answer(answer: bytes | str | int) -> tuple[int, dict[int, int]]:
    """The commit script's answer: the first new seq, and the repeats' seqs by index."""
    if isinstance(answer, int):
        return answer, {}
    first, *repeats = (answer.decode() if isinstance(answer, bytes) else answer).split(" ")
    return int(first), {
        int(index): int(seq) for index, seq in (repeat.split(":") for repeat in repeats)
    }


_Item = tuple[Message, Any]
#: one room's share of a batch
_Group = tuple[str, list[_Item]]


async def _pipeline(
    client: Redis, calls: list[tuple[Script, list[str], list[Any]]], wait: int
) -> list[Any]:
    """Run ``calls`` in one pipeline on one node's connection, then (``wait`` > 0) ``WAIT
    wait`` on that connection, whose reply comes last: it counts the replicas holding
    every write this connection made. A node that lacked a script gets it and the whole
    pipeline again (calls that ran answer from their commit markers). Connection errors
    propagate (in doubt)."""
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        if wait:
            pipe.execute_command("WAIT", wait, ACK_WAIT_MS)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        missing = {
            call[0]
            for call, reply in zip(calls, replies, strict=False)
            if isinstance(reply, NoScriptError)
        }
        if not missing or attempt:
            break
        for script in missing:  # a restarted node, or a replica promoted since
            await client.script_load(script.source)
    return replies


class RedisHistoryStore(LedgerStore):
    """A :class:`HistoryStore` on Redis Streams with group commit through one writer task.

    ``submit`` queues at most ``queue_max`` messages (beyond that, or while Redis
    is unreachable, it raises ``StoreUnavailable`` and queues nothing); the writer
    takes up to ``batch_max`` at a time into one pipeline, so whatever queued while
    the previous pipeline was out goes into the next. ``writer`` names this process
    in the commit markers and must be unique among the processes sharing Redis.
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
        self._short: dict[str, bool] = {}
        self._writer_name = writer
        self._ledger = BatchLedger(on_batch)
        self._queue_max = queue_max
        self._batch_max = batch_max
        self._history_max = str(history_max)
        self._send_ref_window = str(round(send_ref_window_s))
        self._refs_on = round(send_ref_window_s) > 0
        self._started = False
        self._queue: deque[_Item] = deque()
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._accepting = False
        self._closed = False
        self._reachable = True
        self._batch_no = 0
        self._last_seq: dict[str, int] = {}

    # ---- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Load the commit script and start the writer; StoreUnavailable if Redis is unreachable."""
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
        # no ack can come without the writer: the process stops if it ends
        self._writer = supervisor().start("chat-history-writer", self._write_batches, STOP)
        self._accepting = True

    async def close(self) -> None:
        """Stop accepting and flush (an in-doubt batch waits a bounded time); keeps the client."""
        if self._closed:
            return
        self._accepting = False
        self._closed = True
        self._wakeup.set()
        if self._writer is not None:
            await self._writer
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.wait([self._probe], timeout=CLOSE_WAIT_S)

    # ---- writes ----------------------------------------------------------------------

    def submit(self, message: Message, context: Any) -> None:
        """Queue ``message`` (``seq`` 0) for the next group commit; never blocks.

        Raises ``StoreUnavailable`` and queues nothing when the store is not
        started or closing, Redis is known to be unreachable, or ``queue_max``
        messages already wait.
        """
        if not self._accepting:
            raise StoreUnavailable(f"history store {'closed' if self._closed else 'not started'}")
        if not self._reachable:
            raise StoreUnavailable("history store unavailable: Redis is unreachable")
        if len(self._queue) >= self._queue_max:
            raise StoreUnavailable("history store overloaded")
        self._queue.append((message, context))
        self._ledger.submitted()
        self._wakeup.set()

    def last_seq(self, room: str) -> int:
        """The last ``seq`` this process committed to ``room`` (other processes' are not seen)."""
        return self._last_seq.get(room, 0)

    async def _write_batches(self) -> None:
        """The writer task: one pipeline at a time, until closed and the queue is empty."""
        queue = self._queue
        while True:
            while not queue:
                if self._closed:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            batch = [queue.popleft() for _ in range(min(len(queue), self._batch_max))]
            started = time.perf_counter()
            try:
                await self._commit(batch)
                self.commit_seconds.observe(time.perf_counter() - started)
            except Exception:
                log.exception("history store: a batch of %d failed unexpectedly", len(batch))
                self._ledger.report(batch, StoreError("history store failed"))

    async def _commit(self, batch: list[_Item]) -> None:
        """Commit ``batch`` (one script call per room, each node its share) and report each
        room's part once it is settled: durable and published, refused, or in doubt too long."""
        rooms: dict[str, list[_Item]] = {}
        for item in batch:
            rooms.setdefault(item[0].room, []).append(item)
        self._batch_no += 1
        token = str(self._batch_no)
        if not self._reachable:
            self._ledger.report(batch, StoreUnavailable("history store unavailable: Redis down"))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._in_doubt_wait_s
        delay = BACKOFF_MIN_S
        pending = list(rooms.items())
        while True:
            by_node: dict[str, list[_Group]] = {}
            for group in pending:
                by_node.setdefault(self._topology.node_of(room_channel(group[0])), []).append(group)
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
        log.warning(
            "history store: %d messages in %d rooms stayed in doubt for %.0f s (Redis or "
            "their replicas unreachable): answered unavailable, though they may yet be stored",
            sum(len(items) for _, items in pending),
            len(pending),
            self._in_doubt_wait_s,
        )
        self._ledger.report(
            [item for _, items in pending for item in items],
            StoreUnavailable("history store unavailable: the commit could not be settled"),
        )

    async def _commit_on(self, node: str, groups: list[_Group], token: str) -> list[_Group]:
        """Run ``groups``' commit scripts on ``node`` with ``WAIT`` behind them on the same
        connection; publish and report what is durable; return the groups still in doubt."""
        if not node:  # no node serves the slot (a failover under way): ask again later
            return groups
        client = self._topology.client(node)
        calls = [self._commit_call(room, items, token) for room, items in groups]
        try:
            replies = await _pipeline(client, calls, self._ack_replicas)
        except CONNECTION_ERRORS as exc:
            self._went_down(exc)
            return groups
        self._came_back()
        replicas = replies.pop() if self._ack_replicas else 0
        if isinstance(replicas, Exception):  # e.g. UNBLOCKED: the primary became a replica
            log.warning("history store: WAIT on %s failed: %s", node, replicas)
            replicas = 0
        durable: list[tuple[_Group, tuple[int, dict[int, int]]]] = []
        unsettled: list[_Group] = []
        for group, reply in zip(groups, replies, strict=True):
            room, items = group
            if isinstance(reply, ELSEWHERE_ERRORS):
                unsettled.append(group)  # not run there; the slots are read again
            elif isinstance(reply, TRANSIENT_ERRORS) or str(reply).startswith("BUSY"):
                # Redis refused before running it (loading, read-only, out of memory)
                log.warning("history store: Redis refused a commit: %s", reply)
                self._ledger.report(items, StoreUnavailable(f"history store unavailable: {reply}"))
            elif isinstance(reply, Exception):
                log.error("history store: commit to %s failed: %s", room, reply)
                self._ledger.report(items, StoreError(f"history store failed: {reply}"))
            elif replicas < self._ack_replicas:
                unsettled.append(group)  # stored on the primary, not yet on its replicas
            else:
                durable.append((group, _parse_answer(reply)))
        ran = any(not isinstance(reply, Exception) for reply in replies)
        self._note_replicas(node, replicas, ran=ran)
        if durable:
            unsettled.extend(await self._publish(client, durable))
        return unsettled

    def stats(self) -> StoreStats:
        """The ledger's counters, with the primaries now short of replicas."""
        return dataclasses.replace(
            super().stats(), primaries_short_of_replicas=sum(self._short.values())
        )

    def _note_replicas(self, node: str, replicas: int, *, ran: bool) -> None:
        """Log when a node starts, and stops, confirming commits on fewer replicas than
        asked."""
        short = ran and replicas < self._ack_replicas
        if short != self._short.get(node, False):
            self._short[node] = short
            if short:
                log.warning(
                    "history store: %s confirmed a commit on %d of the %d replicas asked"
                    " (REDIS_ACK_REPLICAS); its rooms' sends wait, then get unavailable",
                    node,
                    replicas,
                    self._ack_replicas,
                )
            else:
                log.info("history store: %s has its replicas again", node)

    async def _publish(
        self, client: Redis, durable: list[tuple[_Group, tuple[int, dict[int, int]]]]
    ) -> list[_Group]:
        """Mark durable, publish (unless the commit script did) and report each group;
        return those whose publishing failed (they stay in doubt)."""
        if self._ack_replicas:
            calls = [self._publish_call(room, items, answer) for (room, items), answer in durable]
            try:
                replies = await _pipeline(client, calls, 0)
            except CONNECTION_ERRORS as exc:
                self._went_down(exc)
                return [group for group, _ in durable]
        else:
            replies = [None] * len(durable)
        unsettled = []
        for (group, answer), reply in zip(durable, replies, strict=True):
            if isinstance(reply, Exception):
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
        for i, (message, _) in enumerate(items):
            if i in repeats:  # stored before (an idempotent send): its seq
                message.seq = repeats[i]
            else:
                message.seq = first + fresh
                fresh += 1
        if fresh:
            self._last_seq[room] = max(self._last_seq.get(room, 0), first + fresh - 1)
        self._ledger.report(items, None)

    def _publish_call(
        self, room: str, items: list[_Item], answer: tuple[int, dict[int, int]]
    ) -> tuple[Script, list[str], list[str | bytes]]:
        """The :data:`PUBLISH_SCRIPT` call for a durable group."""
        first, repeats = answer
        fresh = [encode_entry(_entry(m)) for i, (m, _) in enumerate(items) if i not in repeats]
        upto = max([first + len(fresh) - 1, *repeats.values()])
        payload = b"M%d [%s]" % (first, b",".join(fresh)) if fresh else b""
        return PUBLISH_SCRIPT, [durable_key(room)], [room_channel(room), str(upto), payload]

    def _commit_call(
        self, room: str, items: list[_Item], token: str
    ) -> tuple[Script, list[str], list[str | bytes]]:
        """The commit script's call for ``room``'s share of a batch."""
        ref_keys = []
        digests = []
        for message, _ in items:
            if self._refs_on and message.ref is not None:
                digest = _body_digest(message)
                ref_keys.append(send_key(room, message.user, message.ref, digest))
                ref_keys.append(legacy_send_ref_key(room, message.user, message.ref))
                digests.append(digest)
            else:
                digests.append("")
        keys = [
            seq_key(room),
            stream_key(room),
            commit_key(room, self._writer_name),
            durable_key(room),
            *ref_keys,
        ]
        args = [
            room_channel(room),
            token,
            self._history_max,
            self._send_ref_window,
            "0" if self._ack_replicas else "1",
            *[encode_entry(_entry(message)) for message, _ in items],
            *digests,
        ]
        return COMMIT_SCRIPT, keys, args

    def _went_down(self, exc: BaseException) -> None:
        """Refuse submits until a probe reaches Redis again."""
        if self._reachable:
            log.warning("history store: Redis unreachable (%s); refusing sends meanwhile", exc)
            self._reachable = False
        if self._probe is None or self._probe.done():
            self._probe = supervisor().start("chat-history-probe", self._reconnect, RESTART)

    async def _reconnect(self) -> None:
        """PING with backoff until Redis answers, then accept submits again."""
        delay = BACKOFF_MIN_S
        while True:
            raise_if_cancelled()
            await asyncio.sleep(delay * (0.5 + random.random()))
            try:
                await self._topology.probe()
            except (*CONNECTION_ERRORS, BrokerUnavailable):
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            except RedisError as exc:
                log.warning("history store: Redis answered the probe with %s", exc)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            self._came_back()
            return

    def _came_back(self) -> None:
        if not self._reachable:
            log.info("history store: Redis reachable again; accepting sends")
            self._reachable = True

    # ---- reads -------------------------------------------------------------------------

    async def _read(self, call: Callable[[], Any]) -> Any:
        """Run a read; map Redis trouble to ``StoreUnavailable`` / ``StoreError``."""
        if not self._started or self._closed:
            raise StoreUnavailable("history store closed" if self._closed else "not started")
        try:
            return await call()
        except CONNECTION_ERRORS as exc:
            self._went_down(exc)
            raise StoreUnavailable(f"history store unavailable: {exc}") from exc
        except RedisError as exc:
            raise StoreError(f"history store failed: {exc}") from exc

    async def history(self, room: str, before: int | None, limit: int) -> list[Message]:
        """The latest ``limit`` messages with ``seq < before`` (no bound when None), ascending."""
        if limit <= 0 or (before is not None and before <= 1):
            return []
        end = "+" if before is None else str(before - 1)
        call = (HISTORY_SCRIPT, [stream_key(room), durable_key(room), seq_key(room)], [end, limit])
        (entries,) = await self._read(lambda: run_scripts(self._client, [call]))
        if isinstance(entries, Exception):
            raise StoreError(f"history store failed: {entries}")
        entries.reverse()  # a script's XREVRANGE: each entry's fields as a flat list
        pairs = [(eid, dict(zip(f[::2], f[1::2], strict=True))) for eid, f in entries]
        return stream_messages(room, pairs)

    async def after(self, room: str, after_seq: int, limit: int) -> list[Message]:
        """Up to ``limit`` committed messages with ``seq > after_seq``, ascending."""
        if limit <= 0:
            return []
        start = "-" if after_seq < 0 else str(after_seq + 1)
        entries = await self._read(
            lambda: self._client.xrange(stream_key(room), start, "+", count=limit)
        )
        return stream_messages(room, entries)


def _entry(message: Message) -> Entry:
    return Entry(message.user, message.body, message.ts, message.ref)
