"""The report's section on TLS: CPU per delivered frame in the server and at the proxy,
with and without TLS, and the knees (:mod:`bench.lab.tls_costs`)."""

from __future__ import annotations

from bench.lab.ladder import delivered_label
from bench.lab.report.formatting import DASH, EMPTY
from bench.lab.report.model import Block, Heading, Para, Table
from bench.lab.results import Results
from bench.lab.tls_costs import TLS_LABELS, TlsCost, has_tls, tls_costs, tls_findings


def _us(values: list[float], median: float | None) -> str:
    if median is None:
        return EMPTY
    if len(values) < 2:
        return f"{median:.1f}"
    return f"{median:.1f} ({min(values):.1f}{DASH}{max(values):.1f})"


def _row(cost: TlsCost) -> list[str]:
    return [
        cost.config,
        TLS_LABELS.get(cost.tls, cost.tls),
        delivered_label(cost.rate, cost.room_size),
        _us(cost.server_us, cost.server),
        _us(cost.proxy_us, cost.proxy),
        f"{cost.total:.1f}" if cost.total is not None else EMPTY,
        f"{cost.knee:,.0f}" if cost.knee is not None else EMPTY,
    ]


def tls_blocks(results: Results) -> list[Block]:
    """The TLS section (nothing when no run spoke TLS)."""
    if not has_tls(results):
        return []
    costs = tls_costs(results)
    blocks: list[Block] = [
        Heading(2, "What TLS costs per delivered frame"),
        Para(
            "The server's CPU µs per delivered frame at each cost rate, read from its threads' "
            "counters over the step's send phase; behind HAProxy also HAProxy's own process "
            "CPU over the same window, apart (the hop from HAProxy to the server is plain). "
            "Medians over repeats with (min-max); the knee is the climb's, delivered/s."
        ),
    ]
    if not costs:
        blocks.append(Para("No cost step measured a server's CPU: nothing to compare."))
        return blocks
    blocks.append(
        Table(
            [
                "configuration",
                "TLS",
                "at",
                "server µs/frame",
                "proxy µs/frame",
                "together µs/frame",
                "knee delivered/s",
            ],
            [_row(c) for c in costs],
        )
    )
    sentences = tls_findings(costs, results.baseline)
    blocks += [Para(text) for text in sentences]
    return blocks
