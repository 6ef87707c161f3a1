"""Each Redis node's health and its bound on requests in flight, driven with plain values.

:class:`NodeHealth` is the table that decides whether a node's rooms' sends are taken,
refused at once, or read; :class:`NodeGate` is the back-pressure on one node's requests
(a full node makes a request wait, bounded, then refuses that request only).
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from chat_server.errors import NodeBusy
from chat_server.redis_nodes import (
    NODE_TRANSITIONS,
    NodeEvent,
    NodeGate,
    NodeHealth,
    NodeState,
    online_replicas,
)


def test_every_state_and_event_has_a_transition():
    assert set(NODE_TRANSITIONS) == set(itertools.product(NodeState, NodeEvent))


def test_one_nodes_trouble_is_that_nodes_alone():
    health = NodeHealth()
    assert health.event("a:1", NodeEvent.FAILED) == (NodeState.OK, NodeState.UNREACHABLE)
    assert health.event("b:1", NodeEvent.SHORT) == (NodeState.OK, NodeState.SHORT)
    assert not health.takes_sends("a:1") and not health.takes_reads("a:1")
    assert not health.takes_sends("b:1") and health.takes_reads("b:1")  # short: reads go on
    assert health.takes_sends("c:1") and health.takes_reads("c:1")  # never heard of: OK
    assert not health.takes_sends("")  # no node serves the slot (a failover under way)
    assert (health.count(NodeState.SHORT), health.count(NodeState.UNREACHABLE)) == (1, 1)
    # reachable again but still short, then healthy
    assert health.event("a:1", NodeEvent.SHORT) == (NodeState.UNREACHABLE, NodeState.SHORT)
    assert health.event("a:1", NodeEvent.HEALTHY) == (NodeState.SHORT, NodeState.OK)
    assert health.troubled() == {"b:1": NodeState.SHORT}


def test_online_replicas_counts_only_replicas_online():
    info = {
        "role": "master",
        "connected_slaves": 2,
        "slave0": {"ip": "127.0.0.1", "port": 7001, "state": "online", "lag": 0},
        "slave1": {"ip": "127.0.0.1", "port": 7002, "state": "wait_bgsave", "lag": 0},
        "master_repl_offset": 10,
    }
    assert online_replicas(info) == 1
    assert online_replicas({"role": "master", "connected_slaves": 0}) == 0


async def test_a_full_gate_refuses_the_request_that_waited_too_long_and_serves_the_next():
    gate = NodeGate("a:1", limit=2, wait_s=0.2)
    release = asyncio.Event()

    async def hold() -> None:
        async with gate.turn():
            await release.wait()

    holders = [asyncio.ensure_future(hold()) for _ in range(2)]
    await asyncio.sleep(0)
    assert gate.in_flight == 2
    with pytest.raises(NodeBusy, match="REDIS_NODE_CONNECTIONS"):
        async with gate.turn():
            pass
    assert gate.refused == 1
    # a request that arrives while the node is full waits its turn and is served
    waiting = asyncio.ensure_future(hold())
    release.set()
    await asyncio.wait_for(asyncio.gather(*holders, waiting), 5)
    assert (gate.in_flight, gate.refused) == (0, 1)
