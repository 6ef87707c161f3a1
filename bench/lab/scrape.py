"""Reading a server's own Prometheus metrics (``/metrics`` on its metrics port)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape_metrics(port: int, buckets: bool = False) -> dict[str, float]:
    """The server's Prometheus metrics as ``name{labels}: value`` (bucket lines left out
    unless ``buckets``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    flat: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created") or (
                sample.name.endswith("_bucket") and not buckets
            ):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            flat[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return flat
