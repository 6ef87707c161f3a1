"""Behind a proxy: client addresses from ``X-Forwarded-For`` of a ``TRUSTED_PROXIES`` peer,
``MAX_CONNECTIONS_PER_ADDRESS`` counted per real client, and a drain that answers
``/healthz`` 503 before its listener closes (on real server processes)."""

from __future__ import annotations

import asyncio
import signal

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from chat_server.messages import Ack, Message, Welcome
from chatlab.harness import free_port, http_request
from tests.support import (
    Client,
    KeyPair,
    ServerProcess,
    raw_upgrade,
    served,
    stored_history,
    wait_until,
)
from tests.support.prometheus import scrape_metrics

#: two clients behind the proxy (documentation addresses, RFC 5737)
OFFICE = {"X-Forwarded-For": "203.0.113.7"}
HOME = {"X-Forwarded-For": "198.51.100.9"}


async def _refused_503(server: ServerProcess, token: str, headers: dict[str, str]) -> bytes:
    with pytest.raises(InvalidStatus) as refused:
        await Client.connect(server, token, headers=headers)
    assert refused.value.response.status_code == 503
    return refused.value.response.body


@pytest.mark.transports
async def test_an_address_at_its_bound_gets_503_while_another_behind_the_proxy_is_served(
    start_server, keys: KeyPair
):
    # the tests' connections all come from 127.0.0.1: listed as the proxy, it names others
    metrics_port = free_port()
    server = start_server(
        event_loop="asyncio",
        max_connections_per_address=2,
        trusted_proxies="127.0.0.1",
        metrics_port=metrics_port,
    )
    clean = await Client.connect(server, keys.mint("office1"), headers=OFFICE)
    await clean.expect(Welcome)
    _, dropped = await raw_upgrade(server, keys.mint("office2"), headers=OFFICE)

    body = await _refused_503(server, keys.mint("office3"), OFFICE)
    assert b"MAX_CONNECTIONS_PER_ADDRESS" in body
    # a chain: the right-most address not a listed proxy is the client (the office again)
    await _refused_503(server, keys.mint("office3"), {"X-Forwarded-For": "203.0.113.7, 127.0.0.1"})
    # meanwhile another client behind the proxy, and the proxy's own address, are served
    await served(server, keys.mint("home"), headers=HOME)
    await served(server, keys.mint("proxy"))
    assert server.stats()["address_refusals"] == 2
    assert scrape_metrics(metrics_port)["chat_address_refusals_total"] == 2

    # each way out frees a place: a closing handshake, and a connection that just drops
    await clean.close()
    dropped.transport.abort()
    again = []

    async def admitted() -> bool:
        try:
            client = await Client.connect(server, keys.mint("office4"), headers=OFFICE)
        except InvalidStatus as refused:
            assert refused.response.status_code == 503
            return False
        await client.expect(Welcome)
        again.append(client)
        return len(again) == 2

    await wait_until(admitted, 10, "the office's two places given back")
    await _refused_503(server, keys.mint("office5"), OFFICE)


async def test_sigterm_answers_healthz_503_before_the_listener_closes(start_server, keys: KeyPair):
    server = start_server(event_loop="asyncio", drain_notice_s=3, drain_grace_s=0.2)
    healthz = server.http_url("/healthz")
    assert http_request("GET", healthz).status == 200
    alice = await Client.connect(server, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.join("notice")
    await alice.say("notice", "before", ref="before")
    acked = [(await alice.expect(Ack, skip=(Message,))).seq]

    server.signal(signal.SIGTERM)
    draining = await wait_until(
        lambda: (reply := http_request("GET", healthz, timeout_s=5)).status == 503 and reply,
        10,
        server.log,
    )
    assert b"draining" in draining.body
    # the listener still accepts, and serves in full, until the notice is over
    assert "refusing sends" not in server.log()
    bob = await Client.connect(server, keys.mint("bob"))
    await bob.expect(Welcome)
    await bob.join("notice")
    await bob.say("notice", "during the notice", ref="during")
    acked.append((await bob.expect(Ack, skip=(Message,))).seq)

    codes = []
    for client in (alice, bob):
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await client.recv(timeout_s=20)
        codes.append(closed.value.rcvd.code if closed.value.rcvd else None)
    assert codes == [1001, 1001]
    assert await asyncio.to_thread(server.wait) == 0
    with pytest.raises(OSError):  # the listener is closed with the process
        http_request("GET", healthz, timeout_s=5)

    restarted = start_server(workdir=server.workdir, event_loop="asyncio")
    stored = await stored_history(restarted, keys.mint("reader"), "notice")
    assert set(acked) <= {m.seq for m in stored}
