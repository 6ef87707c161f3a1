"""How a room lives in Redis, for the history store that writes it and the broker that reads it.

Each room has these keys (the ``{room}`` hash tag keeps them in one slot):

``chat:{room}:seq``
    the room's last ``seq``;
``chat:{room}:log``
    a stream holding the room's messages, entry ID ``<seq>-0``, so ``XRANGE``
    and ``XREVRANGE`` select by ``seq`` and ``XTRIM MINID`` keeps the newest
    ``HISTORY_MAX`` exactly; one field ``m``, the message as a JSON array
    ``[user, body, ts, ref]``;
``chat:{room}:durable``
    the highest ``seq`` known to be held by as many replicas as ``REDIS_ACK_REPLICAS``
    asks (set after ``WAIT`` confirmed it; with 0 replicas, with the commit): nothing
    above it is published, read back into a feed's gap or returned by ``history``.
    Missing in a room written before it existed: the ``seq`` key stands in;
``chat:{room}:commit:<writer>``
    the last batch this process committed to the room (``"<batch> <answer>"``, the
    answer being the commit script's, ``<first seq>[ <index>:<seq>...]`` with the
    repeated sends' seqs; expiring after a day): it makes each batch run at most once
    (see Outages);
``chat:{room}:sent:<body digest> <user> <ref>``
    a send with a ``ref``: its ``seq``, expiring after ``SEND_REF_WINDOW_S``, one key
    per ref *and body*. The commit script answers a send with the same user, room,
    ref and body by that ``seq`` and neither stores nor publishes it again, so a
    retry is stored once whichever process takes it (idempotent sends), and a ref
    reused with several bodies answers each with its own ``seq``;
``chat:{room}:ref:<user> <ref>``
    the earlier layout's key: ``"<body digest> <seq>"`` of the newest body sent with
    that ref, also expiring after ``SEND_REF_WINDOW_S``. Still written and read as a
    fallback, so that during a rolling upgrade a retry that crosses between a process of
    each version is stored once (as the earlier version promised: for the newest body
    per ref);
``chat:{room}:users``, ``chat:{room}:pv``, ``chat:{room}:held``, ``chat:{room}:leases``
    the room's shared presence (see :mod:`chat_server.broker.presence`), expiring
    ``PRESENCE_LEASE_S`` after the room's last lease ends (``seq``, ``log`` and
    ``durable`` never expire),

and a sharded pub/sub channel ``chat:{room}`` (:func:`room_channel`, in the room's
slot) on which the store ``SPUBLISH``\\ es each batch, once durable, as ``M<first seq>
[entry, ...]`` (and ``D<seq>`` when only the durable mark rose: a retried batch whose
messages were stored before). No command and no script touches two rooms, so every room may
live on its own node of a Redis Cluster; every key a script touches is one of its
``KEYS``. Also here: the client both share (:func:`connect_redis`: one Redis or a
cluster, never retrying by itself), scripts that load themselves again where a node
lost them (:func:`run_scripts`), the connection errors and reconnect backoff.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import msgspec
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ClusterDownError, NoScriptError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chat_server.messages import Message

#: bounds of the reconnect backoff (seconds, doubled with jitter after each failure)
BACKOFF_MIN_S: Final = 0.05
BACKOFF_MAX_S: Final = 1.0
#: how long closing waits for a background task to end after cancelling it
CLOSE_WAIT_S: Final = 2.0
#: connection errors: the request may or may not have reached Redis (a cluster that lost a
#: primary answers ClusterDownError until a replica took over)
CONNECTION_ERRORS: Final = (RedisConnectionError, RedisTimeoutError, OSError, ClusterDownError)

#: the client both the store and the broker use: one Redis, or a Redis Cluster
RedisClient = Redis | RedisCluster


class Entry(msgspec.Struct, array_like=True):
    """A stored message without its room and seq: ``[user, body, ts, ref]``."""

    user: str
    body: str
    ts: int
    ref: str | None = None


encode_entry = msgspec.json.Encoder().encode
_decode_entry = msgspec.json.Decoder(Entry).decode
_decode_entries = msgspec.json.Decoder(list[Entry]).decode


def seq_key(room: str) -> str:
    """The key holding ``room``'s last seq."""
    return f"chat:{{{room}}}:seq"


def stream_key(room: str) -> str:
    """The stream holding ``room``'s messages."""
    return f"chat:{{{room}}}:log"


def send_key(room: str, user: str, ref: str, digest: str) -> str:
    """The key holding the ``seq`` of ``user``'s send to ``room`` with ``ref`` and the body
    whose digest is ``digest`` (idempotent sends, for ``SEND_REF_WINDOW_S``)."""
    return f"chat:{{{room}}}:sent:{digest} {user} {ref}"


def legacy_send_ref_key(room: str, user: str, ref: str) -> str:
    """The earlier layout's key of ``user``'s ``ref`` in ``room``: ``"<body digest> <seq>"``
    of the newest body (kept for processes of that version during a rolling upgrade)."""
    return f"chat:{{{room}}}:ref:{user} {ref}"


def durable_key(room: str) -> str:
    """The key holding the highest ``seq`` of ``room`` its replicas are known to hold."""
    return f"chat:{{{room}}}:durable"


def commit_key(room: str, writer: str) -> str:
    """The marker of ``writer``'s last commit to ``room``."""
    return f"chat:{{{room}}}:commit:{writer}"


def room_channel(room: str) -> str:
    """The pub/sub channel of ``room``: committed messages and presence changes."""
    return f"chat:{{{room}}}"


def channel_room(channel: bytes) -> str:
    """The room of a channel named by :func:`room_channel`."""
    return channel[6:-1].decode()


def decode_published(room: str, data: bytes) -> list[Message]:
    """The messages of a ``M<first seq> [entry, ...]`` payload published by the commit script."""
    head, _, body = data.partition(b" ")
    seq = int(head[1:])
    return [
        Message(room=room, seq=seq + i, user=e.user, body=e.body, ts=e.ts, ref=e.ref)
        for i, e in enumerate(_decode_entries(body))
    ]


def stream_messages(room: str, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> list[Message]:
    """Turn ``XRANGE`` entries (ID ``<seq>-0``, field ``m``) into messages of ``room``."""
    messages = []
    for entry_id, fields in entries:
        e = _decode_entry(fields[b"m"])
        seq = int(entry_id.partition(b"-")[0])
        messages.append(Message(room=room, seq=seq, user=e.user, body=e.body, ts=e.ts, ref=e.ref))
    return messages


def raise_if_cancelled() -> None:
    """Raise CancelledError if this task was cancelled and the cancellation got lost.

    redis-py can swallow a cancellation that lands inside a pipeline's clean-up
    and return normally; a loop that goes on to wait again would then never end.
    Long-lived loops call this before each wait.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


_CONNECTION: Final[dict[str, Any]] = {
    "socket_connect_timeout": 2,
    "socket_timeout": 5,
    "health_check_interval": 10,
}


#: a cluster client's tries again after a connection error, each after learning the slots
#: anew (a failed-over primary's slots are then its replica's)
CLUSTER_RETRIES: Final = 3


def connect_redis(url: str, *, cluster: bool = False) -> RedisClient:
    """A client for ``url``; on one Redis it never retries by itself.

    With ``cluster``, ``url`` lists seed nodes of a Redis Cluster, comma-separated
    (``redis://10.0.0.1:7000,redis://10.0.0.2:7000``; the first one's user, password
    and TLS apply to every node): the client learns the slots from them, follows
    ``MOVED``, ``ASK`` and ``TRYAGAIN``, and retries a command or pipeline that met a
    connection error :data:`CLUSTER_RETRIES` times, learning the slots again first. That
    is safe here: every write is a script that runs at most once (the commit marker) or
    whose repeat changes nothing (presence), and without it the pipeline would keep
    sending to a primary that failed over.
    """
    if not cluster:
        return Redis.from_url(url, retry=Retry(NoBackoff(), 0), **_CONNECTION)
    seeds = [urlsplit(seed.strip()) for seed in url.split(",")]
    first = seeds[0]
    return RedisCluster(
        startup_nodes=[
            ClusterNode(seed.hostname or "127.0.0.1", seed.port or 6379) for seed in seeds
        ],
        username=first.username,
        password=first.password,
        ssl=first.scheme == "rediss",
        retry=Retry(NoBackoff(), CLUSTER_RETRIES),
        **_CONNECTION,
    )


def node_url(url: str, host: str, port: int) -> str:
    """The URL of the cluster node ``host:port``, with the credentials and TLS of the first
    seed ``url`` lists (for what a cluster client does not do: hold one node's
    subscriptions)."""
    first = urlsplit(url.split(",", maxsplit=1)[0].strip())
    userinfo = first.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit((first.scheme, netloc, "/0", "", ""))


class Script:
    """A Lua script run by its SHA, loaded again wherever a node answers ``NOSCRIPT`` (a
    restarted Redis, a replica promoted after a failover)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


async def run_scripts(
    client: RedisClient, calls: Sequence[tuple[Script, Sequence[str], Sequence[Any]]]
) -> list[Any]:
    """Run ``(script, keys, args)`` calls in one pipeline (not a transaction); each call's
    reply or error, in order. Calls a node did not know the script of are loaded and run
    again (they had not run); connection errors propagate (in doubt)."""
    results: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for index in todo:
            script, keys, args = calls[index]
            # not pipe.evalsha(): a cluster pipeline refuses that name, not the command
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        replies = await pipe.execute(raise_on_error=False)
        missing = []
        for index, reply in zip(todo, replies, strict=True):
            if isinstance(reply, NoScriptError) and attempt == 0:
                missing.append(index)
            else:
                results[index] = reply
        if not missing:
            break
        # SCRIPT LOAD goes to every primary of a cluster
        for script in {calls[index][0] for index in missing}:
            await client.script_load(script.source)
        todo = missing
    return results


async def read_range(client: Redis, room: str, after: int, upto: int, count: int) -> list[Message]:
    """Up to ``count`` stored messages with ``after < seq <= upto``, ascending."""
    if upto <= after:
        return []
    start = "-" if after < 0 else str(after + 1)
    entries = await client.xrange(stream_key(room), start, str(upto), count=count)
    return stream_messages(room, entries)
