"""The history store's Lua scripts, and the pipeline that runs them with ``WAIT`` behind.

What each script does and why is told in :mod:`chat_server.store.redis` (the store that
sends them) and :mod:`chat_server.redis_rooms` (the keys they touch).
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from chat_server.messages import Message
from chat_server.redis_rooms import Script

__all__ = [
    "ACK_WAIT_MS",
    "COMMIT_SCRIPT",
    "HISTORY_SCRIPT",
    "PUBLISH_SCRIPT",
    "body_digest",
    "parse_answer",
    "pipeline",
]

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


async def pipeline(
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
