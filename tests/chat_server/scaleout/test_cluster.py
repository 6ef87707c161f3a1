"""Rooms on a Redis Cluster while it changes under them: slots moved between primaries.

Real processes: a private cluster (three primaries with a replica each) for the module,
``WORKERS=2`` with ``REDIS_CLUSTER=on``, real websocket clients. Slots are moved the way
``redis-cli --cluster reshard`` moves each one (IMPORTING, MIGRATING, MIGRATE of its keys,
SETSLOT NODE) while the rooms in them carry traffic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from redis.crc import key_slot

from chat_server.messages import Ack, Error, Message, Presence
from tests.support import (
    KeyPair,
    RedisClusterProcesses,
    ServerProcess,
    stored_history,
    wait_until,
)
from tests.support.workers import Inbox, connect_to, start_workers

ROOMS = [f"moving-{i}" for i in range(4)]


def slot_of(room: str) -> int:
    """The slot of ``room``'s keys and channel."""
    return key_slot(f"chat:{{{room}}}".encode())


async def test_slots_moved_under_live_rooms_lose_double_and_reorder_nothing(
    start_server: Callable[..., ServerProcess], fresh_cluster: RedisClusterProcesses, keys: KeyPair
):
    cluster = fresh_cluster
    server = start_workers(start_server, cluster)
    sender, here = await connect_to(server, keys, "sender")
    listener, _ = await connect_to(server, keys, "listener", not_on=here)
    for client in (sender, listener):
        for room in ROOMS:
            await client.join(room)
    # read past the presence of the listener's joins (one per room) before the inboxes start
    joined = set()
    while joined != set(ROOMS):
        if isinstance(frame := await sender.recv(), Presence) and frame.user == "listener":
            joined.add(frame.room)
    sender_inbox, listener_inbox = Inbox(sender), Inbox(listener)
    sent: list[str] = []  # refs, in sending order; each ref's body is the ref
    moving = asyncio.Event()
    done = asyncio.Event()

    async def talk() -> None:
        i = 0
        while not done.is_set():
            for room in ROOMS:
                ref = f"{room}/{i}"
                sent.append(ref)
                await sender.say(room, ref, ref=ref)
            i += 1
            if i == 40:
                moving.set()
            await asyncio.sleep(0.003)  # the traffic's pace, for the moves to land in

    talking = asyncio.create_task(talk())
    await moving.wait()
    # every room's slot moves to another primary, one after another, under traffic; the
    # first one moves back again
    moves = [(room, cluster.primary_of(slot_of(room))) for room in ROOMS]
    for room, source in moves:
        target = next(node for node in cluster.primaries() if node is not source)
        await asyncio.to_thread(cluster.move_slot, slot_of(room), target)
        assert cluster.primary_of(slot_of(room)) is target
    await asyncio.to_thread(cluster.move_slot, slot_of(ROOMS[0]), moves[0][1])
    moved = len(sent)  # and sends go on after the last move: 40 rounds, as before the first
    await wait_until(lambda: len(sent) >= moved + 40 * len(ROOMS), 30, "sends after the moves")
    done.set()
    await talking

    # a send refused while its slot moved (unavailable: nothing stored) is sent again
    # with its ref, as a client does; every send ends acked
    await sender_inbox.wait_for(lambda: len(sender_inbox.answers()) == len(sent))
    refused = [ref for ref, answer in sender_inbox.answers().items() if isinstance(answer, Error)]
    assert all(sender_inbox.answers()[ref].code == "unavailable" for ref in refused)
    for ref in refused:
        await sender.say(ref.split("/")[0], ref, ref=ref)
    await sender_inbox.wait_for(
        lambda: sum(isinstance(f, Ack) for f in sender_inbox.frames) == len(sent)
    )
    acked = {(f.room, f.seq): f.ref for f in sender_inbox.frames if isinstance(f, Ack)}
    assert sorted(acked.values()) == sorted(sent)  # each send acked once

    for inbox in (listener_inbox, sender_inbox):
        await inbox.wait_for(lambda inbox=inbox: len(inbox.of(Message)) >= len(sent))
    for room in ROOMS:
        in_order = [ref for ref in sent if ref.startswith(f"{room}/")]
        stored = await stored_history(server, keys.mint("reader"), room)
        assert [m.seq for m in stored] == list(range(1, len(in_order) + 1))
        for inbox in (listener_inbox, sender_inbox):
            heard = [m for m in inbox.of(Message) if m.room == room]
            lost = set(in_order) - {m.body for m in heard}
            doubled = len(heard) - len({m.seq for m in heard})
            assert (len(lost), doubled) == (0, 0), (room, sorted(lost)[:5], doubled)
            # no gap, seq order kept, and that order is the order the sends were acked in
            assert [m.seq for m in heard] == list(range(1, len(in_order) + 1))
            assert [m.body for m in heard] == [acked[(room, m.seq)] for m in heard]
        # one sender, sends answered in order: retried ones aside, seq follows sending order
        first_tries = [m.body for m in stored if m.body not in refused]
        assert first_tries == [ref for ref in in_order if ref not in refused]
    log = server.log()
    assert "ended the subscription of room" in log or "moved from" in log
    assert server.stop() == 0, log
