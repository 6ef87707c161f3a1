"""What TLS costs per delivered frame, and where it is cheaper to pay it: each configuration's
cost steps (the server's CPU µs per delivered frame and, behind a proxy, the proxy's) and
knees, gathered from a lab run's Results, and the sentences the report says of them. No I/O.

A configuration's TLS is where its runs say (:attr:`~bench.lab.results.Run.tls`): ``off``,
``server`` (the server encrypts every frame on its own thread) or ``proxy`` (HAProxy
terminates TLS, the hop to the server plain). Figures are medians over the repeats, or
over the rounds of the paired cost phase where a configuration's cost steps were taken
there (``Results.paired``: plain and TLS in the server; the verdicts with their floor
are the ladder's).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench.lab.ladder import TIMES
from bench.lab.results import Results

#: what each TLS mode is called in the report
TLS_LABELS = {"off": "plain", "server": "TLS in the server", "proxy": "TLS at HAProxy"}


def _named(label: str, config: str) -> str:
    """``label (config)``, or the configuration's name alone where it starts with the label."""
    return config if config.startswith(label) else f"{label} ({config})"


@dataclass
class TlsCost:
    """One configuration at one cost rate: per repeat, the server's and the proxy's CPU
    µs per delivered frame; and the configuration's knees (delivered/s), per repeat."""

    config: str
    tls: str
    rate: float  # offered sends/s of the cost step
    room_size: int
    server_us: list[float] = field(default_factory=list)
    proxy_us: list[float] = field(default_factory=list)
    knees: list[float] = field(default_factory=list)

    @property
    def server(self) -> float | None:
        """The server's µs per delivered frame (median over repeats)."""
        return statistics.median(self.server_us) if self.server_us else None

    @property
    def proxy(self) -> float | None:
        """The proxy's µs per delivered frame (median; None: no proxy)."""
        return statistics.median(self.proxy_us) if self.proxy_us else None

    @property
    def total(self) -> float | None:
        """Server and proxy together, µs per delivered frame."""
        if self.server is None:
            return None
        return self.server + (self.proxy or 0.0)

    @property
    def knee(self) -> float | None:
        """The knee, delivered/s (median; None: no climb)."""
        return statistics.median(self.knees) if self.knees else None


def has_tls(results: Results) -> bool:
    """Whether any run of ``results`` spoke TLS (the report then has a TLS section)."""
    return any(run.tls != "off" for run in results.runs)


def tls_costs(results: Results) -> list[TlsCost]:
    """Every chat configuration's cost steps, by configuration (matrix order) then rate."""
    found: dict[tuple[str, float], TlsCost] = {}
    knees: dict[str, list[float]] = {}
    for run in [*results.paired, *results.runs]:
        if run.target != "chat" or run.status != "ok":
            continue
        if run.knee is not None and run.knee.capacity_delivered_per_s:
            knees.setdefault(run.config, []).append(run.knee.capacity_delivered_per_s)
        for step in run.steps:
            if not step.cost or step.offered_per_s is None or step.server_us_per_frame is None:
                continue
            room_size = step.expected // step.sent if step.sent else 0
            row = found.setdefault(
                (run.config, step.offered_per_s),
                TlsCost(run.config, run.tls, step.offered_per_s, room_size),
            )
            row.server_us.append(step.server_us_per_frame)
            if step.proxy_us_per_frame is not None:
                row.proxy_us.append(step.proxy_us_per_frame)
    order = {name: i for i, name in enumerate(results.configs)}
    rows = sorted(found.values(), key=lambda r: (order.get(r.config, len(order)), r.rate))
    for row in rows:
        row.knees = knees.get(row.config, [])
    return rows


def tls_findings(rows: list[TlsCost], baseline: str = "") -> list[str]:
    """What TLS costs per delivered frame at each cost rate, against the plain
    configuration (``baseline`` where it is plain, else the first plain one), in the
    server and behind the proxy, which of the two is cheaper per frame, and the knees."""
    sentences = []
    for rate in sorted({r.rate for r in rows}):
        at = [r for r in rows if r.rate == rate]
        plain = next((r for r in at if r.tls == "off" and r.config == baseline), None)
        plain = plain or next((r for r in at if r.tls == "off"), None)
        if plain is None or not plain.server:
            continue
        base = plain.server
        delivered = f"{rate * (plain.room_size or 1):,.0f} delivered/s"
        parts = [f"plain {base:.1f} µs of server CPU per delivered frame"]
        extra: dict[str, float] = {}
        for row in at:
            if row.tls == "server" and row.server is not None:
                extra["server"] = row.server - base
                parts.append(
                    f"{_named('TLS in the server', row.config)} {row.server:.1f} "
                    f"({row.server - base:+.1f} µs, {TIMES}{row.server / base:.2f})"
                )
            elif row.tls == "proxy" and row.total is not None:
                extra["proxy"] = row.total - base
                parts.append(
                    f"{_named('TLS at HAProxy', row.config)}: the server {row.server:.1f} "
                    f"and HAProxy {row.proxy or 0.0:.1f}, together {row.total:.1f} "
                    f"({row.total - base:+.1f} µs, {TIMES}{row.total / base:.2f})"
                )
        sentences.append(f"At {rate:,.0f} sent/s ({delivered}): {'; '.join(parts)}.")
        if "server" in extra and "proxy" in extra:
            cheaper = "in the server" if extra["server"] <= extra["proxy"] else "at HAProxy"
            sentences.append(
                f"At {rate:,.0f} sent/s, TLS costs {extra['server']:.1f} µs per delivered "
                f"frame paid in the server and {extra['proxy']:.1f} µs paid at HAProxy (its "
                f"relaying included): cheaper {cheaper} in CPU. HAProxy's share runs in "
                "another process, which another core or machine can take: the server's own "
                "core then spends only what the plain hop costs it."
            )
    knees = {}
    for row in rows:
        if row.knee is not None and row.config not in knees:
            knees[row.config] = (row.tls, row.knee)
    plain_knee = next((k for tls, k in knees.values() if tls == "off"), None)
    if len(knees) > 1 and plain_knee:
        parts = [
            f"{_named(TLS_LABELS.get(tls, tls), name)} {knee:,.0f} ({TIMES}{knee / plain_knee:.2f})"
            for name, (tls, knee) in knees.items()
        ]
        sentences.append(
            "Knees, delivered/s with fan-out p99 under the climb's SLO (medians; HAProxy on "
            f"the server's core): {'; '.join(parts)}."
        )
    return sentences
