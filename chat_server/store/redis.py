"""Durable room history in Redis Streams, shared by every process on every machine.

With ``BROKER=redis`` this store replaces SQLite, on one Redis (a primary, with
replicas if wanted) or, with ``REDIS_CLUSTER=on``, a Redis Cluster: each commit script
touches one room, so each room lives on the primary serving its slot, and a pipeline
sends each primary its rooms' share. Give it ``maxmemory-policy noeviction``: evicting a
stream loses history (a lost ``seq`` key alone is recovered from its stream's last ID).
Each room's keys, channel and stored entries are laid out by
:mod:`chat_server.redis_rooms`.

**One atomic step.** A batch from the group commit becomes one pipeline holding
one ``EVALSHA`` per room; the script (:data:`COMMIT_SCRIPT`) numbers the
room's messages from its ``seq`` key, appends them to the stream, trims it,
records the commit marker and ``SPUBLISH``\\ es them to the room's channel as one
payload ``M<first seq> [entry, ...]``. A script runs atomically, so every
subscriber sees a room's messages in ``seq`` order with nothing between
numbering and publishing, and a failed script numbers nothing (it checks that
the stream accepts the first ID before it writes anything).

**Acks.** ``on_batch`` reports a message committed only after Redis answered the
pipeline; broadcasting to this process's members is the broker's job (it hears
the published payload). With ``appendfsync always`` Redis writes and fsyncs the
AOF before it sends any reply or published message of that event-loop turn, so
what was acked or seen survives a crash of Redis; with ``everysec`` up to about
a second of acked messages can be lost when Redis itself (not the chat server)
crashes; without AOF or RDB, a Redis restart loses the history.

**Outages.** A pipeline that fails with a connection error is *in doubt*: its
scripts may have run, or may still run. The store sends the same batch again,
with backoff, for up to :data:`IN_DOUBT_WAIT_S`; the commit marker makes the
script idempotent (a batch that ran already answers its first ``seq`` again and
writes nothing; one older than the marker's is refused), so each message is
stored once and acked as soon as Redis answers. Only if Redis stays away longer
is the batch answered ``unavailable``, and then it may still be stored if the
lost request reaches Redis before any later batch of this process does. While
Redis is unreachable, ``submit`` raises ``StoreUnavailable`` at once, and a
probe reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from redis.exceptions import (
    BusyLoadingError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    TryAgainError,
)

from chat_server.errors import StoreError, StoreUnavailable
from chat_server.messages import Message
from chat_server.redis_rooms import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    CLOSE_WAIT_S,
    CONNECTION_ERRORS,
    Entry,
    RedisClient,
    Script,
    commit_key,
    encode_entry,
    raise_if_cancelled,
    room_channel,
    run_scripts,
    send_ref_prefix,
    seq_key,
    stream_key,
    stream_messages,
)
from chat_server.store.base import BatchCallback, BatchLedger, LedgerStore
from chat_server.tail import COMMIT_BUCKETS_S, PlainHistogram

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
    TryAgainError,
)

COMMIT_SCRIPT: Final = Script("""
-- KEYS[1] the room's seq, KEYS[2] its stream, KEYS[3] this writer's commit marker,
-- KEYS[4..] the send-ref key of each message that has a digest below, in order
-- ARGV[1] the room's channel, ARGV[2] the batch number (rising with each batch of this
-- writer), ARGV[3] HISTORY_MAX (0: all), ARGV[4] SEND_REF_WINDOW_S (0: off),
-- ARGV[5..4+n] the messages as JSON arrays [user, body, ts, ref], ARGV[5+n..4+2n] each
-- message's body digest when it has a ref and the window is on, else "".
-- Returns the answer "<first seq>[ <index>:<seq>...]": the new messages are numbered
-- from the first seq in order; each listed index (0-based) repeats the send stored
-- with that seq within the window and is not stored or published again.
local marker = redis.call('GET', KEYS[3])
if marker then
  -- this batch ran already (a retry after a lost reply): answer as it did, write nothing;
  -- an older batch arriving late must not run after a newer one did
  local done, done_answer = string.match(marker, '^(%d+) (.+)$')
  if tonumber(done) == tonumber(ARGV[2]) then return done_answer end
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
local n = (#ARGV - 4) / 2
local window = tonumber(ARGV[4])
local answer = {string.format('%d', first)}
local fresh = {}
local fresh_refs = {}
local ref_keys = 3
for i = 1, n do
  local digest = ARGV[4 + n + i]
  local repeated = nil
  if digest ~= '' then
    ref_keys = ref_keys + 1
    local key = KEYS[ref_keys]
    local stored = redis.call('GET', key)
    if stored then
      local stored_digest, stored_seq = string.match(stored, '^(%x+) (%d+)$')
      if stored_digest == digest then repeated = stored_seq end
    end
    if not repeated then fresh_refs[#fresh + 1] = {key, digest} end
  end
  if repeated then
    answer[#answer + 1] = string.format('%d:%s', i - 1, repeated)
  else
    fresh[#fresh + 1] = ARGV[4 + i]
  end
end
-- the first XADD fails (and the script stops) before anything is written if the
-- stream is ahead of the seq key; the later ones cannot fail after it succeeded
for i = 1, #fresh do
  redis.call('XADD', KEYS[2], string.format('%d-0', first + i - 1), 'm', fresh[i])
  local send_ref = fresh_refs[i]
  if send_ref then
    redis.call('SET', send_ref[1],
      send_ref[2] .. ' ' .. string.format('%d', first + i - 1), 'EX', window)
  end
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
redis.call('SPUBLISH', ARGV[1],
  'M' .. string.format('%d', first) .. ' [' .. table.concat(fresh, ',') .. ']')
return reply
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
    ) -> None:
        """Configure the store; nothing is connected until :meth:`start`.

        ``commit_seconds`` receives each batch's commit time (its pipeline's round trip).
        """
        self.commit_seconds = (
            PlainHistogram(COMMIT_BUCKETS_S) if commit_seconds is None else commit_seconds
        )
        if queue_max < 1 or batch_max < 1 or history_max < 0:
            raise ValueError("queue_max and batch_max must be at least 1, history_max 0 or more")
        self._client = client
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
            await self._client.script_load(COMMIT_SCRIPT.source)
        except (RedisError, OSError) as exc:
            self._closed = True
            raise StoreUnavailable(f"cannot reach Redis: {exc}") from exc
        self._writer = asyncio.create_task(self._write_batches(), name="chat-history-writer")
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
        """Commit ``batch`` (one script call per room) and report committed and failed parts."""
        rooms: dict[str, list[_Item]] = {}
        for item in batch:
            rooms.setdefault(item[0].room, []).append(item)
        self._batch_no += 1
        token = str(self._batch_no)
        groups = list(rooms.items())
        if not self._reachable:
            self._ledger.report(batch, StoreUnavailable("history store unavailable: Redis down"))
            return
        try:
            results = await self._run_scripts(groups, token)
        except CONNECTION_ERRORS as exc:
            self._went_down(exc)
            results = await self._retry_in_doubt(groups, token)
        committed: list[_Item] = []
        failed: list[_Item] = []
        error: StoreError | None = None
        for (room, items), result in zip(groups, results, strict=True):
            if isinstance(result, tuple):
                first, repeats = result
                fresh = 0
                for i, (message, _) in enumerate(items):
                    if i in repeats:  # stored before (an idempotent send): its seq
                        message.seq = repeats[i]
                    else:
                        message.seq = first + fresh
                        fresh += 1
                if fresh:
                    self._last_seq[room] = first + fresh - 1
                committed.extend(items)
            else:
                failed.extend(items)
                error = result
        if committed:
            self._ledger.report(committed, None)
        if failed:
            assert error is not None
            self._ledger.report(failed, error)

    async def _run_scripts(
        self, groups: list[tuple[str, list[_Item]]], token: str
    ) -> list[tuple[int, dict[int, int]] | StoreError]:
        """One pipeline of commit scripts (each node of a cluster gets its rooms' share)."""
        calls = [self._commit_call(room, items, token) for room, items in groups]
        results: list[tuple[int, dict[int, int]] | StoreError] = []
        for (room, _), reply in zip(groups, await run_scripts(self._client, calls), strict=True):
            if isinstance(reply, TRANSIENT_ERRORS) or str(reply).startswith("BUSY"):
                # Redis refused before running it (loading, read-only, out of memory, a slot
                # migrating)
                log.warning("history store: Redis refused a commit: %s", reply)
                results.append(StoreUnavailable(f"history store unavailable: {reply}"))
            elif isinstance(reply, CONNECTION_ERRORS):
                raise reply
            elif isinstance(reply, Exception):
                log.error("history store: commit to %s failed: %s", room, reply)
                results.append(StoreError(f"history store failed: {reply}"))
            else:
                results.append(_parse_answer(reply))
        return results

    def _commit_call(
        self, room: str, items: list[_Item], token: str
    ) -> tuple[Script, list[str], list[str]]:
        """The commit script's call for ``room``'s share of a batch."""
        ref_keys = []
        digests = []
        for message, _ in items:
            if self._refs_on and message.ref is not None:
                ref_keys.append(f"{send_ref_prefix(room)}{message.user} {message.ref}")
                digests.append(_body_digest(message))
            else:
                digests.append("")
        keys = [seq_key(room), stream_key(room), commit_key(room, self._writer_name), *ref_keys]
        args = [
            room_channel(room),
            token,
            self._history_max,
            self._send_ref_window,
            *[encode_entry(_entry(message)) for message, _ in items],
            *digests,
        ]
        return COMMIT_SCRIPT, keys, args

    async def _retry_in_doubt(self, groups: list[tuple[str, list[_Item]]], token: str) -> list[Any]:
        """Send a batch whose reply was lost again (the script runs it at most once)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + IN_DOUBT_WAIT_S
        delay = BACKOFF_MIN_S
        while loop.time() + delay <= deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)
            try:
                results = await self._run_scripts(groups, token)
            except CONNECTION_ERRORS:
                continue
            log.info("history store: an in-doubt batch was settled after Redis came back")
            self._came_back()
            return results
        log.warning(
            "history store: a batch of %d stayed in doubt (Redis unreachable for %.0f s): "
            "answered unavailable, though it may yet be stored",
            sum(len(items) for _, items in groups),
            IN_DOUBT_WAIT_S,
        )
        return [StoreUnavailable("history store unavailable: Redis unreachable")] * len(groups)

    def _went_down(self, exc: BaseException) -> None:
        """Refuse submits until a probe reaches Redis again."""
        if self._reachable:
            log.warning("history store: Redis unreachable (%s); refusing sends meanwhile", exc)
            self._reachable = False
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._reconnect(), name="chat-history-probe")

    async def _reconnect(self) -> None:
        """PING with backoff until Redis answers, then accept submits again."""
        delay = BACKOFF_MIN_S
        while True:
            raise_if_cancelled()
            await asyncio.sleep(delay * (0.5 + random.random()))
            try:
                await self._client.ping()
            except CONNECTION_ERRORS:
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
        entries = await self._read(
            lambda: self._client.xrevrange(stream_key(room), end, "-", count=limit)
        )
        entries.reverse()
        return stream_messages(room, entries)

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
