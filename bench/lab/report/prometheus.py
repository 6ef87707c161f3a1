"""Prometheus text samples (as the runner scrapes them) folded into one report cell each."""

from __future__ import annotations

import math
import re

from bench.lab.report.formatting import counter_text, num

_SERIES = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?$")
# label values quoted (Prometheus text) or bare (the runner's scrape_metrics)
_LABEL = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|([^,]*))')


def metric_cells(metrics: dict[str, float]) -> dict[str, str]:
    """Prometheus samples (``name{labels}`` -> value) folded into one cell per family:
    counters and gauges as numbers, labelled series as "label count, ...", histograms as
    count and mean (and the bucket bounds holding p50 and p99 when buckets are there)."""
    plain: dict[str, float] = {}
    labelled: dict[str, list[tuple[str, float]]] = {}
    buckets: dict[str, list[tuple[float, float]]] = {}
    for series, value in metrics.items():
        match = _SERIES.match(series.strip())
        if match is None:
            plain[series] = value
            continue
        name = match["name"]
        labels = {k: quoted or bare for k, quoted, bare in _LABEL.findall(match["labels"] or "")}
        if name.endswith("_bucket") and "le" in labels:
            bound = math.inf if labels["le"] in ("+Inf", "inf") else float(labels["le"])
            buckets.setdefault(name.removesuffix("_bucket"), []).append((bound, value))
        elif labels:
            text = ",".join(v if len(labels) == 1 else f"{k}={v}" for k, v in labels.items())
            labelled.setdefault(name.removesuffix("_total"), []).append((text, value))
        elif not name.endswith("_created"):
            plain[name] = value
    histograms = set(buckets) | {
        n.removesuffix("_count")
        for n in plain
        if n.endswith("_count") and f"{n.removesuffix('_count')}_sum" in plain
    }
    cells: dict[str, str] = {}
    for base in histograms:
        bounds = sorted(buckets.get(base, []))
        count = plain.pop(f"{base}_count", None)
        total = plain.pop(f"{base}_sum", None)
        if count is None:
            count = bounds[-1][1] if bounds else 0.0
        unit = " ms" if base.endswith("_ms") else ""
        parts = [f"n {counter_text(count)}"]
        if count and total is not None:
            parts.append(f"mean {num(total / count)}{unit}")
        for q in (0.5, 0.99):
            bound = next((b for b, c in bounds if count and c >= q * count), None)
            if bound is None:
                continue
            if math.isinf(bound):
                text = f"> {num(bounds[-2][0])}" if len(bounds) > 1 else "unknown"
            else:
                text = f"\u2264 {num(bound)}"
            parts.append(f"p{round(q * 100)} {text}{unit}")
        cells[base] = ", ".join(parts)
    for base, items in labelled.items():
        cells[base] = ", ".join(f"{k} {counter_text(v)}" for k, v in sorted(items))
    for name, value in plain.items():
        cells[name.removesuffix("_total")] = counter_text(value)
    return dict(sorted(cells.items()))
