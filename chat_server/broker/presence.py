"""A room's shared presence in Redis: who is in it on which process, and whose lease ran out.

Everything lives in the room's own keys (the ``{room}`` hash tag: one slot, so one node
of a cluster), and each script touches one room and declares every key it touches:

``chat:{room}:users``
    hash: for each user, how many processes hold it in the room;
``chat:{room}:pv``
    the room's presence version, bumped with each change;
``chat:{room}:held``
    hash: field ``<process> <user>`` for each user a process holds here, and field
    ``<process>`` counting them (process IDs hold no space);
``chat:{room}:leases``
    sorted set: each process holding users here, scored by when its lease ends (ms,
    in the clock of the node serving the room).

Each change is published on the room's channel as ``P<version> +user <count>
<process>`` (or ``-user ...``): the count after it and the process whose holding
changed. A process renews its lease in every room it holds users in every third of
``PRESENCE_LEASE_S`` (:data:`RENEW`); that script, and every snapshot (:data:`SNAPSHOT`),
first releases the processes whose lease in that room ran out, with leave events. So a
killed process' members vanish within about ``PRESENCE_LEASE_S`` from every room some
live process holds, and a room nobody live holds is swept by the snapshot of the next
process that joins it (before its keys expired). A live process renews long before its
lease ends, so its users never flap.

**Expiry.** Every script that writes a room's presence (a renewal too) ends by giving
its four keys one expiry: the end of the latest lease in ``:leases`` plus a grace, the
writer's ``PRESENCE_LEASE_S`` (with no lease left, the grace alone). A live holder renews
every third of its lease, so the keys never expire under it; once no lease holds the
room they expire a grace after the last member left it, or a grace after the last lease
ended when its last process died. ``:users``, ``:held`` and ``:leases`` are empty by then
when everyone left cleanly (Redis deletes an empty hash or sorted set); what a dead
process left goes with them, unannounced: nobody holds the room to be told. Renewal
stays one script per room and process, whatever the number of connections there, sent
in one pipeline per renewal; the expiry adds five cheap commands to it.

**The version never goes back.** Readers (each process'
:class:`~chat_server.broker.feed.RoomFeed`) drop a change whose version is not above the
last one they applied, so a ``:pv`` that expired and started again at 1 would hide every
change from a reader that remembers a higher one (a process whose lease lapsed while it
kept the room). So a missing ``:pv`` starts at the node's clock in microseconds
(``TIME``), not at 0: the version rises by one per change, each change is a script that
costs Redis more than a microsecond, and the key lived at least a grace (a second or
more) after its last change, so the clock has passed every version the key held, by a
margin of a million changes per second of grace, as long as the clocks of the nodes
serving the room (after a failover) differ by less than that grace. A reader that heard
the old versions sees the new one skip and takes a snapshot, as after any lost change.
Why not a ``:pv`` that outlives the other keys by a day: that keeps a key per room ever
joined for a day, and a reader's memory of a room has no time bound (a process keeps a
room's feed as long as it has members there). Nor the history's ``seq``: a room that
never had a message has none, and presence changes between messages need versions of
their own.
"""

from __future__ import annotations

from typing import Final

from chat_server.redis_rooms import Script, durable_key, room_channel, seq_key


def presence_keys(room: str) -> list[str]:
    """``KEYS`` of the presence scripts: users, version, held, leases."""
    return [
        f"chat:{{{room}}}:users",
        f"chat:{{{room}}}:pv",
        f"chat:{{{room}}}:held",
        f"chat:{{{room}}}:leases",
    ]


_LIB: Final = """
local USERS, VERSION, HELD, LEASES = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local CHANNEL = ARGV[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- the next presence version; a version key that expired (or never was) starts again at
-- Redis' clock in microseconds, above every version it held before (see the module's doc)
local function next_version()
  if redis.call('EXISTS', VERSION) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', VERSION, t[1] .. string.format('%06d', tonumber(t[2])))
  end
  return redis.call('INCR', VERSION)
end
local function announce(user, sign, count, worker)
  local v = next_version()
  redis.call('SPUBLISH', CHANNEL, 'P' .. string.format('%d', v) .. ' ' .. sign .. user .. ' '
    .. string.format('%d', count) .. ' ' .. worker)
end
local function arrive(worker, user)
  if redis.call('HSETNX', HELD, worker .. ' ' .. user, '1') == 1 then
    redis.call('HINCRBY', HELD, worker, 1)
    announce(user, '+', redis.call('HINCRBY', USERS, user, 1), worker)
  end
end
local function depart(worker, user)
  if redis.call('HDEL', HELD, worker .. ' ' .. user) == 1 then
    if redis.call('HINCRBY', HELD, worker, -1) <= 0 then redis.call('HDEL', HELD, worker) end
    local count = redis.call('HINCRBY', USERS, user, -1)
    if count <= 0 then
      redis.call('HDEL', USERS, user)
      count = 0
    end
    announce(user, '-', count, worker)
  end
end
local function holding(worker)
  local prefix = worker .. ' '
  local users = {}
  for _, field in ipairs(redis.call('HKEYS', HELD)) do
    if string.sub(field, 1, #prefix) == prefix then
      users[#users + 1] = string.sub(field, #prefix + 1)
    end
  end
  return users
end
local function release(worker)
  for _, user in ipairs(holding(worker)) do depart(worker, user) end
  redis.call('HDEL', HELD, worker)
  redis.call('ZREM', LEASES, worker)
end
local function sweep(now)
  local expired = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now)
  for _, dead in ipairs(expired) do release(dead) end
  return #expired
end
local function held_count(worker)
  return tonumber(redis.call('HGET', HELD, worker) or '0')
end
local function keep(worker, now, lease)
  if held_count(worker) > 0 then
    redis.call('ZADD', LEASES, now + lease, worker)
  else
    redis.call('ZREM', LEASES, worker)
  end
end
-- every script that writes ends here: the room's presence keys (those that exist) live
-- until the last lease here ends, then a grace more
local function expire_all(now, grace)
  local last = redis.call('ZRANGE', LEASES, -1, -1, 'WITHSCORES')
  local ttl = grace
  if last[2] then ttl = math.max(tonumber(last[2]) - now, 0) + grace end
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
"""

#: ARGV: channel, process, lease ms, mode (``exact``: these are all its users here;
#: ``+`` arrived; ``-`` departed), users. Returns how many users the process holds here.
PRESENCE: Final = Script(
    _LIB
    + """
local worker, lease, mode = ARGV[2], tonumber(ARGV[3]), ARGV[4]
if mode == 'exact' then
  local wanted = {}
  for i = 5, #ARGV do wanted[ARGV[i]] = true end
  for _, user in ipairs(holding(worker)) do
    if not wanted[user] then depart(worker, user) end
  end
  for i = 5, #ARGV do arrive(worker, ARGV[i]) end
elseif mode == '+' then
  for i = 5, #ARGV do arrive(worker, ARGV[i]) end
else
  for i = 5, #ARGV do depart(worker, ARGV[i]) end
end
local now = now_ms()
keep(worker, now, lease)
expire_all(now, lease)
return held_count(worker)
"""
)

#: ARGV: channel, process, lease ms (0: give the room up, releasing its users now),
#: grace ms (the keys' life after the last lease). Releases the processes whose lease
#: here ran out; returns {processes released, 1 if this process had no live lease here
#: (it must write its users here again)}.
RENEW: Final = Script(
    _LIB
    + """
local worker, lease, grace = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
if lease == 0 then
  release(worker)
  expire_all(now, grace)
  return {0, 0}
end
local mine = redis.call('ZSCORE', LEASES, worker)
local missing = 0
if not mine or tonumber(mine) <= now then missing = 1 end
local released = sweep(now)
keep(worker, now, lease)
expire_all(now, grace)
return {released, missing}
"""
)

#: KEYS[5] the room's seq, KEYS[6] its durable seq; ARGV: channel, process, grace ms.
#: Releases expired processes, then returns {durable seq (the seq of a room written
#: before the durable seq existed), presence version, users (flat: user, count, ...),
#: users this process holds, seq}.
SNAPSHOT: Final = Script(
    _LIB
    + """
local now = now_ms()
if sweep(now) > 0 then expire_all(now, tonumber(ARGV[3])) end
local seq = redis.call('GET', KEYS[5]) or '0'
return {redis.call('GET', KEYS[6]) or seq, redis.call('GET', VERSION) or '0',
  redis.call('HGETALL', USERS), holding(ARGV[2]), seq}
"""
)


def presence_call(
    room: str, worker: str, lease_ms: int, mode: str, users: list[str] | tuple[str, ...]
) -> tuple[Script, list[str], list[str]]:
    """The :data:`PRESENCE` call writing ``users`` of ``worker`` in ``room``."""
    return PRESENCE, presence_keys(room), [room_channel(room), worker, str(lease_ms), mode, *users]


def renew_call(
    room: str, worker: str, lease_ms: int, grace_ms: int
) -> tuple[Script, list[str], list[str]]:
    """The :data:`RENEW` call for ``worker``'s lease in ``room`` (``lease_ms`` 0: release it);
    the room's keys live ``grace_ms`` past its last lease."""
    return RENEW, presence_keys(room), [room_channel(room), worker, str(lease_ms), str(grace_ms)]


def snapshot_call(room: str, worker: str, grace_ms: int) -> tuple[Script, list[str], list[str]]:
    """The :data:`SNAPSHOT` call of ``room`` for ``worker`` (keys it sweeps live ``grace_ms``
    past the room's last lease)."""
    keys = [*presence_keys(room), seq_key(room), durable_key(room)]
    return SNAPSHOT, keys, [room_channel(room), worker, str(grace_ms)]
