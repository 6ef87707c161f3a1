"""The history store's Lua scripts, their calls, what their replies mean, and the pipeline
that runs them with ``WAIT`` behind.

Each script's KEYS and ARGV are built by the function beside it (:class:`CommitCalls`,
:func:`publish_call`, :func:`history_call`), so the layout the Lua reads and the one
Python writes are read together. A commit's reply, with its node's ``WAIT`` count, is
turned into an :class:`Outcome` by one pure function, :func:`commit_outcome`, whose
error table is :data:`ERROR_OUTCOMES`. What each script does and why is told in
:mod:`chat_server.store.redis` (the store that sends them) and
:mod:`chat_server.redis_rooms` (the keys they touch).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from redis.asyncio import Redis
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    TryAgainError,
)

from chat_server.messages import Message
from chat_server.redis_rooms import (
    Entry,
    Script,
    commit_key,
    durable_key,
    encode_entry,
    legacy_send_ref_key,
    room_channel,
    send_key,
    seq_key,
    stream_key,
)

__all__ = [
    "ACK_WAIT_MS",
    "COMMIT_SCRIPT",
    "ELSEWHERE_ERRORS",
    "ERROR_OUTCOMES",
    "HISTORY_SCRIPT",
    "PUBLISH_SCRIPT",
    "REFUSED_PREFIXES",
    "REFUSING_ERRORS",
    "Call",
    "CommitCalls",
    "Outcome",
    "Replies",
    "body_digest",
    "commit_outcome",
    "history_call",
    "parse_answer",
    "pipeline",
    "publish_call",
    "publish_outcome",
    "wait_count",
]

#: one script call: the script, its KEYS, its ARGV
Call = tuple[Script, list[str], list[str | bytes]]

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


class CommitCalls:
    """Builds :data:`COMMIT_SCRIPT`'s calls for one store: its KEYS and ARGV, in the order
    the script's header gives them."""

    __slots__ = ("_history_max", "_publish_here", "_refs_on", "_send_ref_window", "_writer")

    def __init__(
        self, *, writer: str, history_max: int, send_ref_window_s: float, ack_replicas: int
    ) -> None:
        """``writer`` names this process' commit markers; ``history_max`` is HISTORY_MAX;
        sends with a ref are looked up while ``send_ref_window_s`` rounds above 0; with
        ``ack_replicas`` 0 the script marks durable and publishes itself."""
        self._writer = writer
        self._history_max = str(history_max)
        self._send_ref_window = str(round(send_ref_window_s))
        self._refs_on = round(send_ref_window_s) > 0
        self._publish_here = "0" if ack_replicas else "1"

    def call(self, room: str, messages: Sequence[Message], batch: str) -> Call:
        """The call committing ``messages`` (in order) to ``room`` as this writer's ``batch``."""
        ref_keys = []
        digests = []
        for message in messages:
            if self._refs_on and message.ref is not None:
                digest = body_digest(message)
                ref_keys.append(send_key(room, message.user, message.ref, digest))
                ref_keys.append(legacy_send_ref_key(room, message.user, message.ref))
                digests.append(digest)
            else:
                digests.append("")
        keys = [
            seq_key(room),
            stream_key(room),
            commit_key(room, self._writer),
            durable_key(room),
            *ref_keys,
        ]
        args: list[str | bytes] = [
            room_channel(room),
            batch,
            self._history_max,
            self._send_ref_window,
            self._publish_here,
            *[encode_entry(_entry(message)) for message in messages],
            *digests,
        ]
        return COMMIT_SCRIPT, keys, args


def publish_call(
    room: str, messages: Sequence[Message], answer: tuple[int, dict[int, int]]
) -> Call:
    """The :data:`PUBLISH_SCRIPT` call for ``messages`` committed to ``room`` with ``answer``
    (:func:`parse_answer`): the new ones are published, the durable seq raised over all."""
    first, repeats = answer
    fresh = [encode_entry(_entry(m)) for i, m in enumerate(messages) if i not in repeats]
    upto = max([first + len(fresh) - 1, *repeats.values()])
    payload = b"M%d [%s]" % (first, b",".join(fresh)) if fresh else b""
    return PUBLISH_SCRIPT, [durable_key(room)], [room_channel(room), str(upto), payload]


def history_call(room: str, before: int | None, limit: int) -> Call:
    """The :data:`HISTORY_SCRIPT` call for ``room``'s latest ``limit`` durable messages with
    ``seq < before`` (no bound when None)."""
    end = "+" if before is None else str(before - 1)
    return HISTORY_SCRIPT, [stream_key(room), durable_key(room), seq_key(room)], [end, str(limit)]


def _entry(message: Message) -> Entry:
    return Entry(message.user, message.body, message.ts, message.ref)


# ---- what the replies mean ------------------------------------------------------------------


class Outcome(enum.Enum):
    """What a commit script's reply, with its node's ``WAIT`` count, means for its room's
    share of a batch."""

    #: it ran and is on as many replicas as asked: publish it, then ack it
    SETTLED = "settled"
    #: it may have run (or may yet): read the slots again and send it again, bounded by
    #: IN_DOUBT_WAIT_S (the commit marker makes a second run answer as the first)
    IN_DOUBT = "in doubt"
    #: Redis said it did not run it (loading, read-only, out of memory, busy): unavailable
    REFUSED = "refused"
    #: the script ran and failed (e.g. a STALE batch): failed
    FAILED = "failed"


#: error replies saying the node did not run a command because another serves the slot
#: now, or its keys are moving: the slots are read again and it is sent again (redis-py's
#: MasterDownError, a replica that lost its primary, is a ClusterDownError: this row)
ELSEWHERE_ERRORS: Final = (AskError, ClusterDownError, MovedError, TryAgainError)
#: error replies saying Redis did not run a command (loading, a replica, out of memory)
REFUSING_ERRORS: Final = (BusyLoadingError, OutOfMemoryError, ReadOnlyError)
#: an error reply's meaning, the first row that matches wins; any other error is FAILED
ERROR_OUTCOMES: Final[tuple[tuple[tuple[type[RedisError], ...], Outcome], ...]] = (
    (ELSEWHERE_ERRORS, Outcome.IN_DOUBT),
    (REFUSING_ERRORS, Outcome.REFUSED),
)
#: error replies redis-py has no class for, by their first word: not run (a script is busy)
REFUSED_PREFIXES: Final = ("BUSY",)


def commit_outcome(reply: object, replicas: int, ack_replicas: int) -> Outcome:
    """What a commit script's ``reply`` means when its node's ``WAIT`` counted ``replicas``
    (0 when none was asked) of the ``ack_replicas`` asked."""
    if isinstance(reply, Exception):
        for errors, outcome in ERROR_OUTCOMES:
            if isinstance(reply, errors):
                return outcome
        if str(reply).startswith(REFUSED_PREFIXES):
            return Outcome.REFUSED
        return Outcome.FAILED
    return Outcome.SETTLED if replicas >= ack_replicas else Outcome.IN_DOUBT


def publish_outcome(reply: object) -> Outcome:
    """What a publish script's ``reply`` means: settled, or (any error) still in doubt."""
    return Outcome.IN_DOUBT if isinstance(reply, Exception) else Outcome.SETTLED


def wait_count(reply: object) -> int:
    """The replicas a ``WAIT`` reply counted; 0 for an error (e.g. ``UNBLOCKED``: the
    primary became a replica)."""
    return 0 if isinstance(reply, Exception) else int(reply)  # type: ignore[call-overload]


def body_digest(message: Message) -> str:
    """What the commit script tells a repeated send by: its body's digest."""
    return hashlib.blake2b(message.body.encode(), digest_size=8).hexdigest()


def parse_answer(answer: bytes | str | int) -> tuple[int, dict[int, int]]:
    """The commit script's answer: the first new seq, and the repeats' seqs by index."""
    if isinstance(answer, int):
        return answer, {}
    first, *repeats = (answer.decode() if isinstance(answer, bytes) else answer).split(" ")
    return int(first), {
        int(index): int(seq) for index, seq in (repeat.split(":") for repeat in repeats)
    }


class Replies(NamedTuple):
    """A pipeline's answers: each call's reply (or error), in order, and its ``WAIT``."""

    scripts: list[Any]
    #: the replicas ``WAIT`` counted (0 when none was asked, or it failed)
    replicas: int
    #: the ``WAIT``'s error reply, if it failed
    wait_error: Exception | None


async def pipeline(client: Redis, calls: Sequence[Call], wait: int) -> Replies:
    """Run ``calls`` in one pipeline on one node's connection, then (``wait`` > 0) ``WAIT
    wait`` on that connection: it counts the replicas holding every write this
    connection made. A node that lacked a script gets it and the whole pipeline again
    (calls that ran answer from their commit markers). Connection errors propagate (in
    doubt)."""
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
    if not wait:
        return Replies(replies, 0, None)
    waited = replies.pop()
    return Replies(replies, wait_count(waited), waited if isinstance(waited, Exception) else None)
