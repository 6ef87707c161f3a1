"""METRICS_PORT: the server's own view in Prometheus text, consistent with what clients saw.

With one process the server answers the scrape; with ``WORKERS=2`` (real processes
on a private Redis, as in scaleout/test_workers) the supervisor answers with the sum of what
its workers published.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chat_server.messages import Ack, Error, Message, Presence, Send, Welcome
from chat_server.store.base import REFUSAL_REASONS
from tests.support import Client, KeyPair, RedisProcess, ServerProcess, free_port, wait_until
from tests.support.prometheus import scrape_metrics
from tests.support.workers import (
    WORKER_HEADER,
    Inbox,
    connect_to,
    start_workers,
    worker_replaced,
)


async def _alice_in(
    start_server: Callable[..., ServerProcess], keys: KeyPair, room: str, **settings: Any
) -> tuple[ServerProcess, Client, int]:
    """A server with ``settings``, a metrics port and the rate limit raised (the send
    rounds outrun the default burst), and alice joined to ``room`` in it."""
    metrics_port = free_port()
    server = start_server(
        metrics_port=metrics_port, rate_limit_per_s=100000, rate_limit_burst=100000, **settings
    )
    alice = await Client.connect(server, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.join(room)
    return server, alice, metrics_port


async def _rounds_until(
    client: Client,
    room: str,
    metrics_port: int,
    reached: Callable[[dict[str, float]], bool],
    *,
    size: int,
    rounds: int,
    pause_s: float,
) -> dict[str, float]:
    """Rounds of ``size`` sends (each round's acks read) until a scrape is ``reached``;
    the last scrape. A fixed count is seen to miss: how much a send allocates, or how
    soon the checkpointer looks, varies with the machine."""
    for round_ in range(rounds):
        for i in range(size):
            await client.say(room, f"r{round_} m{i} " + "x" * 500)
        for _ in range(size):
            await client.expect(Ack, skip=(Message,))
        await asyncio.sleep(pause_s)  # a round's pace: the checkpointer looks meanwhile
        samples = scrape_metrics(metrics_port)
        if reached(samples):
            break
    return samples


@pytest.mark.transports
async def test_metrics_count_frames_errors_acks_and_batches(start_server, keys: KeyPair):
    metrics_port = free_port()
    server = start_server(event_loop="asyncio", metrics_port=metrics_port)
    alice = await Client.connect(server, keys.mint("alice"))
    bob = await Client.connect(server, keys.mint("bob"))
    for client in (alice, bob):
        await client.expect(Welcome)
        await client.join("m")
    for i in range(10):
        await alice.send(Send(room="m", body=f"m{i}"))
    for _ in range(10):
        await alice.expect(Ack, skip=(Message, Presence))
    await alice.send_raw("{broken")
    assert (await alice.expect(Error, skip=(Message,))).code == "bad_request"

    samples = scrape_metrics(metrics_port)
    assert samples["chat_connections"] == 2
    assert samples["chat_rooms"] == 1
    assert samples["chat_frames_in_total"] == 2 + 10 + 1  # joins, sends, the broken frame
    # welcome x2, joined x2, presence x1, message x20, ack x10, error x1
    assert samples["chat_frames_out_total"] == 2 + 2 + 1 + 20 + 10 + 1
    assert samples["chat_errors_total{code=bad_request}"] == 1
    assert samples["chat_ack_latency_ms_count"] == 10
    assert samples["chat_ack_latency_ms_bucket{le=+Inf}"] == 10
    assert samples["chat_group_commit_batch_size_sum"] == 10
    assert 1 <= samples["chat_group_commit_batch_size_count"] <= 10
    assert samples["chat_slow_consumer_closes_total"] == 0
    # every frame went to the kernel (a few KB each way): none waits in the server's buffers
    assert samples["chat_outbound_buffer_bytes"] == 0
    # the tail: one delivery per broadcast, commits timed, the ticker ticking, the GC
    # timed per generation, the queue empty, every error code there from the start
    assert samples["chat_delivery_latency_ms_count"] == 10
    assert samples["chat_delivery_latency_ms_bucket{le=100}"] <= 10
    assert 1 <= samples["chat_commit_seconds_count"] <= 10
    assert samples["chat_loop_lag_seconds_count"] >= 1
    assert {f"chat_gc_pause_seconds_count{{generation={g}}}" for g in "012"} <= samples.keys()
    assert samples["chat_store_queue_depth"] == 0
    # the SQLite store's WAL: the checkpointer looks at its file every 0.25 s; ten sends are
    # far from a restart (16 checkpoints' worth of frames): the series is there, at 0
    assert samples["chat_wal_restarts_total"] == 0
    await wait_until(
        lambda: scrape_metrics(metrics_port)["chat_wal_file_bytes"] > 0,
        10,
        "the WAL's size scraped",
    )
    assert samples["chat_errors_total{code=unavailable}"] == 0
    assert samples["chat_errors_total{code=rate_limited}"] == 0
    assert samples["process_cpu_seconds_total"] > 0
    await alice.close()
    await bob.close()


async def test_the_stores_refusals_are_counted_by_reason(start_server, keys: KeyPair):
    # a queue of one and hand-overs 100 ms apart: the first send commits at once, the
    # second waits out the interval, and the sends after it find the queue full
    _, alice, metrics_port = await _alice_in(
        start_server, keys, "m", store_queue_max=1, chat_db_commit_interval_ms=100
    )
    before = scrape_metrics(metrics_port)
    assert {r: before[f"chat_store_refused_total{{reason={r}}}"] for r in REFUSAL_REASONS} == {
        r: 0 for r in REFUSAL_REASONS
    }
    for i in range(6):
        await alice.say("m", f"m{i}", ref=f"r{i}")
    answers = {}
    while len(answers) < 6:
        frame = await alice.recv()
        if isinstance(frame, Ack):
            answers[frame.ref] = "acked"
        elif isinstance(frame, Error):
            assert (frame.code, frame.detail) == ("unavailable", "history store overloaded")
            answers[frame.ref] = "refused"
    refused = sum(answer == "refused" for answer in answers.values())
    assert answers["r0"] == "acked" and refused >= 1

    samples = await _scrape_until(metrics_port, {"chat_errors_total{code=unavailable}": refused})
    assert samples["chat_store_refused_total{reason=queue_full}"] == refused
    assert all(
        samples[f"chat_store_refused_total{{reason={r}}}"] == 0
        for r in REFUSAL_REASONS
        if r != "queue_full"
    )
    # the load shedder refused none of them: its refusals are its own family
    assert samples["chat_overload_refused_total"] == 0
    await alice.close()


async def test_gc_pauses_and_loop_lag_show_in_metrics_and_stats(start_server, keys: KeyPair):
    # GC_POLICY=default: CPython's thresholds collect the young generation often
    server, alice, metrics_port = await _alice_in(start_server, keys, "gc", gc_policy="default")
    # rounds of 50 sends until a young collection was seen, 0.3 s apart (some ticks of
    # the 10 ms lag ticker)
    samples = await _rounds_until(
        alice,
        "gc",
        metrics_port,
        lambda s: s["chat_gc_pause_seconds_count{generation=0}"] >= 1,
        size=50,
        rounds=40,
        pause_s=0.3,
    )
    assert samples["chat_gc_pause_seconds_count{generation=0}"] >= 1
    assert samples["chat_gc_pause_max_seconds{generation=0}"] > 0
    assert samples["chat_loop_lag_seconds_count"] >= 10
    tail = server.stats()["tail"]
    assert tail["gc"]["pauses"]["0"]["count"] >= 1
    assert tail["loop_lag"]["count"] >= 10
    assert tail["commit"]["count"] >= 1
    await alice.close()


async def test_the_commits_holds_for_wal_restarts_show_in_metrics(start_server, keys: KeyPair):
    # CHAT_DB_CHECKPOINT_PAGES=1: the checkpointer restarts the WAL every 16 frames
    server, alice, metrics_port = await _alice_in(
        start_server, keys, "wal", chat_db_checkpoint_pages=1
    )
    # rounds of sends until the checkpointer (it looks every 0.25 s) has held the commits
    # to restart the WAL
    samples = await _rounds_until(
        alice,
        "wal",
        metrics_port,
        lambda s: s["chat_wal_restarts_total"] >= 1,
        size=20,
        rounds=60,
        pause_s=0.1,
    )
    restarts = samples["chat_wal_restarts_total"]
    assert restarts >= 1
    holds = samples["chat_wal_restart_hold_seconds_count"]
    assert holds >= restarts  # a hold that found a reader in the way restarted nothing
    assert samples["chat_wal_restart_hold_seconds_bucket{le=+Inf}"] == holds
    assert samples["chat_wal_restart_hold_seconds_sum"] > 0
    assert server.stats()["tail"]["checkpointer"]["restart_holds"] >= holds
    await alice.close()


# ---- WORKERS > 1: the supervisor serves the sum of what the workers publish ----------------

COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")


async def _scrape_until(
    port: int,
    want: dict[str, float],
    floor: dict[str, float] | None = None,
    timeout_s: float = 20,
) -> dict[str, float]:
    """Scrape until every ``want`` series has its value (workers publish every second);
    every scrape on the way must have each ``floor`` series at or above its value."""
    samples: dict[str, float] = {}

    def reached() -> dict[str, float] | None:
        nonlocal samples
        samples = scrape_metrics(port)
        for name, value in (floor or {}).items():
            assert samples.get(name, 0) >= value, f"{name} went back: {samples.get(name)} < {value}"
        return samples if all(samples.get(k) == v for k, v in want.items()) else None

    def missing() -> dict[str, tuple[float | None, float]]:
        return {k: (samples.get(k), v) for k, v in want.items() if samples.get(k) != v}

    return await wait_until(reached, timeout_s, missing, interval_s=0.1)


async def _connect_until_both_workers(
    server: ServerProcess, keys: KeyPair
) -> list[tuple[Client, int]]:
    """Connect clients (each reads its welcome and stays) until both workers hold some."""
    await wait_until(lambda: "worker 1 ready" in server.log(), 30, server.log)
    clients: list[tuple[Client, int]] = []
    while len({pid for _, pid in clients}) < 2:
        assert len(clients) < 200, "every connection landed on the same worker"
        client = await Client.connect(server, keys.mint(f"user{len(clients)}"))
        await client.expect(Welcome)
        clients.append((client, int(client.conn.response.headers[WORKER_HEADER])))
        await asyncio.sleep(0.02)  # connects spread over time, as the workers take turns
    return clients


async def test_two_workers_metrics_are_summed_on_one_port_and_survive_a_killed_worker(
    start_server: Callable[..., ServerProcess], redis_server: RedisProcess, keys: KeyPair
):
    metrics_port = free_port()
    server = start_workers(start_server, redis_server, metrics_port=metrics_port)
    clients = await _connect_until_both_workers(server, keys)  # user u<i> is clients[i]
    alice, alice_worker = clients[0]
    b = next(i for i, (_, pid) in enumerate(clients) if pid != alice_worker)
    bob, bob_worker = clients[b]
    await alice.join("m")
    bob_joined = await bob.join("m")
    alice_inbox, bob_inbox = Inbox(alice), Inbox(bob)
    await alice_inbox.wait_for(
        lambda: Presence(room="m", user=f"user{b}", event="join") in alice_inbox.frames
    )
    if "user0" not in bob_joined.members:
        await bob_inbox.wait_for(
            lambda: Presence(room="m", user="user0", event="join") in bob_inbox.frames
        )
    for i in range(10):
        await alice.say("m", f"a{i}", ref=f"a{i}")
        await bob.say("m", f"b{i}", ref=f"b{i}")
    await alice.send_raw("{broken")
    await bob.send_raw("{broken")
    await bob.say("elsewhere", "not joined", ref="x")
    for inbox, errors in ((alice_inbox, 1), (bob_inbox, 2)):
        await inbox.wait_for(
            lambda inbox=inbox, errors=errors: (
                len(inbox.of(Message)) == 20
                and len(inbox.of(Ack)) == 10
                and len(inbox.of(Error)) == errors
            )
        )
    # welcomes, joined x2, and whatever alice and bob read since (presence, messages, ...)
    delivered = len(clients) + 2 + len(alice_inbox.frames) + len(bob_inbox.frames)

    samples = await _scrape_until(
        metrics_port,
        {
            "chat_frames_in_total": 2 + 20 + 2 + 1,  # joins, sends, broken frames, a stray send
            "chat_frames_out_total": delivered,
            "chat_connections": len(clients),
            "chat_rooms": 2,  # room m on each worker
            "chat_errors_total{code=bad_request}": 2,
            "chat_errors_total{code=not_in_room}": 1,
            "chat_errors_total{code=unavailable}": 0,  # every code from start, as one process
            "chat_errors_total{code=rate_limited}": 0,
            "chat_ack_latency_ms_count": 20,
            "chat_ack_latency_ms_bucket{le=+Inf}": 20,
            "chat_group_commit_batch_size_sum": 20,
            "chat_slow_consumer_closes_total": 0,
            "chat_outbound_buffer_bytes": 0,  # everything read: nothing waits in the server
        },
    )
    assert 2 <= samples["chat_group_commit_batch_size_count"] <= 20  # each worker commits

    # a killed worker's counts stay; its live gauges go once the supervisor saw it die
    counted = {k: v for k, v in samples.items() if k.split("{")[0].endswith(COUNTER_SUFFIXES)}
    os.kill(alice_worker, signal.SIGKILL)
    on_bob_worker = sum(pid == bob_worker for _, pid in clients)
    await _scrape_until(
        metrics_port, {"chat_connections": on_bob_worker, "chat_rooms": 1}, floor=counted
    )
    [restarted] = set(await worker_replaced(server, alice_worker)) - {bob_worker}
    carol, _ = await connect_to(server, keys, "carol", on=restarted)
    await bob.say("m", "after", ref="after")
    await bob_inbox.wait_for(lambda: "after" in bob_inbox.answers())
    await _scrape_until(
        metrics_port,
        {
            "chat_frames_in_total": counted["chat_frames_in_total"] + 1,
            "chat_ack_latency_ms_count": 21,
            "chat_connections": on_bob_worker + 1,  # carol on the restarted worker
        },
        floor=counted,
    )

    await carol.close()
    [directory] = re.findall(r"metrics of all workers on \S+ \(files in (\S+)\)", server.log())
    assert Path(directory).is_dir()
    assert server.stop() == 0, server.log()
    assert not Path(directory).exists()


async def test_two_workers_serve_the_families_of_one_process(
    start_server: Callable[..., ServerProcess], redis_server: RedisProcess, keys: KeyPair
):
    """Names, help, types, labels and ack-latency bounds as with WORKERS=1: one dashboard."""
    ports = {"one": free_port(), "two": free_port(), "one on redis": free_port()}
    servers = {
        "one": start_server(event_loop="asyncio", metrics_port=ports["one"]),
        "two": start_workers(start_server, redis_server, metrics_port=ports["two"]),
        "one on redis": start_server(
            broker="redis", redis_url=redis_server.url, metrics_port=ports["one on redis"]
        ),
    }
    texts = {}
    for name, server in servers.items():
        client = await Client.connect(server, keys.mint("alice"))
        await client.expect(Welcome)
        await client.join("m")
        await client.say("m", "hello", ref="r")
        await client.expect(Ack, skip=(Message,))
        await client.send_raw("{broken")
        await client.expect(Error)
        await _scrape_until(
            ports[name], {"chat_frames_in_total": 3, "chat_ack_latency_ms_count": 1}
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[name]}/metrics") as response:
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            texts[name] = response.read().decode()
        await client.close()

    def shape(text: str) -> dict[tuple[str, str, str], set[tuple[str, tuple[str, ...]]]]:
        return {
            (f.name, f.type, f.documentation): {
                (s.name, tuple(sorted(s.labels))) for s in f.samples
            }
            for f in text_string_to_metric_families(text)
        }

    def bounds(text: str, family: str) -> list[str]:
        return [
            s.labels["le"]
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == f"{family}_bucket"
        ]

    # the WAL's families are the SQLite store's; workers keep history in Redis, whose
    # store has its own (primaries short of replicas or unreachable, requests refused as
    # their node was busy: none here)
    one = {k: v for k, v in shape(texts["one"]).items() if not k[0].startswith("chat_wal_")}
    assert len(one) == len(shape(texts["one"])) - 3  # file bytes, restarts, restart holds
    two = {k: v for k, v in shape(texts["two"]).items() if not k[0].startswith("chat_redis_")}
    assert len(two) == len(shape(texts["two"])) - 3 and two == one
    assert shape(texts["one on redis"]) == shape(texts["two"])
    for name in ("two", "one on redis"):
        samples = scrape_metrics(ports[name])
        assert samples["chat_redis_primaries_short_of_replicas"] == 0
        assert samples["chat_redis_primaries_unreachable"] == 0
        assert samples["chat_redis_node_busy_total"] == 0
    ack_bounds = bounds(texts["one"], "chat_ack_latency_ms")
    assert sorted(bounds(texts["two"], "chat_ack_latency_ms")) == sorted(ack_bounds)
    assert "5" in ack_bounds and "+Inf" in ack_bounds
    # one process lists the batch sizes it saw; workers list every bound up to STORE_BATCH_MAX
    batch_bounds = bounds(texts["two"], "chat_group_commit_batch_size")
    assert set(bounds(texts["one"], "chat_group_commit_batch_size")) <= set(batch_bounds)
    assert "1023" in batch_bounds
    assert servers["two"].stop() == 0, servers["two"].log()


def test_workers_metrics_port_in_use_stops_the_supervisor_at_start(
    start_server: Callable[..., ServerProcess], redis_server: RedisProcess
):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(RuntimeError, match=r"exited 1") as failed:
            start_workers(start_server, redis_server, metrics_port=taken.getsockname()[1])
    assert "METRICS_PORT" in str(failed.value)


@pytest.mark.parametrize("policy", ["tuned", "default"])
async def test_gc_policy_is_applied_once_the_server_is_up(start_server, policy: str):
    server = start_server(gc_policy=policy)
    gc_stats = server.stats()["tail"]["gc"]
    if policy == "tuned":
        assert gc_stats["thresholds"] == [50_000, 20, 1_000_000]
        assert gc_stats["frozen_objects"] > 10_000  # modules, settings, codecs
    else:
        assert gc_stats["thresholds"] == [700, 10, 10]
        assert gc_stats["frozen_objects"] == 0
