"""The contract's flows over a real server, for every serializer, both loops, deflate off, on
and shared, on both transports.

picows has no permessage-deflate with context takeover (``TRANSPORT=picows`` with
``WS_DEFLATE=on`` is refused at start, see test_settings), so it runs the combinations with
deflate off, and one with deflate shared (the rest of shared's combinations run on
websockets, beside every one with deflate on). One more combination per transport runs the
same flows with ``BROKER=redis`` (one process, on a private redis-server): history in
Redis Streams, delivery through sharded pub/sub; and once more on a private Redis Cluster
(``REDIS_CLUSTER=on``, three primaries with a replica each).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from chat_server.messages import Ack, History, Joined, Message, Presence, Send, Welcome
from chat_server.settings import TRANSPORTS
from tests.support import Client, KeyPair, RedisClusterProcesses, RedisProcess, ServerProcess

MATRIX = (
    [
        pytest.param(
            {"serializer": s, "event_loop": loop, "ws_deflate": deflate, "transport": transport},
            id=f"{s}-{loop}-deflate_{deflate}"
            + ("" if transport == "websockets" else f"-{transport}"),
        )
        for transport, s, loop, deflate in itertools.product(
            TRANSPORTS,
            ("json", "orjson", "protobuf"),
            ("asyncio", "uvloop"),
            ("on", "shared", "off"),
        )
        if transport == "websockets"
        or deflate == "off"
        or (deflate == "shared" and (s, loop) == ("orjson", "uvloop"))
    ]
    + [
        pytest.param(
            {
                "serializer": "orjson",
                "event_loop": "uvloop",
                "ws_deflate": "off",
                "broker": "redis",
                "transport": transport,
            },
            id="orjson-uvloop-deflate_off-redis"
            + ("" if transport == "websockets" else f"-{transport}"),
        )
        for transport in TRANSPORTS
    ]
    + [
        pytest.param(
            {
                "serializer": "orjson",
                "event_loop": "uvloop",
                "ws_deflate": "off",
                "broker": "redis",
                "redis_cluster": "on",
                "transport": "websockets",
            },
            id="orjson-uvloop-deflate_off-redis_cluster",
        )
    ]
)


@pytest.fixture(scope="module", params=MATRIX)
def matrix_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, keys: KeyPair
) -> Iterator[ServerProcess]:
    """One server per toggle combination (and its Redis, if any), shared by this module's tests."""
    workdir = tmp_path_factory.mktemp("flows")
    settings = dict(request.param)
    redis: RedisProcess | RedisClusterProcesses | None = None
    if settings.get("redis_cluster") == "on":
        redis = RedisClusterProcesses(workdir).start()
        settings["redis_url"] = redis.url
    elif settings.get("broker") == "redis":
        redis = RedisProcess(workdir).start()
        settings["redis_url"] = redis.url
    server = ServerProcess(workdir, keys, **settings)
    try:
        server.start()
        yield server
        assert server.stop() == 0, server.log()
    finally:
        server.kill()
        if redis is not None:
            redis.kill()


_rooms = itertools.count()


def fresh_room() -> str:
    """A room name no other test in this run uses."""
    return f"room-{next(_rooms)}"


async def connect(server: ServerProcess, keys: KeyPair, user: str) -> Client:
    """Connect (offering deflate when the server accepts it) and read the welcome."""
    compression = "deflate" if server.settings.get("WS_DEFLATE") in ("on", "shared") else None
    client = await Client.connect(server, keys.mint(user), compression=compression)
    welcome = await client.expect(Welcome)
    assert welcome.user == user
    assert welcome.codec == server.serializer
    return client


async def test_deflate_is_negotiated_only_when_on_or_shared(
    matrix_server: ServerProcess, keys: KeyPair
):
    client = await Client.connect(matrix_server, keys.mint("dora"), compression="deflate")
    extensions = client.conn.response.headers.get("Sec-WebSocket-Extensions")
    mode = matrix_server.settings["WS_DEFLATE"]
    if mode == "off":
        assert extensions is None
    else:
        assert extensions is not None and extensions.startswith("permessage-deflate")
        # shared: no context takeover either way, whatever the client offered
        without_context = ("server_no_context_takeover", "client_no_context_takeover")
        assert all((p in extensions) is (mode == "shared") for p in without_context)
    assert client.conn.subprotocol == client.codec.subprotocol
    await client.close()


async def test_join_presence_send_ack_and_leave(matrix_server: ServerProcess, keys: KeyPair):
    room = fresh_room()
    alice = await connect(matrix_server, keys, "alice")
    bob = await connect(matrix_server, keys, "bob")

    joined = await alice.join(room)
    assert joined == Joined(room=room, members=["alice"], last_seq=0)
    joined = await bob.join(room)
    assert joined.members == ["alice", "bob"]
    assert await alice.expect(Presence) == Presence(room=room, user="bob", event="join")

    await alice.say(room, "hello bob", ref="c-1")
    for client in (alice, bob):
        message = await client.expect(Message)
        assert (message.room, message.seq, message.user, message.body) == (
            room,
            1,
            "alice",
            "hello bob",
        )
        assert message.ref == "c-1"
        assert message.ts > 1_700_000_000_000
    assert await alice.expect(Ack) == Ack(room=room, seq=1, ref="c-1")

    await bob.say(room, "hi alice")  # no ref: none comes back
    message = await alice.expect(Message)
    assert (message.seq, message.user, message.ref) == (2, "bob", None)
    assert (await bob.expect(Message)).seq == 2
    assert await bob.expect(Ack) == Ack(room=room, seq=2)

    await bob.leave(room)
    assert await alice.expect(Presence) == Presence(room=room, user="bob", event="leave")
    await alice.say(room, "bob is gone")
    assert (await alice.expect(Message)).seq == 3
    await alice.expect(Ack)

    # a disconnect is a leave too
    await bob.join(room)
    assert (await alice.expect(Presence)).event == "join"
    await bob.close()
    assert await alice.expect(Presence) == Presence(room=room, user="bob", event="leave")
    await alice.close()


async def test_history_pages_backwards(matrix_server: ServerProcess, keys: KeyPair):
    room = fresh_room()
    alice = await connect(matrix_server, keys, "alice")
    await alice.join(room)
    for i in range(1, 13):
        await alice.say(room, f"m{i}")
    for _ in range(12):
        await alice.expect(Ack, skip=(Message,))

    reader = await connect(matrix_server, keys, "reader")  # need not have joined
    page = await reader.history(room, limit=5)
    assert isinstance(page, History)
    assert [m.seq for m in page.messages] == [8, 9, 10, 11, 12]
    assert [m.body for m in page.messages] == ["m8", "m9", "m10", "m11", "m12"]
    page = await reader.history(room, before=page.messages[0].seq, limit=5)
    assert [m.seq for m in page.messages] == [3, 4, 5, 6, 7]
    page = await reader.history(room, before=3, limit=5)
    assert [m.seq for m in page.messages] == [1, 2]
    page = await reader.history(room, before=1)
    assert page.messages == []
    page = await reader.history(room)  # default limit 50: everything
    assert [m.seq for m in page.messages] == list(range(1, 13))
    await alice.close()
    await reader.close()


async def test_join_since_replays_missed_then_live(matrix_server: ServerProcess, keys: KeyPair):
    room = fresh_room()
    alice = await connect(matrix_server, keys, "alice")
    await alice.join(room)
    for i in range(1, 6):
        await alice.say(room, f"m{i}")
    for _ in range(5):
        await alice.expect(Ack, skip=(Message,))

    bob = await connect(matrix_server, keys, "bob")
    joined = await bob.join(room, since=2)
    assert joined.last_seq == 5
    await alice.say(room, "live")
    seqs = []
    while len(seqs) < 4:
        message = await bob.expect(Message)
        seqs.append(message.seq)
    assert seqs == [3, 4, 5, 6]  # replay, then live, no gap, no duplicate
    await alice.close()
    await bob.close()


async def test_a_message_sent_in_fragments_is_one_message(
    matrix_server: ServerProcess, keys: KeyPair
):
    room = fresh_room()
    alice = await connect(matrix_server, keys, "alice")
    await alice.join(room)
    frame = alice.codec.encode_client(Send(room=room, body="in three parts", ref="f-1"))
    parts = [frame[:5], frame[5:9], frame[9:]]
    if not alice.codec.binary:
        parts = [part.decode() for part in parts]  # text fragments (ASCII: cut anywhere)
    await alice.conn.send(parts)
    message = await alice.expect(Message)
    assert (message.body, message.ref) == ("in three parts", "f-1")
    assert await alice.expect(Ack) == Ack(room=room, seq=message.seq, ref="f-1")
    await alice.close()
