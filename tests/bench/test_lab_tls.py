"""The lab over TLS: the ``tls`` matrix's shape run tiny end to end (plain, TLS in the server,
HAProxy terminating TLS in front of a plain server, with a throwaway certificate the lab
makes), and what the report says of the costs, from figures stated by hand.

The end-to-end run is tiny (20 connections, 100 sends/s, no climb): it measures nothing
against a bound, only that every configuration ran over its own path, that plain and TLS
in the server took their cost steps in the paired phase (the paired driver over wss://,
verified with the lab's CA) while the proxy's stayed in its runs, and that the figures
exist where the report says (the knees' sentence is checked with figures by hand).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.lab.matrix import MatrixError, load_matrix
from bench.lab.results import Knee, Results, Run, Step
from bench.lab.tls_costs import tls_costs, tls_findings
from chatlab.harness import ROOT

TINY_TLS_MATRIX = """
description = "the tls matrix's shape, tiny"
baseline = "plain"

[load]
connections = 20
room_size = 10
rates = [100]
cost_rates = [100]
cost_step_s = 1
pairs = 5
step_s = 1
warmup_s = 0.5
drain_s = 0.3
settle_s = 0.2
locust_profile = ""

[[config]]
name = "plain"
env = { SERIALIZER = "orjson", EVENT_LOOP = "uvloop", WS_DEFLATE = "off" }

[[config]]
name = "TLS in the server"
env = { SERIALIZER = "orjson", EVENT_LOOP = "uvloop", WS_DEFLATE = "off" }
tls = "server"

[[config]]
name = "TLS at HAProxy"
env = { SERIALIZER = "orjson", EVENT_LOOP = "uvloop", WS_DEFLATE = "off" }
tls = "proxy"
"""


def test_the_tls_matrix_shape_runs_each_path_and_reports_server_and_proxy_cpu_per_frame(
    tmp_path: Path,
) -> None:
    matrix = tmp_path / "tls.toml"
    matrix.write_text(TINY_TLS_MATRIX)
    out = tmp_path / "report"
    args = ["run", "--matrix", str(matrix), "--out", str(out), "--quiet", "--wait-quiet-s", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.lab", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = Results.load(out / "results.json")
    runs = {run.config: run for run in results.runs}
    assert all(run.status == "ok" for run in runs.values()), [r.error for r in runs.values()]
    assert [runs[n].tls for n in ("plain", "TLS in the server", "TLS at HAProxy")] == [
        "off",
        "server",
        "proxy",
    ]
    # plain and TLS in the server share the server's core in the paired phase: their cost
    # steps come from its five rounds, A B B A, none from their runs; the proxy's stay
    paired = {run.config: run for run in results.paired}
    assert set(paired) == {"plain", "TLS in the server"}, list(paired)
    assert [paired[n].tls for n in ("plain", "TLS in the server")] == ["off", "server"]
    for name in ("plain", "TLS in the server"):
        assert paired[name].status == "ok", paired[name].error
        assert sorted(s.pair_round for s in paired[name].steps if s.cost) == list(range(5))
        assert not any(s.cost for s in runs[name].steps)
    assert (out / "runs" / "paired" / "spec.json").read_text().count("wss://") == 1
    for run in [*paired.values(), runs["TLS at HAProxy"]]:
        for cost in (s for s in run.steps if s.cost):
            assert cost.delivered == cost.sent * 10, cost  # every member got every message
            assert cost.server_us_per_frame is not None and cost.server_us_per_frame > 0
    # the proxy's own CPU, read apart from the server's, only where there is a proxy
    proxied = next(s for s in runs["TLS at HAProxy"].steps if s.cost)
    assert proxied.proxy_us_per_frame is not None and proxied.proxy_us_per_frame > 0
    assert runs["TLS at HAProxy"].samples["proxy"]
    for name in ("plain", "TLS in the server"):
        assert all(s.proxy_cpu_s is None for s in [*runs[name].steps, *paired[name].steps])
        assert "proxy" not in runs[name].samples
    # each path really was what its name says: the lab's CA, the server's TLS, HAProxy's
    assert (out / "tls" / "ca.pem").exists()
    server_dirs = {p.name for p in (out / "runs").iterdir()}
    assert any((out / "runs" / d / "haproxy.cfg").exists() for d in server_dirs)
    md = (out / "report.md").read_text()
    section = md.split("## What TLS costs per delivered frame", 1)[1].split("\n## ")[0]
    for name in runs:
        assert f"| {name} |" in section
    assert "At 100 sent/s (1,000 delivered/s): plain " in section
    assert "HAProxy" in section and "cheaper" in section


def _run(config: str, tls: str, server_us: float, proxy_us: float | None, knee: float) -> Run:
    delivered = 10_000
    step = Step(
        driver="fast",
        name="cost 1000/s",
        connections=2000,
        offered_per_s=1000.0,
        duration_s=1.0,
        sent=1000,
        delivered=delivered,
        expected=delivered,
        sent_per_s=1000.0,
        delivered_per_s=float(delivered),
        latency_ms={"p99": 5.0},
        cost=True,
        window_s=1.0,
        server_cpu_s=server_us * delivered / 1e6,
        proxy_cpu_s=None if proxy_us is None else proxy_us * delivered / 1e6,
    )
    run = Run(config=config, repeat=0, target="chat", env={}, steps=[step], tls=tls)
    run.knee = Knee(config=config, capacity_delivered_per_s=knee)
    return run


def test_the_findings_say_what_tls_costs_in_the_server_and_at_the_proxy() -> None:
    results = Results(
        matrix="tls",
        started="",
        command="",
        baseline="plain",
        aa_pair=[],
        repeat=1,
        machine={},
        configs={"plain": {}, "in server": {}, "at proxy": {}},
    )
    results.runs = [
        _run("plain", "off", 10.0, None, 80_000),
        _run("in server", "server", 13.0, None, 60_000),
        _run("at proxy", "proxy", 10.5, 6.0, 40_000),
    ]
    costs = tls_costs(results)
    assert [(c.config, c.server, c.proxy) for c in costs] == [
        ("plain", 10.0, None),
        ("in server", 13.0, None),
        ("at proxy", 10.5, 6.0),
    ]
    text = " ".join(tls_findings(costs, "plain"))
    assert "plain 10.0 µs of server CPU per delivered frame" in text
    assert "TLS in the server (in server) 13.0 (+3.0 µs" in text
    assert "the server 10.5 and HAProxy 6.0, together 16.5 (+6.5 µs" in text
    assert "3.0 µs per delivered frame paid in the server and 6.5 µs paid at HAProxy" in text
    assert "cheaper in the server" in text
    assert "TLS at HAProxy (at proxy) 40,000 (\u00d70.50)" in text


def test_tls_belongs_to_chat_configurations_and_names_a_known_place(tmp_path: Path) -> None:
    assert {c.tls for c in load_matrix("tls").configs} == {"off", "server", "proxy"}
    bad = tmp_path / "bad.toml"
    for table in ('tls = "edge"', 'target = "relay"\ntls = "server"'):
        bad.write_text(f'[[config]]\nname = "x"\n{table}\n')
        with pytest.raises(MatrixError, match="tls"):
            load_matrix(str(bad))


def test_the_tls_matrix_pairs_plain_and_tls_in_the_server_within_its_announced_time() -> None:
    matrix = load_matrix("tls")
    # plain, TLS in the server and the A/A twin share the server's core in the paired
    # phase, five rounds at least; behind the proxy the cost steps stay in its runs
    assert matrix.load.pairs >= 5
    assert {c.tls for c in matrix.paired()} == {"off", "server"}
    assert {c.name for c in matrix.paired()} == {c.name for c in matrix.configs if c.tls != "proxy"}
    proxied = next(c for c in matrix.configs if c.tls == "proxy")
    assert matrix.load_of(proxied).cost_rates == matrix.load.cost_rates
    assert all(matrix.load_of(c).cost_rates == () for c in matrix.paired())
    assert matrix.estimate_s(matrix.repeat) <= 8 * 60
