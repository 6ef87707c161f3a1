"""A Locust run as the lab's :class:`Step`: read from the delivery report and the CSV
files ``loadtest/chat.py`` writes (Locust runs as a subprocess: its gevent patching
breaks asyncio)."""

from __future__ import annotations

import csv
import json
from contextlib import suppress
from pathlib import Path

from bench.lab.results import PERCENTILES, Step, TimePoint


def locust_step(workdir: Path, duration_s: float, room_size: int) -> Step:
    """A Locust run's :class:`Step` from its delivery report and CSV files in ``workdir``."""
    report = json.loads((workdir / "delivery.json").read_text())
    deliveries = report["deliveries"]
    fanout = report["fanout"]
    stats: dict[str, dict[str, str]] = {}
    with suppress(OSError), open(workdir / "locust_stats.csv", newline="") as f:
        stats = {row["Name"]: row for row in csv.DictReader(f)}
    row = stats.get("fanout", {})

    def number(key: str, default: float = 0.0) -> float:
        with suppress(ValueError, TypeError):
            return float(row.get(key, default))
        return default

    latency = {
        "p50": float(fanout.get("p50_ms") or 0),
        "p90": float(fanout.get("p90_ms") or 0),
        "p95": float(fanout.get("p95_ms") or 0),
        "p99": float(fanout.get("p99_ms") or 0),
        "p999": number("99.9%"),
        "max": number("Max Response Time"),
    }
    timeline: list[TimePoint] = []
    with suppress(OSError), open(workdir / "locust_stats_history.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Name"] == "fanout"]
    if rows:
        t0 = float(rows[0]["Timestamp"])
        for r in rows:
            with suppress(ValueError):
                timeline.append(
                    TimePoint(
                        t_s=float(r["Timestamp"]) - t0,
                        users=int(r["User Count"]),
                        delivered_per_s=float(r["Requests/s"]),
                        sent_per_s=float(r["Requests/s"]) / room_size,
                        p50_ms=float(r["50%"]) if r["50%"] not in ("", "N/A") else None,
                        p99_ms=float(r["99%"]) if r["99%"] not in ("", "N/A") else None,
                    )
                )
    generator = report.get("generator", {})
    notes = []
    if generator.get("overloaded"):
        notes.append(
            f"Locust overloaded: {generator.get('late_sends', 0)} sends late, "
            f"max {generator.get('max_lateness_ms', 0):.0f} ms behind"
        )
    if generator.get("cpu_max_percent", 0) > 90:
        notes.append(f"Locust CPU reached {generator['cpu_max_percent']:.0f}%")
    sent = int(deliveries.get("sent", 0))
    delivered = int(deliveries.get("delivered", 0))
    errors = {
        k: int(deliveries.get(k, 0))
        for k in ("server_errors", "unexpected_closes", "duplicates", "missing", "unacked")
        if deliveries.get(k)
    }
    return Step(
        driver="locust",
        name=str(report.get("stages") or "profile"),  # the driver is named apart
        connections=max((p.users for p in timeline), default=0),
        offered_per_s=None,
        duration_s=duration_s,
        sent=sent,
        delivered=delivered,
        expected=delivered + int(deliveries.get("missing", 0)),
        sent_per_s=sent / duration_s if duration_s else 0.0,
        delivered_per_s=delivered / duration_s if duration_s else 0.0,
        latency_ms={k: latency.get(k, 0.0) for k in PERCENTILES},
        errors=sum(v for k, v in errors.items() if k != "unacked"),
        error_detail=errors,
        late_sends=int(generator.get("late_sends", 0)),
        max_send_lag_ms=float(generator.get("max_lateness_ms", 0)),
        generator_cpu_percent=float(generator.get("cpu_max_percent", 0)) or None,
        generator_limited=bool(notes),
        generator_notes=notes,
        timeline=timeline,
    )
