"""Acks that survive a primary's death: a primary killed, and a primary frozen past the
node timeout, under load from clients that retry.

Real processes: a private Redis Cluster for the module (three primaries with a replica
each, ``cluster-node-timeout`` 2 s), ``WORKERS=2`` with ``REDIS_CLUSTER=on`` (so
``REDIS_ACK_REPLICAS`` is 1: every commit waits for a replica), real websocket clients.
Each client does what the contract asks of a careful one: every send has a unique
``ref``; a send answered ``unavailable`` goes again with the same ``ref`` and body; after
a dropped connection it joins again with ``since`` (the last ``seq`` it saw) and sends
again everything not acked. Then every room is paged and counted: nothing acked or
delivered is lost, no ``seq`` is delivered with two bodies, nothing is stored twice,
there is no gap, the clients send again within 30 s of the fault, and no live member's
presence flaps. ``CHATLAB_FAILOVER_RUNS`` (default 1) repeats each fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from redis.crc import key_slot
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from chat_server.messages import Ack, Error, Join, Joined, Message, Presence, Send, Welcome
from tests.chat_server.test_scaleout import start_workers
from tests.support import Client, KeyPair, RedisClusterProcesses, ServerProcess, stored_history

ROOMS = [f"failover-{i}" for i in range(4)]
TALKERS_PER_ROOM = 2
#: seconds between one client's new sends (8 clients: about 270 sends/s in all)
SEND_EVERY_S = 0.03
#: a send answered unavailable goes again after this long
RETRY_AFTER_S = 0.5
#: the liveness bound: no room of the failed shard goes longer without an ack
LIVENESS_S = 30
RUNS = int(os.environ.get("CHATLAB_FAILOVER_RUNS", "1"))


def slot_of(room: str) -> int:
    """The slot of ``room``'s keys and channel."""
    return key_slot(f"chat:{{{room}}}".encode())


@dataclass
class Talker:
    """One retrying client in one room, and everything it saw."""

    user: str
    room: str
    token: str
    bodies: dict[str, str] = field(default_factory=dict)  # ref -> body
    first_sent: dict[str, float] = field(default_factory=dict)  # ref -> when
    acked: dict[str, tuple[int, float]] = field(default_factory=dict)  # ref -> seq, when
    delivered: dict[int, str] = field(default_factory=dict)  # seq -> body
    two_bodies: list[int] = field(default_factory=list)
    presence: list[tuple[str, str]] = field(default_factory=list)  # (user, event)
    retry: list[str] = field(default_factory=list)
    unavailable: int = 0
    reconnects: int = 0
    client: Client | None = None

    def heard(self, frame: object) -> None:
        """Record one frame from the server."""
        if isinstance(frame, Message):
            known = self.delivered.setdefault(frame.seq, frame.body)
            if known != frame.body:
                self.two_bodies.append(frame.seq)
        elif isinstance(frame, Ack) and frame.ref in self.bodies:
            self.acked.setdefault(frame.ref, (frame.seq, time.monotonic()))
        elif isinstance(frame, Error) and frame.ref in self.bodies:
            assert frame.code == "unavailable", frame
            self.unavailable += 1
            self.retry.append(frame.ref)
        elif isinstance(frame, Presence):
            self.presence.append((frame.user, frame.event))

    async def connect(self, server: ServerProcess, deadline: float) -> None:
        """(Re)connect and join, with ``since`` after a reconnect; resend what is unacked."""
        while True:
            try:
                client = await Client.connect(server, self.token)
                await client.expect(Welcome)
                since = max(self.delivered, default=None)
                await client.send(Join(room=self.room, since=since))
                while not isinstance(frame := await client.recv(), Joined):
                    self.heard(frame)
                break
            except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError):
                assert time.monotonic() < deadline, f"{self.user} could not reconnect"
                await asyncio.sleep(0.2)
        if self.client is not None:
            self.reconnects += 1
            for ref, body in self.bodies.items():
                if ref not in self.acked:
                    await client.send(Send(room=self.room, body=body, ref=ref))
        self.client = client

    async def run(self, server: ServerProcess, sending: asyncio.Event, end: float) -> None:
        """Send until ``sending`` clears, then retry until every send is acked."""
        n = 0
        next_retry = 0.0
        while True:
            assert self.client is not None
            reader = asyncio.create_task(self._read(self.client))
            try:
                while not reader.done():
                    now = time.monotonic()
                    if self.retry and now >= next_retry:
                        next_retry = now + RETRY_AFTER_S
                        refs, self.retry = self.retry, []
                        for ref in refs:
                            await self.client.send(
                                Send(room=self.room, body=self.bodies[ref], ref=ref)
                            )
                    if sending.is_set():
                        ref = f"{self.user}-{n}"
                        n += 1
                        self.bodies[ref] = ref
                        self.first_sent[ref] = now
                        await self.client.send(Send(room=self.room, body=ref, ref=ref))
                    elif len(self.acked) == len(self.bodies):
                        reader.cancel()
                        return
                    assert now < end, f"{self.user}: sends still unacked at the deadline"
                    await asyncio.sleep(SEND_EVERY_S)
                await reader  # raises what ended it
            except ConnectionClosed:
                await self.connect(server, end)
            finally:
                reader.cancel()

    async def catch_up(self, last_seq: int, within_s: float = 10.0) -> None:
        """Read on until the room's last stored message arrived: a talker stops reading
        once its own sends are acked, before the last sends of the others may reach it."""
        assert self.client is not None
        deadline = time.monotonic() + within_s
        while max(self.delivered, default=0) < last_seq and time.monotonic() < deadline:
            try:
                self.heard(await self.client.recv(timeout_s=deadline - time.monotonic()))
            except TimeoutError:
                return

    async def _read(self, client: Client) -> None:
        while True:
            self.heard(await client.recv(timeout_s=3600))


async def under_fault(
    start_server: Callable[..., ServerProcess],
    cluster: RedisClusterProcesses,
    keys: KeyPair,
    fault: Callable[[RedisClusterProcesses, int], None],
) -> str:
    """Run the load, strike with ``fault(cluster, slot)`` after 1 s, go on 1 s after the
    cluster is whole again, count; a summary line."""
    # a presence lease outlasting the failover: live members never lapse meanwhile
    server = start_workers(start_server, cluster, presence_lease_s=10)
    talkers = [
        Talker(f"t{r}x{k}", room, keys.mint(f"t{r}x{k}"))
        for r, room in enumerate(ROOMS)
        for k in range(TALKERS_PER_ROOM)
    ]
    end = time.monotonic() + 120
    for talker in talkers:
        await talker.connect(server, end)
    await asyncio.sleep(0.5)  # the joins' presence reaches every member before counting
    for talker in talkers:
        talker.presence.clear()
    sending = asyncio.Event()
    sending.set()
    runs = [asyncio.create_task(t.run(server, sending, end)) for t in talkers]
    await asyncio.sleep(1)  # some 270 sends acked before the fault
    victim_slot = slot_of(ROOMS[0])
    fault_at = time.monotonic()
    await asyncio.to_thread(fault, cluster, victim_slot)
    restored_s = time.monotonic() - fault_at
    await asyncio.sleep(1)  # and some 270 more once the promoted replica serves
    sending.clear()
    await asyncio.gather(*runs)

    # liveness: the longest wait between two acks in a room of the failed shard
    victim = cluster.primary_of(victim_slot)
    stall_s = 0.0
    for room in [room for room in ROOMS if cluster.primary_of(slot_of(room)) is victim]:
        acks = sorted(when for t in talkers if t.room == room for _, when in t.acked.values())
        stall_s = max(stall_s, *(b - a for a, b in itertools.pairwise(acks)))
    assert stall_s < LIVENESS_S

    sent = acked = lost = doubled = gaps = 0
    for room in ROOMS:
        members = [t for t in talkers if t.room == room]
        stored = await stored_history(server, keys.mint("reader"), room)
        by_seq = {m.seq: m.body for m in stored}
        bodies = [m.body for m in stored]
        gaps += (
            len(stored) - len(set(by_seq)) + sum(1 for i, m in enumerate(stored) if m.seq != i + 1)
        )
        doubled += len(bodies) - len(set(bodies))
        for t in members:
            await t.catch_up(max(by_seq, default=0))
            sent += len(t.bodies)
            acked += len(t.acked)
            assert not t.two_bodies, (t.user, t.two_bodies[:5])
            # every send acked once its retries ended, with the seq it is stored at
            lost += sum(1 for ref, (seq, _) in t.acked.items() if by_seq.get(seq) != ref)
            # everything delivered is stored, with the body delivered
            lost += sum(1 for seq, body in t.delivered.items() if by_seq.get(seq) != body)
            # and every member was delivered the whole room, in the end
            assert set(t.delivered) == set(by_seq), (t.user, len(t.delivered), len(by_seq))
            assert "leave" not in {event for _, event in t.presence}, (t.user, t.presence)
    assert (lost, doubled, gaps) == (0, 0, 0)
    assert acked == sent
    log = server.log()
    assert server.stop() == 0, log
    return (
        f"sends={sent} acked={acked} lost=0 stored_twice=0 two_bodies=0 gaps=0 "
        f"unavailable={sum(t.unavailable for t in talkers)} "
        f"reconnects={sum(t.reconnects for t in talkers)} "
        f"replica_back_after_s={restored_s:.1f} longest_ack_gap_s={stall_s:.1f} "
        f"short_of_replicas_logged={log.count('replicas asked')}"
    )


def kill_primary(cluster: RedisClusterProcesses, slot: int) -> None:
    """``kill -9`` the slot's primary; once its replica serves the slot, restart it (it
    rejoins as that replica's replica)."""
    old = cluster.primary_of(slot)
    old.kill()
    promoted = cluster.wait_promoted(slot, old)
    old.start()
    cluster.wait_replicated(promoted)


def freeze_primary(cluster: RedisClusterProcesses, slot: int) -> None:
    """SIGSTOP the slot's primary until its replica is promoted, then SIGCONT it (it finds
    itself demoted and follows the new primary)."""
    old = cluster.primary_of(slot)
    cluster.freeze(old)
    try:
        promoted = cluster.wait_promoted(slot, old)
    finally:
        cluster.thaw(old)
    cluster.wait_replicated(promoted)


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("fault", [kill_primary, freeze_primary], ids=["kill9", "sigstop"])
async def test_a_failed_primary_loses_doubles_and_gaps_nothing_acked_or_delivered(
    start_server: Callable[..., ServerProcess],
    fresh_cluster: RedisClusterProcesses,
    keys: KeyPair,
    fault: Callable[[RedisClusterProcesses, int], None],
    run: int,
):
    summary = await under_fault(start_server, fresh_cluster, keys, fault)
    print(f"\n{fault.__name__} run {run + 1}: {summary}")
    with contextlib.suppress(RuntimeError):
        fresh_cluster.wait_ok()
