"""RedisHistoryStore against a real redis-server: numbering, trimming, reads, outages."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.exceptions import ResponseError

from chat_server.errors import StoreUnavailable
from chat_server.messages import Message
from chat_server.redis_rooms import connect_redis, legacy_send_ref_key, send_key
from chat_server.store.base import BatchResult
from chat_server.store.redis import COMMIT_SCRIPT, RedisHistoryStore
from tests.support import RedisProcess, wait_until

StoreFactory = Callable[..., Awaitable[tuple[RedisHistoryStore, list[BatchResult]]]]


def make_message(room: str = "lobby", body: str = "hello", ref: str | None = None) -> Message:
    return Message(room=room, seq=0, user="alice", body=body, ts=1_732_284_000_123, ref=ref)


@pytest.fixture
async def open_store(redis_server: RedisProcess) -> AsyncIterator[StoreFactory]:
    """Start stores on the test's Redis (keyword overrides allowed); close them afterwards."""
    opened: list[tuple[RedisHistoryStore, Any]] = []

    async def factory(**overrides: Any) -> tuple[RedisHistoryStore, list[BatchResult]]:
        results: list[BatchResult] = []
        client = overrides.pop("client", None) or connect_redis(redis_server.url)
        writer = f"w{len(opened)}"  # each process has its own name (and commit markers)
        store = RedisHistoryStore(
            client=client, writer=writer, on_batch=results.append, **overrides
        )
        await store.start()
        opened.append((store, client))
        return store, results

    yield factory
    for store, client in opened:
        await store.close()
        await client.aclose()


async def test_seq_counts_per_room_across_batches_and_stores(open_store: StoreFactory):
    first, results = await open_store()
    second, _ = await open_store()  # another process sharing the Redis
    for i in range(3):
        first.submit(make_message("a", f"a{i}"), i)
    first.submit(make_message("b", "b0"), "b")
    await first.flush()
    second.submit(make_message("a", "from the other"), None)
    await second.flush()
    assert [(m.room, m.seq, ctx) for r in results for m, ctx in r.items] == [
        ("a", 1, 0),
        ("a", 2, 1),
        ("a", 3, 2),
        ("b", 1, "b"),
    ]
    assert [m.seq for m in await first.after("a", 0, 10)] == [1, 2, 3, 4]
    assert (await first.history("a", None, 1))[0].body == "from the other"


async def test_history_max_trims_exactly_and_reads_page_by_seq(open_store: StoreFactory):
    store, _ = await open_store(history_max=5)
    for i in range(1, 13):
        store.submit(make_message(body=f"m{i}", ref=f"r{i}"), None)
    await store.flush()
    assert [m.seq for m in await store.history("lobby", None, 50)] == [8, 9, 10, 11, 12]
    assert [m.seq for m in await store.history("lobby", 11, 2)] == [9, 10]
    assert await store.history("lobby", 1, 50) == []
    assert [m.seq for m in await store.after("lobby", 0, 2)] == [8, 9]
    assert [(m.body, m.ref) for m in await store.after("lobby", 11, 5)] == [("m12", "r12")]


async def test_a_lost_seq_key_continues_after_the_stream(
    open_store: StoreFactory, redis_server: RedisProcess
):
    store, results = await open_store()
    for _ in range(3):
        store.submit(make_message(), None)
    await store.flush()
    client = connect_redis(redis_server.url)
    await client.delete("chat:{lobby}:seq")
    await client.aclose()
    store.submit(make_message(body="after"), None)
    await store.flush()
    assert results[-1].error is None and results[-1].items[0][0].seq == 4


async def test_a_batch_runs_at_most_once_whatever_reaches_redis_again(
    open_store: StoreFactory, redis_server: RedisProcess
):
    store, _ = await open_store()
    client = connect_redis(redis_server.url)
    script = client.register_script(COMMIT_SCRIPT.source)
    keys = ["chat:{r}:seq", "chat:{r}:log", "chat:{r}:commit:w9", "chat:{r}:durable"]

    async def run(batch: int, *bodies: str) -> Any:
        entries = [f'["u","{body}",1,null]' for body in bodies]
        send_refs = [""] * len(bodies)
        return await script(
            keys=keys, args=["chat:{r}", str(batch), "0", "0", "1", *entries, *send_refs]
        )

    assert await run(1, "a", "b") == b"1"
    assert await run(2, "c") == b"3"
    assert await run(2, "c") == b"3"  # the same batch sent again (its reply was lost): no-op
    with pytest.raises(ResponseError, match="STALE"):
        await run(1, "a", "b")  # an old batch arriving late does not run
    assert [m.body for m in await store.after("r", 0, 10)] == ["a", "b", "c"]
    await client.aclose()


async def test_redis_away_refuses_sends_and_an_in_doubt_batch_commits_once_it_is_back(
    open_store: StoreFactory, start_redis: Callable[..., RedisProcess]
):
    redis = start_redis()
    store, results = await open_store(client=connect_redis(redis.url))
    assert store.stats().primaries_unreachable == 0
    redis.kill()
    store.submit(make_message(ref="in-doubt"), None)  # its pipeline fails: in doubt
    await wait_until(  # the metric's figure
        lambda: store.stats().primaries_unreachable == 1, what="the store took Redis for away"
    )
    with pytest.raises(StoreUnavailable):
        store.submit(make_message(), None)  # the store knows Redis is away
    assert store.stats().refused == {"node_unreachable": 1}
    with pytest.raises(StoreUnavailable):
        await store.history("lobby", None, 5)
    start_redis(port=redis.port)
    await store.flush()  # the in-doubt batch was sent again and committed
    assert results[-1].error is None
    assert [(m.seq, m.ref) for m, _ in results[-1].items] == [(1, "in-doubt")]
    assert [m.ref for m in await store.after("lobby", 0, 10)] == ["in-doubt"]
    store.submit(make_message(ref="next"), None)  # accepting again
    await store.flush()
    assert results[-1].items[0][0].seq == 2
    assert store.stats().primaries_unreachable == 0


async def test_a_repeated_ref_is_stored_once_across_stores(open_store: StoreFactory):
    first, first_results = await open_store(send_ref_window_s=60)
    second, second_results = await open_store(send_ref_window_s=60)  # another worker
    first.submit(make_message(body="hello", ref="c-1"), "original")
    await first.flush()
    # the same send through another process (a retry after a reconnect), in a batch with
    # a new message, and the same ref with another body (a new message too)
    second.submit(make_message(body="hello", ref="c-1"), "retry")
    second.submit(make_message(body="new", ref="c-2"), "new")
    second.submit(make_message(body="other body", ref="c-1"), "reused ref")
    await second.flush()
    seqs = {ctx: m.seq for r in first_results + second_results for m, ctx in r.items}
    assert seqs == {"original": 1, "retry": 1, "new": 2, "reused ref": 3}
    stored = await first.after("lobby", 0, 10)
    assert [(m.seq, m.body) for m in stored] == [(1, "hello"), (2, "new"), (3, "other body")]
    # a reused ref keeps every body's seq; a send without ref is never a repeat
    second.submit(make_message(body="other body", ref="c-1"), "again")
    second.submit(make_message(body="hello", ref="c-1"), "first body again")
    second.submit(make_message(body="hello"), "no ref")
    await second.flush()
    seqs = {ctx: m.seq for r in second_results for m, ctx in r.items}
    assert (seqs["again"], seqs["first body again"], seqs["no ref"]) == (3, 1, 4)


async def test_one_batch_with_a_ref_reused_for_two_bodies_stores_each_once(
    open_store: StoreFactory,
):
    store, results = await open_store(send_ref_window_s=60)
    store.submit(make_message(body="one", ref="c"), "one")
    store.submit(make_message(body="two", ref="c"), "two")
    store.submit(make_message(body="two", ref="c"), "two again")  # in the same script run
    await store.flush()
    other, other_results = await open_store(send_ref_window_s=60)
    for body in ("one", "two"):
        other.submit(make_message(body=body, ref="c"), f"{body} elsewhere")
    await other.flush()
    seqs = {ctx: m.seq for r in results + other_results for m, ctx in r.items}
    assert seqs == {"one": 1, "two": 2, "two again": 2, "one elsewhere": 1, "two elsewhere": 2}
    assert [(m.seq, m.body) for m in await store.after("lobby", 0, 10)] == [(1, "one"), (2, "two")]


def _digest(body: str) -> str:
    return hashlib.blake2b(body.encode(), digest_size=8).hexdigest()


async def test_a_rolling_upgrade_keeps_retries_once_across_both_layouts(
    open_store: StoreFactory, redis_server: RedisProcess
):
    """A process of the earlier version kept one key per ref (the newest body's digest and
    seq): its sends are repeats to the new script, and the new script's sends are repeats
    to it (it still writes that key)."""
    store, results = await open_store(send_ref_window_s=60)
    client = connect_redis(redis_server.url)
    try:
        # what an earlier process left after storing "hello" as seq 1
        store.submit(make_message(body="hello"), "stored by the old process")
        await store.flush()
        await client.set(legacy_send_ref_key("lobby", "alice", "c-1"), f"{_digest('hello')} 1")
        store.submit(make_message(body="hello", ref="c-1"), "retry through a new process")
        store.submit(make_message(body="new", ref="c-2"), "new")
        await store.flush()
        seqs = {ctx: m.seq for r in results for m, ctx in r.items}
        assert seqs["retry through a new process"] == 1 and seqs["new"] == 2
        # what an earlier process reads for c-2: the new script wrote it its way
        legacy = await client.get(legacy_send_ref_key("lobby", "alice", "c-2"))
        assert legacy == f"{_digest('new')} 2".encode()
        assert 0 < await client.ttl(legacy_send_ref_key("lobby", "alice", "c-2")) <= 60
        assert await client.get(send_key("lobby", "alice", "c-2", _digest("new"))) == b"2"
    finally:
        await client.aclose()


async def test_without_a_window_refs_are_not_keys(open_store: StoreFactory):
    store, results = await open_store()
    for _ in range(2):
        store.submit(make_message(body="hello", ref="c-1"), None)
    await store.flush()
    assert [m.seq for r in results for m, _ in r.items] == [1, 2]


async def test_too_few_replicas_stores_but_neither_publishes_nor_acks_until_one_holds_it(
    open_store: StoreFactory, redis_server: RedisProcess, start_redis: Callable[..., RedisProcess]
):
    store, results = await open_store(ack_replicas=1, in_doubt_wait_s=1.5, send_ref_window_s=60)
    listener = connect_redis(redis_server.url).pubsub()
    await listener.ssubscribe("chat:{lobby}")
    store.submit(make_message(body="waits", ref="r1"), None)
    assert store.stats().primaries_short_of_replicas == 0
    await store.flush()  # WAIT finds no replica: in doubt, then unavailable
    assert isinstance(results[-1].error, StoreUnavailable)
    assert store.stats().primaries_short_of_replicas == 1  # the metric's figure
    assert await store.history("lobby", None, 10) == []  # stored, but not durable
    assert redis_server.call("get", "chat:{lobby}:durable").strip() == "0"
    # known short: the next send is refused at once, unwritten (not kept in doubt again)
    with pytest.raises(StoreUnavailable, match="fewer replicas"):
        store.submit(make_message(body="refused", ref="r2"), None)
    assert store.stats().refused == {"node_short_of_replicas": 1}

    replica = start_redis()
    replica.call("replicaof", "127.0.0.1", str(redis_server.port))
    # the store's probe sees the replica online and takes sends again
    await wait_until(
        lambda: store.stats().primaries_short_of_replicas == 0, what="the probe saw the replica"
    )
    store.submit(make_message(body="waits", ref="r1"), None)  # the client's retry
    await store.flush()
    assert results[-1].error is None
    assert store.stats().primaries_short_of_replicas == 0
    assert [(m.seq, m.ref) for m, _ in results[-1].items] == [(1, "r1")]  # stored once
    assert [m.body for m in await store.history("lobby", None, 10)] == ["waits"]
    # nothing was published while it was not durable; then only that it is ("D1")
    published = []
    while (heard := await listener.get_message(timeout=0.5)) is not None:
        if heard["type"] == "smessage":
            published.append(heard["data"])
    assert published == [b"D1"]
    await listener.aclose()
