"""METRICS_PORT: the server's own view in Prometheus text, consistent with what clients saw."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from chat_server.messages import Ack, Error, Message, Presence, Send, Welcome
from tests.support import Client, KeyPair, free_port


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


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

    samples = _scrape(metrics_port)
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
    assert samples["chat_outbound_buffer_bytes"] >= 0
    await alice.close()
    await bob.close()
