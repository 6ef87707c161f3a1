"""Several workers on Redis: shared rooms, a killed worker, a restarted Redis, start-up refusals.

Real processes throughout: a private redis-server per test (and the tests of shared rooms
once more on a Redis Cluster of three primaries with a replica each, one per module), the
chat server as
``python -m chat_server`` with ``WORKERS=2`` (a supervisor and two workers on one
port), real websocket clients that learn their worker from the handshake's
``X-Chatlab-Worker`` header.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
from websockets.exceptions import ConnectionClosed

from chat_server.messages import Ack, Error, Message, Presence
from chat_server.settings import SPECS
from tests.support import (
    ROOT,
    Client,
    KeyPair,
    RedisClusterProcesses,
    RedisProcess,
    ServerProcess,
    free_port,
    stored_history,
    wait_until,
)
from tests.support.workers import (
    WORKER_HEADER,
    Inbox,
    connect_to,
    start_workers,
    worker_replaced,
)


@pytest.fixture(params=["one_redis", "cluster"])
def shared_redis(request: pytest.FixtureRequest) -> RedisProcess | RedisClusterProcesses:
    """What the workers share: a private redis-server, or the module's Redis Cluster
    (emptied first)."""
    if request.param == "cluster":
        return request.getfixturevalue("fresh_cluster")  # type: ignore[no-any-return]
    return request.getfixturevalue("redis_server")  # type: ignore[no-any-return]


def assert_each_ack_follows_its_message(inbox: Inbox) -> None:
    seen: set[int] = set()
    for frame in inbox.frames:
        if isinstance(frame, Message):
            seen.add(frame.seq)
        elif isinstance(frame, Ack):
            assert frame.seq in seen, f"ack {frame.seq} before its message"


# the listening socket handed down, on each transport; the transport and what the workers
# share meet nowhere (the broker never sees a socket), so one Redis kind each
@pytest.mark.parametrize(
    ("shared_redis", "transport"),
    [("one_redis", "websockets"), ("cluster", "picows")],
    indirect=True,
)
async def test_two_workers_share_a_room_in_seq_order_with_presence(
    start_server: Callable[..., ServerProcess],
    shared_redis: RedisProcess | RedisClusterProcesses,
    keys: KeyPair,
):
    server = start_workers(start_server, shared_redis)
    alice, alice_worker = await connect_to(server, keys, "alice")
    bob, bob_worker = await connect_to(server, keys, "bob", not_on=alice_worker)
    room = "shared"
    assert (await alice.join(room)).members == ["alice"]
    bob_joined = await bob.join(room)
    assert "bob" in bob_joined.members
    alice_inbox, bob_inbox = Inbox(alice), Inbox(bob)
    # presence crosses workers: alice hears bob arrive; bob has alice in his view either way
    await alice_inbox.wait_for(
        lambda: Presence(room=room, user="bob", event="join") in alice_inbox.frames
    )
    if "alice" not in bob_joined.members:
        await bob_inbox.wait_for(
            lambda: Presence(room=room, user="alice", event="join") in bob_inbox.frames
        )

    n = 150
    for i in range(n):
        await alice.say(room, f"a{i}", ref=f"a{i}")
        await bob.say(room, f"b{i}", ref=f"b{i}")
    for inbox in (alice_inbox, bob_inbox):
        await inbox.wait_for(lambda inbox=inbox: len(inbox.of(Message)) >= 2 * n)
        await inbox.wait_for(lambda inbox=inbox: len(inbox.of(Ack)) >= n)
        messages = inbox.of(Message)
        # every message once, in seq order, no gap, whichever worker committed it
        assert [m.seq for m in messages] == list(range(1, 2 * n + 1))
        for who in ("a", "b"):
            sent = [f"{who}{i}" for i in range(n)]
            assert [m.body for m in messages if m.body[0] == who] == sent
        assert_each_ack_follows_its_message(inbox)
    assert {a.ref for a in alice_inbox.of(Ack)} == {f"a{i}" for i in range(n)}

    # history is the same from either worker
    for worker in (alice_worker, bob_worker):
        reader, _ = await connect_to(server, keys, "reader", on=worker)
        page = await reader.history(room, limit=500)
        assert [m.seq for m in page.messages] == list(range(1, 2 * n + 1))
        await reader.close()

    await bob.close()
    await alice_inbox.wait_for(
        lambda: Presence(room=room, user="bob", event="leave") in alice_inbox.frames
    )
    assert server.stop() == 0, server.log()


async def test_presence_is_the_view_of_every_worker_without_flicker(
    start_server: Callable[..., ServerProcess],
    shared_redis: RedisProcess | RedisClusterProcesses,
    keys: KeyPair,
):
    # a user on both workers is present until its last connection leaves; a user who joins
    # and leaves faster than the echo of its own presence write comes back from Redis is
    # announced once each way (the echo was seen as a new arrival: join, leave, join, leave)
    server = start_workers(start_server, shared_redis)
    alice, here = await connect_to(server, keys, "alice")
    bob_here, _ = await connect_to(server, keys, "bob", on=here)
    bob_there, _ = await connect_to(server, keys, "bob", not_on=here)
    room = "view"
    await alice.join(room)
    inbox = Inbox(alice)

    def bob_events() -> list[str]:
        return [p.event for p in inbox.of(Presence) if p.user == "bob"]

    await bob_there.join(room)
    await inbox.wait_for(lambda: bob_events() == ["join"])
    await bob_here.join(room)
    await bob_there.leave(room)  # bob is still here
    rounds = 20
    for i in range(rounds):  # each a round trip through Redis, none waiting for the echo
        await alice.say(room, f"m{i}", ref=f"m{i}")
        await inbox.wait_for(lambda i=i: f"m{i}" in inbox.answers())
    await bob_here.leave(room)
    await inbox.wait_for(lambda: bob_events() == ["join", "leave"])

    carol = (await connect_to(server, keys, "carol", on=here))[0]
    for _ in range(rounds):
        await carol.join(room)
        await carol.leave(room)
    await alice.say(room, "last", ref="last")
    await inbox.wait_for(lambda: "last" in inbox.answers())
    # what is asserted is that no echo comes late: a quiet half second in which one would
    await asyncio.sleep(0.5)
    carol_events = [p.event for p in inbox.of(Presence) if p.user == "carol"]
    assert carol_events == ["join", "leave"] * rounds
    assert bob_events() == ["join", "leave"]
    assert server.stop() == 0, server.log()


async def test_sigkill_of_a_worker_loses_nothing_acked_and_its_users_leave(
    start_server: Callable[..., ServerProcess],
    shared_redis: RedisProcess | RedisClusterProcesses,
    keys: KeyPair,
):
    server = start_workers(start_server, shared_redis, presence_lease_s=2)
    observer, observer_worker = await connect_to(server, keys, "observer")
    carol, victim = await connect_to(server, keys, "carol", not_on=observer_worker)
    ghost, _ = await connect_to(server, keys, "ghost", on=victim)
    room = "kill"
    for client in (observer, carol, ghost):
        await client.join(room)
    observer_inbox, carol_inbox, _ghost_inbox = Inbox(observer), Inbox(carol), Inbox(ghost)

    async def carol_talks() -> None:
        try:
            for i in range(100000):
                await carol.say(room, f"c{i}", ref=f"c{i}")
                await asyncio.sleep(0.002)  # traffic at a pace, for the kill to land in
        except ConnectionClosed:
            return

    talking = asyncio.create_task(carol_talks())
    await carol_inbox.wait_for(lambda: len(carol_inbox.of(Ack)) >= 50)
    os.kill(victim, signal.SIGKILL)  # under traffic
    await talking
    await carol_inbox.wait_for(lambda: carol_inbox.closed)
    acked = {ack.seq for ack in carol_inbox.of(Ack)}
    carol_last_seen = carol_inbox.of(Message)[-1].seq

    # the supervisor starts a new worker in the dead one's seat
    await worker_replaced(server, victim)
    assert "restarting in" in server.log()

    # the killed worker's users vanish from the others' view once its lease runs out
    await observer_inbox.wait_for(
        lambda: Presence(room=room, user="ghost", event="leave") in observer_inbox.frames
    )
    # the room goes on meanwhile
    for i in range(20):
        await observer.say(room, f"o{i}", ref=f"o{i}")
    await observer_inbox.wait_for(
        lambda: all(f"o{i}" in observer_inbox.answers() for i in range(20))
    )
    assert all(isinstance(a, Ack) for a in observer_inbox.answers().values())
    acked |= {a.seq for a in observer_inbox.of(Ack)}

    # carol comes back on any worker with since: she misses nothing, sees nothing twice
    carol, _ = await connect_to(server, keys, "carol")
    joined = await carol.join(room, since=carol_last_seen)
    replayed = []
    while len(replayed) < joined.last_seq - carol_last_seen:
        replayed.append((await carol.expect(Message, skip=(Presence,))).seq)
    assert replayed == list(range(carol_last_seen + 1, joined.last_seq + 1))

    # the surviving worker delivered the room without a gap, and every ack is stored
    observed = [m.seq for m in observer_inbox.of(Message)]
    assert observed == list(range(1, len(observed) + 1))
    stored = [m.seq for m in await stored_history(server, keys.mint("reader"), room)]
    assert stored == list(range(1, len(stored) + 1))
    assert acked <= set(stored), sorted(acked - set(stored))[:10]
    assert server.stop() == 0, server.log()


async def test_redis_restart_answers_unavailable_then_resumes_losing_nothing_acked(
    start_server: Callable[..., ServerProcess],
    start_redis: Callable[..., RedisProcess],
    keys: KeyPair,
):
    redis = start_redis(appendonly=True)  # appendfsync always: what Redis acked survives
    server = start_workers(start_server, redis)
    alice, alice_worker = await connect_to(server, keys, "alice")
    bob, _ = await connect_to(server, keys, "bob", not_on=alice_worker)
    room = "outage"
    await alice.join(room)
    await bob.join(room)
    alice_inbox, bob_inbox = Inbox(alice), Inbox(bob)
    refs = [f"a{i}" for i in range(10)]
    for ref in refs:
        await alice.say(room, ref, ref=ref)
    await alice_inbox.wait_for(lambda: len(alice_inbox.of(Ack)) == 10)

    async def burst() -> None:
        for i in range(60):
            refs.append(f"x{i}")
            await alice.say(room, f"x{i}", ref=f"x{i}")
            await asyncio.sleep(0.005)  # a burst at a pace, for the outage to land in

    bursting = asyncio.create_task(burst())
    await wait_until(lambda: len(refs) >= 10 + 10, 10, "ten sends of the burst out")
    redis.stop()  # Redis goes away in the middle of the burst
    await bursting
    refs.append("down")
    await alice.say(room, "down", ref="down")
    # Redis stays away until the server answered a send made meanwhile (asserted below)
    await alice_inbox.wait_for(lambda: "down" in alice_inbox.answers())
    start_redis(appendonly=True, port=redis.port)  # same port, same AOF

    # service resumes by itself: a send is acked again
    for k in range(150):
        refs.append(f"p{k}")
        await alice.say(room, f"p{k}", ref=f"p{k}")
        await asyncio.sleep(0.2)  # a client's pace, trying again
        if any(isinstance(alice_inbox.answers().get(f"p{j}"), Ack) for j in range(k + 1)):
            break
    await alice_inbox.wait_for(lambda: all(ref in alice_inbox.answers() for ref in refs))
    answers = alice_inbox.answers()
    errors = {ref: a for ref, a in answers.items() if isinstance(a, Error)}
    acks = {ref: a for ref, a in answers.items() if isinstance(a, Ack)}
    assert errors, "some sends met the outage"
    assert {e.code for e in errors.values()} == {"unavailable"}
    assert "down" in errors
    assert len([f for f in alice_inbox.frames if isinstance(f, (Ack, Error))]) == len(refs)

    # nothing acked was lost, nothing refused was stored, seq went on from the last stored
    stored = await stored_history(server, keys.mint("reader"), room)
    assert [m.seq for m in stored] == list(range(1, len(stored) + 1))
    assert {m.ref for m in stored} == set(acks)
    first_probe = min((a.seq for r, a in acks.items() if r.startswith("p")), default=None)
    assert first_probe == max(a.seq for r, a in acks.items() if not r.startswith("p")) + 1
    # the other worker resubscribed and caught up: every message, in order, once
    await bob_inbox.wait_for(lambda: len(bob_inbox.of(Message)) == len(stored))
    assert [m.seq for m in bob_inbox.of(Message)] == [m.seq for m in stored]
    assert server.stop() == 0, server.log()


def _run(env: dict[str, str], cwd: Path, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in {s.env for s in SPECS}}
    return subprocess.run(
        [sys.executable, "-m", "chat_server"],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        cwd=cwd,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_workers_above_one_need_the_redis_broker(tmp_path: Path, keys: KeyPair):
    result = _run({"JWT_PUBLIC_KEY": str(keys.public_path), "WORKERS": "2"}, tmp_path)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "WORKERS" in line and "BROKER=redis" in line


def test_unreachable_redis_at_start_exits_2_naming_redis_url(tmp_path: Path, keys: KeyPair):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    for workers in ("1", "2"):
        env = {
            "JWT_PUBLIC_KEY": str(keys.public_path),
            "BROKER": "redis",
            "REDIS_URL": url,
            "WORKERS": workers,
            "CHAT_PORT": str(free_port()),
        }
        result = _run(env, tmp_path)
        assert result.returncode == 2, (workers, result.stderr)
        [line] = result.stderr.strip().splitlines()
        assert "REDIS_URL" in line and url in line


async def test_workers_are_pinned_one_core_each_and_stop_when_the_supervisor_dies(
    start_server: Callable[..., ServerProcess], redis_server: RedisProcess
):
    usable = sorted(os.sched_getaffinity(0))
    cores = usable[:2]
    server = start_workers(
        start_server, redis_server, cpu_affinity=",".join(map(str, cores)), drain_grace_s=0
    )
    await wait_until(
        lambda: len(server.worker_pids()) == 2 and "worker 1 ready" in server.log(), 30, server.log
    )
    workers = [psutil.Process(pid) for pid in server.worker_pids()]
    # worker i gets core cores[i % len(cores)]
    assert sorted(w.cpu_affinity() for w in workers) == sorted(
        [cores[i % len(cores)]] for i in range(2)
    )

    assert server.proc is not None
    server.proc.kill()  # the supervisor only: its workers notice and stop by themselves
    server.proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive


async def test_subscribers_dropped_by_redis_resubscribe_and_fill_what_they_missed(
    start_server: Callable[..., ServerProcess],
    shared_redis: RedisProcess | RedisClusterProcesses,
    keys: KeyPair,
):
    """Redis closing the pub/sub connections (as past client-output-buffer-limit) loses nothing."""
    server = start_workers(start_server, shared_redis)
    alice, alice_worker = await connect_to(server, keys, "alice")
    bob, _ = await connect_to(server, keys, "bob", not_on=alice_worker)
    room = "dropped"
    await alice.join(room)
    await bob.join(room)
    alice_inbox, bob_inbox = Inbox(alice), Inbox(bob)
    for i in range(5):
        await alice.say(room, f"m{i}")
    await bob_inbox.wait_for(lambda: len(bob_inbox.of(Message)) == 5)

    nodes = (
        shared_redis.nodes if isinstance(shared_redis, RedisClusterProcesses) else [shared_redis]
    )
    admins = [redis.Redis.from_url(node.url) for node in nodes]
    # one pub/sub connection per worker, on the node serving the room
    assert sum(admin.client_kill_filter(_type="pubsub") for admin in admins) == 2
    for i in range(5, 40):
        await alice.say(room, f"m{i}")  # some are published while nobody listens
    for inbox in (alice_inbox, bob_inbox):
        await inbox.wait_for(lambda inbox=inbox: len(inbox.of(Message)) >= 40)
        assert [m.seq for m in inbox.of(Message)] == list(range(1, 41))
    await alice_inbox.wait_for(lambda: len(alice_inbox.of(Ack)) == 40)
    assert server.log().count("pub/sub connection lost") == 2
    subscribed = [admin.pubsub_shardnumsub("chat:{dropped}")[0][1] for admin in admins]
    assert sorted(subscribed)[-1] == 2 and sum(subscribed) == 2
    for admin in admins:
        admin.close()
    assert server.stop() == 0, server.log()


async def kill_and_wait_for_notice(server: ServerProcess, pid: int) -> None:
    """SIGKILL a worker and wait until the supervisor logged its death (it then steers
    new connections past its seat; one made before that may wait for the replacement)."""
    os.kill(pid, signal.SIGKILL)
    notice = f"(pid {pid}) exited with signal SIGKILL"
    await wait_until(lambda: notice in server.log(), 30, server.log, interval_s=0.01)


def _healthz(server: ServerProcess) -> tuple[int, str]:
    """``GET /healthz``: its status and body, whichever worker answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


async def test_healthz_is_200_only_while_every_worker_serves(
    start_server: Callable[..., ServerProcess], redis_server: RedisProcess, keys: KeyPair
):
    server = start_workers(start_server, redis_server)
    assert _healthz(server)[0] == 200  # both ready: start_server waited for it
    survivor, victim = server.worker_pids()
    await kill_and_wait_for_notice(server, victim)
    answers: list[tuple[int, str]] = []

    async def served_again() -> bool:
        answers.append(await asyncio.to_thread(_healthz, server))
        return any(status == 503 for status, _ in answers) and answers[-1][0] == 200

    # 503 naming the count from when the supervisor noticed until the replacement
    # serves, then 200 again
    await wait_until(
        served_again, 30, lambda: f"/healthz never said 503: {answers[-3:]}", interval_s=0.02
    )
    unready = [body for status, body in answers if status == 503]
    assert "1 of 2 workers ready" in unready[0]
    # the replacement takes connections as soon as it is ready
    (replacement,) = set(server.worker_pids()) - {survivor}
    client, pid = await connect_to(server, keys, "newcomer", on=replacement)
    assert pid == replacement
    await client.close()


async def test_a_burst_of_connections_spreads_over_the_workers(
    start_server: Callable[..., ServerProcess], redis_server: RedisProcess, keys: KeyPair
):
    server = start_workers(start_server, redis_server)
    clients = await asyncio.gather(
        *(Client.connect(server, keys.mint(f"burst{i}")) for i in range(40))
    )
    pids = collections.Counter(int(c.conn.response.headers[WORKER_HEADER]) for c in clients)
    assert set(pids) == set(server.worker_pids()), pids
    # a random pick per connection: fewer than 8 on one worker is a 1-in-24,000 burst;
    # with one shared socket, whichever worker accepted first took up to all 40
    assert min(pids.values()) >= 8, pids
    for client in clients:
        await client.close()


async def test_a_dead_worker_gets_no_new_connections_the_survivor_takes_them(
    start_server: Callable[..., ServerProcess], redis_server: RedisProcess, keys: KeyPair
):
    server = start_workers(start_server, redis_server)
    survivor, victim = server.worker_pids()
    await kill_and_wait_for_notice(server, victim)
    assert (await asyncio.to_thread(_healthz, server))[0] == 503
    # its replacement starts RESTART_MIN_S later: this burst is served at once by the
    # survivor, none waits in the dead seat's queue for the replacement
    clients = await asyncio.gather(
        *(Client.connect(server, keys.mint(f"after{i}")) for i in range(20))
    )
    pids = collections.Counter(int(c.conn.response.headers[WORKER_HEADER]) for c in clients)
    assert pids == {survivor: 20}, (pids, survivor)
    for client in clients:
        await client.close()


def test_a_port_something_listens_on_is_refused_not_shared(tmp_path: Path, keys: KeyPair):
    """Another listener on CHAT_PORT, plain or in a SO_REUSEPORT group of its own, stops
    the supervisor at start (exit 1, naming the port); it never joins that group."""
    for reuseport in (False, True):
        with socket.socket() as other:
            if reuseport:
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            other.bind(("127.0.0.1", 0))
            other.listen()
            port = other.getsockname()[1]
            env = {
                "JWT_PUBLIC_KEY": str(keys.public_path),
                "BROKER": "redis",
                "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                "WORKERS": "2",
                "CHAT_HOST": "127.0.0.1",
                "CHAT_PORT": str(port),
            }
            result = _run(env, tmp_path)
        assert result.returncode == 1, (reuseport, result.stderr)
        assert f"cannot listen on 127.0.0.1:{port}" in result.stderr, result.stderr
