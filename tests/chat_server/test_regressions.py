"""REGRESSION modes: each deliberate mistake is loud at start and still speaks the protocol."""

from __future__ import annotations

import pytest

from chat_server.messages import Ack, Message, Presence, Welcome
from tests.support import Client, KeyPair, ServerProcess


async def _chat_works(server: ServerProcess, keys: KeyPair, compression: str | None = None) -> None:
    alice = await Client.connect(server, keys.mint("alice"), compression=compression)
    bob = await Client.connect(server, keys.mint("bob"), compression=compression)
    for client in (alice, bob):
        await client.expect(Welcome)
        await client.join("reg")
    await alice.expect(Presence)
    for i in range(20):
        await alice.say("reg", f"m{i}")
    seqs = [(await bob.expect(Message)).seq for _ in range(20)]
    assert seqs == list(range(1, 21))
    for _ in range(20):
        await alice.expect(Ack, skip=(Message,))
    await alice.close()
    await bob.close()


@pytest.mark.parametrize(
    "mode", ["commit_per_message", "encode_per_recipient", "blocking_loop", "cpu_per_send"]
)
async def test_regression_is_loud_and_the_protocol_holds(start_server, keys: KeyPair, mode: str):
    # the load shedder off: cpu_per_send's 20 sends read in one iteration hold the loop
    # 20 ms, and the shedder refusing the last of them would be right, not the protocol
    # failing (test_overload.py has that side); this test is about the protocol holding
    server = start_server(
        event_loop="asyncio",
        regression=mode,
        rate_limit_per_s=1000,
        rate_limit_burst=1000,
        overload_lag_ms=0,
    )
    await _chat_works(server, keys)
    assert f"REGRESSION={mode} is ON" in server.log()
    if mode == "commit_per_message":
        assert server.stats()["store"]["max_batch_size"] == 1


async def test_deflate_max_window_negotiates_the_largest_window(start_server, keys: KeyPair):
    # permessage-deflate is websockets' only (picows has none: refused at start)
    frugal = start_server(event_loop="asyncio", ws_deflate="on", transport="websockets")
    greedy = start_server(
        event_loop="asyncio",
        ws_deflate="on",
        regression="deflate_max_window",
        transport="websockets",
    )
    headers = {}
    for name, server in (("frugal", frugal), ("greedy", greedy)):
        client = await Client.connect(server, keys.mint("alice"), compression="deflate")
        headers[name] = client.conn.response.headers["Sec-WebSocket-Extensions"]
        await client.close()
    assert "server_max_window_bits=12" in headers["frugal"]
    assert "server_max_window_bits=12" not in headers["greedy"]
    assert "permessage-deflate" in headers["greedy"]
    await _chat_works(greedy, keys, compression="deflate")
