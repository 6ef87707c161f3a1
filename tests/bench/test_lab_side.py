"""Bytes on the wire and memory per connection in the lab's report: beside each
configuration's CPU per frame and knee, how deflate was negotiated, and which
configurations get no side measurement and why. (The measurement itself runs for real in
tests/bench/test_lab.py's tiny matrix.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.lab.ladder import deflate_label
from bench.lab.matrix import Config
from bench.lab.report import write_report
from bench.lab.results import Results, Run, Step, edge
from bench.lab.side import side_skipped

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TIMES, DASH = "\u00d7", "\u2013"
SLO = {"p99": 100.0}
ON_REPLY = "permessage-deflate; server_max_window_bits=12; client_max_window_bits=12"
SHARED_REPLY = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
#: configuration -> (WS_DEFLATE, the server's reply, driver bytes/message, µs/frame per repeat)
CONFIGS = {
    "off": ("off", "", 112.0, (10.0, 11.0)),
    "on": ("on", ON_REPLY, 40.0, (20.0, 22.0)),
    "shared": ("shared", SHARED_REPLY, 97.0, (12.0, 12.5)),
    "two workers": ("off", "", 112.0, (10.0, 10.0)),
}
#: bench.wire's rows per configuration: body set -> (wire, plain) bytes per delivery
WIRE = {
    "off": {"demo": (112.0, 112.0), "chat": (135.0, 135.0), "long": (787.0, 787.0)},
    "on": {"demo": (40.0, 112.0), "chat": (60.0, 135.0), "long": (300.0, 787.0)},
    "shared": {"demo": (97.0, 112.0), "chat": (110.0, 135.0), "long": (425.0, 787.0)},
}
#: bench.memory per configuration: traffic -> KiB per connection in repeat 1 and 2
MEMORY = {
    "off": {"idle": (9.4, 9.6), "after": (10.3, 10.3)},
    "on": {"idle": (43.0, 43.0), "after": (52.0, 52.0)},
    "shared": {"idle": (9.6, 9.6), "after": (16.0, 16.2)},
}


def _step(rate: float, p99: float, config: str, repeat: int, *, cost: bool = False) -> Step:
    deflate, reply, wire, us = CONFIGS[config]
    delivered = int(rate * 10 * 2)
    return Step(
        driver="fast",
        name=f"{'cost' if cost else 'rate'} {rate:g}/s",
        connections=2000,
        offered_per_s=rate,
        duration_s=2,
        sent=int(rate * 2),
        delivered=delivered,
        expected=delivered,
        sent_per_s=rate,
        delivered_per_s=rate * 10,
        latency_ms={"p50": 1, "p90": 2, "p95": 3, "p99": p99, "p999": p99, "max": p99},
        body_chars=23,
        frame_bytes=63,
        deflate=deflate != "off",
        deflate_params=reply,
        cost=cost,
        window_s=2.0,
        server_cpu_s=us[repeat] * delivered / 1e6,
        others_cpu_s=0.0,
        steal_s=0.0,
        wire_bytes=int(wire * delivered),
        wire_deliveries=delivered,
    )


def _results() -> Results:
    results = Results(
        matrix="deflate",
        started="2026-11-27T01:00:00",
        command="python -m bench.lab run --matrix deflate",
        baseline="off",
        aa_pair=[],
        repeat=2,
        configs={name: {"target": "chat"} for name in CONFIGS},
    )
    for repeat in range(2):
        for name, (deflate, *_) in CONFIGS.items():
            steps = [
                _step(5000, 5, name, repeat, cost=True),
                _step(8000, 20, name, repeat),
                _step(16000, 400, name, repeat),
            ]
            run = Run(name, repeat, "chat", {"WS_DEFLATE": deflate}, steps=steps)
            run.knee = edge(run, SLO, 10)
            if name == "two workers":
                run.side_skipped = "WORKERS > 1: bench.memory reads one process' memory"
            else:
                run.wire = [
                    {
                        "bodies": kind,
                        "body_chars_mean": {"demo": 23, "chat": 49.6, "long": 701}[kind],
                        "negotiated": CONFIGS[name][1],
                        "wire_bytes_per_delivery": wire,
                        "plain_bytes_per_delivery": plain,
                    }
                    for kind, (wire, plain) in WIRE[name].items()
                ]
                run.memory = [
                    {
                        "traffic": traffic,
                        "connections": 10000,
                        "bytes_per_connection": kib[repeat] * 1024,
                    }
                    for traffic, kib in MEMORY[name].items()
                ]
            results.runs.append(run)
    return results


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("side-report")
    md_path, _ = write_report(_results(), out)
    return out, md_path.read_text()


def _section(md: str, heading: str) -> str:
    return md.split(heading, 1)[1].split("\n## ", 1)[0]


def _row(section: str, first: str) -> list[str]:
    line = next(x for x in section.splitlines() if x.startswith(f"| {first} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_wire_bytes_and_memory_stand_beside_cpu_per_frame_and_knee(report: tuple[Path, str]):
    out, md = report
    side = _section(md, "## Bytes on the wire and memory per connection")
    header = _row(side, "configuration")
    assert header == [
        "configuration",
        "WS_DEFLATE",
        "µs/frame at 50k delivered/s",
        "knee (delivered/s)",
        "wire bytes/message, demo (23 chars)",
        "wire bytes/message, chat (50 chars)",
        "wire bytes/message, long (701 chars)",
        "KiB/connection, idle",
        "KiB/connection, after traffic",
    ]
    # medians over the repeats, with their range where they differ
    assert _row(side, "shared") == [
        "shared",
        "shared",
        f"12.2 (12.0{DASH}12.5)",
        "80,000",
        f"97.0 ({TIMES}0.87 of plain)",
        f"110.0 ({TIMES}0.81 of plain)",
        f"425.0 ({TIMES}0.54 of plain)",
        "9.6",
        f"16.1 (16.0{DASH}16.2)",
    ]
    assert _row(side, "on")[4:] == [
        f"40.0 ({TIMES}0.36 of plain)",
        f"60.0 ({TIMES}0.44 of plain)",
        f"300.0 ({TIMES}0.38 of plain)",
        "43.0",
        "52.0",
    ]
    assert _row(side, "off")[4] == f"112.0 ({TIMES}1.00 of plain)"
    # a configuration the side measurement cannot mean anything for says why
    assert "not measured: WORKERS > 1" in " ".join(_row(side, "two workers"))
    png = out / "plots" / "side.png"
    assert "plots/side.png" in side and png.read_bytes()[:8] == PNG_SIGNATURE


def test_the_cost_table_carries_the_drivers_own_bytes_per_message(report: tuple[Path, str]):
    _, md = report
    costs = _section(md, "### What a frame costs")
    assert _row(costs, "configuration")[2:4] == ["µs/frame", "wire bytes/message"]
    assert _row(costs, "on")[3] == "40.0" and _row(costs, "shared")[3] == "97.0"


def test_the_shape_table_names_what_each_deflate_rung_negotiated(report: tuple[Path, str]):
    _, md = report
    shapes = md.split("| deflate (the server's reply) |", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"\| shared \|.*\| no context takeover \(shared\) \|", shapes)
    assert re.search(r"\| on \|.*\| context takeover \(on\), window 2\^12 \|", shapes)
    assert re.search(r"\| off \|.*\| off \|", shapes)


@pytest.mark.parametrize(
    ("deflate", "reply", "label"),
    [
        (False, "", "off"),
        (True, ON_REPLY, "context takeover (on), window 2^12"),
        (True, SHARED_REPLY, "no context takeover (shared)"),
        (True, "", "on (negotiated)"),  # results saved before the driver kept the reply
    ],
)
def test_deflate_label_reads_the_servers_reply(deflate: bool, reply: str, label: str):
    assert deflate_label(deflate, reply) == label


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (Config("a", env={"WS_DEFLATE": "shared"}), ""),
        (Config("a", target="relay"), "not a chat server"),
        (Config("a", env={"WORKERS": "2"}), "WORKERS > 1"),
        (Config("a", env={"BROKER": "redis"}), "BROKER=redis"),
    ],
)
def test_side_measurements_run_where_their_figure_means_what_it_says(config: Config, why: str):
    reason = side_skipped(config)
    assert reason.startswith(why) and bool(reason) == bool(why)
