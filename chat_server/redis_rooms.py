"""How a room lives in Redis, for the history store that writes it and the broker that reads it.

Each room has these keys (the ``{room}`` hash tag keeps them in one slot):

``chat:{room}:seq``
    the room's last ``seq``;
``chat:{room}:log``
    a stream holding the room's messages, entry ID ``<seq>-0``, so ``XRANGE``
    and ``XREVRANGE`` select by ``seq`` and ``XTRIM MINID`` keeps the newest
    ``HISTORY_MAX`` exactly; one field ``m``, the message as a JSON array
    ``[user, body, ts, ref]``;
``chat:{room}:commit:<writer>``
    the last batch this process committed to the room (``"<batch> <first seq>"``,
    expiring after a day): it makes each batch run at most once (see Outages);
``chat:{room}:ref:<user> <ref>``
    a send with a ``ref``: ``"<body digest> <seq>"``, expiring after
    ``SEND_REF_WINDOW_S``. The commit script answers a send with the same user,
    room, ref and body by that ``seq`` and neither stores nor publishes it again, so
    a retry is stored once whichever process takes it (idempotent sends).

and a pub/sub channel ``chat:{room}`` (:func:`room_channel`) on which the store's
commit script publishes each batch as ``M<first seq> [entry, ...]``. Also here: the
client both share (:func:`connect_redis`, which never retries by itself), the
connection errors and reconnect backoff both use.
"""

from __future__ import annotations

import asyncio
from typing import Final

import msgspec
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chat_server.messages import Message

#: bounds of the reconnect backoff (seconds, doubled with jitter after each failure)
BACKOFF_MIN_S: Final = 0.05
BACKOFF_MAX_S: Final = 1.0
#: how long closing waits for a background task to end after cancelling it
CLOSE_WAIT_S: Final = 2.0
#: connection errors: the request may or may not have reached Redis
CONNECTION_ERRORS: Final = (RedisConnectionError, RedisTimeoutError, OSError)


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


def send_ref_prefix(room: str) -> str:
    """The prefix of ``room``'s send-ref keys: ``<prefix><user> <ref>`` holds
    ``"<body digest> <seq>"`` for ``SEND_REF_WINDOW_S`` (idempotent sends)."""
    return f"chat:{{{room}}}:ref:"


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


def connect_redis(url: str) -> Redis:
    """A client for ``url`` that never retries by itself (a retried write could run twice)."""
    return Redis.from_url(
        url,
        retry=Retry(NoBackoff(), 0),
        socket_connect_timeout=2,
        socket_timeout=5,
        health_check_interval=10,
    )


async def read_range(client: Redis, room: str, after: int, upto: int, count: int) -> list[Message]:
    """Up to ``count`` stored messages with ``after < seq <= upto``, ascending."""
    if upto <= after:
        return []
    start = "-" if after < 0 else str(after + 1)
    entries = await client.xrange(stream_key(room), start, str(upto), count=count)
    return stream_messages(room, entries)
