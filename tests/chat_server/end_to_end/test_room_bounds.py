"""What rooms a client can make the server and its Redis hold: a bounded number per
connection, and presence keys that go once no process holds the room.

Real servers on a private redis-server, real websocket clients. The cap's answer crosses
the transport, so that test runs on each ``TRANSPORT``; the keys are read from Redis
itself (``SCAN``, ``TTL``), as an operator would.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Callable, Iterator

import pytest
import redis

from chat_server.messages import Ack, Error, Join, Joined, Message, Presence, Welcome
from tests.support import Client, KeyPair, RedisProcess, ServerProcess, wait_until

#: a small cap, so the test joins past it in a few frames (within the default rate limit)
CAP = 5
#: the shortest lease the settings allow: presence keys expire about 2 s after the last
#: lease ends (the lease, then a grace as long)
LEASE_S = 1
HISTORY_SUFFIXES = (":seq", ":log", ":durable")
PRESENCE_SUFFIXES = (":users", ":pv", ":held", ":leases")
KEY_ROOM = re.compile(r"chat:\{([^}]*)\}")


@pytest.fixture
def redis_client(redis_server: RedisProcess) -> Iterator[redis.Redis]:
    """A plain client of the test's redis-server, answering strings."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


def rooms_with_keys(client: redis.Redis) -> set[str]:
    """The rooms that have any key in Redis."""
    return {m.group(1) for key in client.scan_iter("chat:*") if (m := KEY_ROOM.match(key))}


def keys_without_expiry(client: redis.Redis) -> list[str]:
    """Every ``chat:*`` key with no expiry that is not a room's history."""
    return sorted(
        key
        for key in client.scan_iter("chat:*")
        if not key.endswith(HISTORY_SUFFIXES) and client.ttl(key) == -1
    )


def presence_keys(room: str) -> list[str]:
    return [f"chat:{{{room}}}{suffix}" for suffix in PRESENCE_SUFFIXES]


async def connect(server: ServerProcess, keys: KeyPair, user: str) -> Client:
    client = await Client.connect(server, keys.mint(user))
    await client.expect(Welcome)
    return client


@pytest.mark.transports
async def test_joins_past_the_cap_get_too_many_rooms_and_an_honest_client_is_served(
    start_server: Callable[..., ServerProcess],
    redis_server: RedisProcess,
    redis_client: redis.Redis,
    keys: KeyPair,
):
    server = start_server(broker="redis", redis_url=redis_server.url, max_rooms_per_connection=CAP)
    hostile = await connect(server, keys, "mallory")
    honest = await connect(server, keys, "alice")
    rooms = [f"r{i}" for i in range(4 * CAP)]  # 15 refusals: past MAX_PROTOCOL_ERRORS (10)

    async def flood() -> list[object]:
        for room in rooms:  # all at once: each join waits for Redis, the next behind it
            await hostile.send(Join(room=room))
        return [await hostile.recv() for _ in rooms]

    async def chat() -> Ack:
        assert (await honest.join("lobby")).members == ["alice"]
        await honest.say("lobby", "still served", ref="a-1")
        return await honest.expect(Ack, skip=(Message,))  # type: ignore[no-any-return]

    answers, ack = await asyncio.gather(flood(), chat())
    assert [type(a) for a in answers[:CAP]] == [Joined] * CAP
    assert {(type(a), getattr(a, "code", None)) for a in answers[CAP:]} == {
        (Error, "too_many_rooms")
    }
    assert (ack.room, ack.seq, ack.ref) == ("lobby", 1, "a-1")
    # still open (the refusals were not counted), in exactly the first CAP rooms
    await hostile.say(rooms[CAP - 1], "in", ref="in")
    assert (await hostile.expect(Ack, skip=(Message,))).ref == "in"
    await hostile.say(rooms[CAP], "out", ref="out")
    refused = await hostile.expect(Error)
    assert (refused.code, refused.ref) == ("not_in_room", "out")
    # nothing was subscribed or written in Redis for a refused room
    assert rooms_with_keys(redis_client) == {*rooms[:CAP], "lobby"}
    # a room left makes room for another
    await hostile.leave(rooms[0])
    assert (await hostile.join(rooms[CAP])).room == rooms[CAP]
    await hostile.close()
    await honest.close()


async def test_presence_keys_expire_once_no_lease_holds_them_and_history_stays(
    start_server: Callable[..., ServerProcess],
    redis_server: RedisProcess,
    redis_client: redis.Redis,
    keys: KeyPair,
):
    server = start_server(broker="redis", redis_url=redis_server.url, presence_lease_s=LEASE_S)
    alice = await connect(server, keys, "alice")
    bob = await connect(server, keys, "bob")
    for room in ("kept", "quiet"):  # kept gets a message (history), quiet none
        await alice.join(room)
        await bob.join(room)
        await alice.expect(Presence)
    await alice.say("kept", "hello", ref="h")
    await alice.expect(Ack, skip=(Message,))
    assert all(redis_client.exists(key) for key in presence_keys("kept"))
    assert keys_without_expiry(redis_client) == []  # held, and still every key expires
    version_before = int(redis_client.get("chat:{kept}:pv"))
    await alice.close()
    await bob.close()

    presence = [*presence_keys("kept"), *presence_keys("quiet")]
    await wait_until(
        lambda: not any(redis_client.exists(key) for key in presence),
        timeout_s=20,
        what="the presence keys of rooms nobody holds expire",
    )
    assert keys_without_expiry(redis_client) == []
    history = [f"chat:{{kept}}{suffix}" for suffix in HISTORY_SUFFIXES]
    assert [redis_client.ttl(key) for key in history] == [-1, -1, -1]  # history stays
    assert rooms_with_keys(redis_client) == {"kept"}  # the commit marker, the ref: expiring

    # rejoining: the right members, the stored history, a version above every earlier one
    alice = await connect(server, keys, "alice")
    joined = await alice.join("kept")
    assert (joined.members, joined.last_seq) == (["alice"], 1)
    bob = await connect(server, keys, "bob")
    assert (await bob.join("kept")).members == ["alice", "bob"]
    assert await alice.expect(Presence) == Presence(room="kept", user="bob", event="join")
    assert int(redis_client.get("chat:{kept}:pv")) > version_before
    await alice.close()
    await bob.close()


async def test_a_process_that_kept_a_room_while_its_keys_expired_follows_its_presence(
    start_server: Callable[..., ServerProcess],
    redis_server: RedisProcess,
    redis_client: redis.Redis,
    keys: KeyPair,
):
    """A process frozen past its lease keeps its feed of the room (and the last presence
    version it applied) while the room's keys expire and start again: the new versions
    must not look old to it, or it would drop every change from then on."""
    shared = {"broker": "redis", "redis_url": redis_server.url, "presence_lease_s": LEASE_S}
    frozen, other = start_server(**shared), start_server(**shared)
    alice = await connect(frozen, keys, "alice")
    bob = await connect(other, keys, "bob")
    await alice.join("r")
    for _ in range(2):  # some versions for the frozen process to remember
        await bob.join("r")
        assert await alice.expect(Presence) == Presence(room="r", user="bob", event="join")
        await bob.leave("r")
        assert await alice.expect(Presence) == Presence(room="r", user="bob", event="leave")
    version_before = int(redis_client.get("chat:{r}:pv"))

    assert frozen.proc is not None
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    try:
        await wait_until(
            lambda: not redis_client.exists("chat:{r}:pv"),
            timeout_s=20,
            what="the keys expire under the frozen process",
        )
        assert (await bob.join("r")).members == ["bob"]  # alice's lease lapsed
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    assert await alice.expect(Presence, 20) == Presence(room="r", user="bob", event="join")
    assert await bob.expect(Presence, 20) == Presence(room="r", user="alice", event="join")
    await bob.leave("r")
    assert await alice.expect(Presence) == Presence(room="r", user="bob", event="leave")
    assert int(redis_client.get("chat:{r}:pv")) > version_before
    await alice.close()
    await bob.close()
