"""The lab runner, end to end: a tiny matrix run for real, and its matrix files and CLI.

The end-to-end run starts the real auth service, real chat servers, the fast driver and
Locust (as subprocesses), and checks the report holds real, non-zero figures. No timing
assertions: only that the figures exist, add up, and are where the report says.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lab.capacity import capacity_plan, edge, parse_slo
from bench.lab.matrix import Config, Matrix, MatrixError, available, load_matrix
from bench.lab.results import Knee, Results, Run, Step
from chatlab.harness import ROOT

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

TINY_MATRIX = """
description = "two configurations, smoke profile"
baseline = "json"

[load]
connections = 20
room_size = 10
rates = [100, 200]
cost_rates = [150]
cost_step_s = 1
step_s = 1.5
warmup_s = 1
drain_s = 0.5
locust_profile = "smoke"
settle_s = 0.2
wire_messages = 2

[[config]]
name = "json"
env = { SERIALIZER = "json", EVENT_LOOP = "asyncio", WS_DEFLATE = "on" }
load = { memory_connections = 20, memory_traffic = ["after"] }

[[config]]
name = "protobuf+uvloop"
env = { SERIALIZER = "protobuf", EVENT_LOOP = "uvloop", WS_DEFLATE = "off" }
locust = false
profile = true
"""


def lab(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m bench.lab ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "bench.lab", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.owns_machine  # a real lab run: it measures under load
def test_a_tiny_matrix_runs_end_to_end_and_reports_real_figures(tmp_path: Path) -> None:
    matrix = tmp_path / "tiny.toml"
    matrix.write_text(TINY_MATRIX)
    out = tmp_path / "report"
    done = lab("run", "--matrix", str(matrix), "--out", str(out), "--quiet", "--wait-quiet-s", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    results = Results.load(out / "results.json")
    assert [r.config for r in results.runs] == ["json", "protobuf+uvloop"]
    assert all(r.status == "ok" for r in results.runs), [r.error for r in results.runs]
    json_run, pb_run = results.runs
    # the cost step, then the fast driver's two steps on both; Locust only where asked
    assert [(s.driver, s.cost) for s in json_run.steps] == [
        ("fast", True),
        ("fast", False),
        ("fast", False),
        ("locust", False),
    ]
    assert [s.name for s in pb_run.steps] == ["cost 150/s", "rate 100/s", "rate 200/s"]
    # a step's name does not repeat its driver's ("locust locust profile smoke")
    assert json_run.steps[-1].name == "profile smoke"
    # every fast step's window read the server's CPU and the machine around it
    for step in [s for s in json_run.steps + pb_run.steps if s.driver == "fast"]:
        assert step.window_s > 0.5 and step.server_cpu_s is not None and step.server_cpu_s > 0
        assert step.server_us_per_frame is not None and step.server_us_per_frame > 0
        assert step.others_cpu_s is not None and step.steal_s is not None
        # the chat server acks every send once: sends from just before a step are acked in
        # it (a fraction of a second's worth on a loaded machine), a doubled ack is 2x
        assert 0.9 * step.sent <= step.acks <= 1.5 * step.sent
    assert all(run.host for run in results.runs)
    for step in json_run.steps + pb_run.steps:
        assert step.sent > 0
        assert step.delivered > 0
        assert step.delivered_per_s > 0
        # Locust keeps times under 100 ms in whole ms: a sub-half-ms median reads 0
        least = 0 if step.driver == "locust" else 1e-9
        assert least <= step.latency_ms["p50"] <= step.latency_ms["p99"] <= step.latency_ms["max"]
        assert step.latency_ms["max"] > 0
    for step in json_run.steps[:3] + pb_run.steps:
        assert step.delivered == step.sent * 10, step  # every member got every message
    # bytes on the wire per delivered message, as the driver read them: plain frames are
    # the message frame (its send frame's body, ids and a header); deflate's are smaller
    # than json's plain frame would be, and the server's reply says context takeover
    for step in pb_run.steps:
        assert step.wire_bytes_per_delivery is not None and not step.deflate_params
        assert step.frame_bytes < step.wire_bytes_per_delivery < step.frame_bytes + 100
    for step in [s for s in json_run.steps if s.driver == "fast"]:
        assert step.deflate and "permessage-deflate" in step.deflate_params
        assert "server_no_context_takeover" not in step.deflate_params
        assert step.wire_bytes_per_delivery is not None and step.wire_bytes_per_delivery > 2
    # the side measurements, each on a server of its own with the configuration's settings
    assert [row["bodies"] for row in json_run.wire] == ["demo", "chat", "long"]
    for row in json_run.wire:  # deflate on: every message compressed smaller than plain
        assert "permessage-deflate" in row["negotiated"]
        assert row["wire_bytes_per_delivery"] < row["plain_bytes_per_delivery"]
    for row in pb_run.wire:  # deflate off, protobuf's binary frames: exactly the plain bytes
        assert row["negotiated"] == ""
        assert row["wire_bytes_per_delivery"] == row["plain_bytes_per_delivery"]
    assert [(m["traffic"], m["connections"]) for m in json_run.memory] == [("after", 20)]
    assert json_run.memory[0]["bytes_per_connection"] > 0 and pb_run.memory == []
    # the samplers saw both processes; the server's own counters were scraped
    for run in results.runs:
        assert run.samples["server"] and run.samples["generator"]
        assert max(s.rss_bytes for s in run.samples["server"]) > 10 * 2**20
        assert sum(s.cpu_percent for s in run.samples["server"]) > 0
        assert run.metrics, "no metrics scraped"
    frames_out = [v for k, v in json_run.metrics.items() if k.startswith("chat_frames_out")]
    assert frames_out and max(frames_out) > 0
    # the profiled configuration's snapshots are in the report directory
    assert pb_run.profiles and all((out / p).exists() for p in pb_run.profiles)
    # the report: tables with the configurations, valid plots, a summary on the terminal
    md = (out / "report.md").read_text()
    assert "json" in md and "protobuf+uvloop" in md
    side = md.split("## Bytes on the wire and memory per connection", 1)[1].split("\n## ")[0]
    assert "| json | on |" in side and "| protobuf+uvloop | off |" in side
    assert "(\u00d71.00 of plain)" in side and "plots/side.png" in side
    pngs = sorted((out / "plots").glob("*.png"))
    assert pngs
    for png in pngs:
        assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert (out / "report.html").read_text().count("data:image/png;base64,") >= len(pngs)
    assert "report:" in done.stdout and str(out) in done.stdout


def test_every_built_in_matrix_loads_with_a_baseline_and_an_aa_pair() -> None:
    names = available()
    assert {"demo", "serializers", "loops", "deflate", "affinity", "regressions", "full"} <= set(
        names
    )
    for name in names:
        matrix = load_matrix(name)
        assert matrix.baseline in [c.name for c in matrix.configs]
        assert matrix.aa_pair is not None, name
        first, twin = (matrix.config(n) for n in matrix.aa_pair)
        assert first.env == twin.env and first.target == twin.target


def test_demo_matrix_fits_the_readme_promise() -> None:
    # a capacity ladder: every rung climbed twice and measured at stated cost rates, the
    # relays beside it, the A/A pair a rung the driver can see, the baseline's Locust run
    # and profile kept, all in under 12 minutes after setup
    demo = load_matrix("demo")
    assert demo.repeat == 2
    assert demo.estimate_s(demo.repeat) < 12 * 60
    # what the README promises and what the lab announces agree within 20 %
    promised = re.search(r"make demo .*\(~(\d+) min\)", (ROOT / "README.md").read_text())
    assert promised is not None
    assert 0.8 < int(promised.group(1)) * 60 / demo.estimate_s(demo.repeat) < 1.2
    # each transport's floor relay: one write per connection per loop iteration
    relays = [c for c in demo.configs if c.target == "relay"]
    assert {c.env.get("TRANSPORT", "websockets") for c in relays} == {"websockets", "picows"}
    assert all(c.env.get("RELAY_MODE") == "coalesced" for c in relays)
    climbed = [c for c in demo.configs if demo.load_of(c).climb]
    assert climbed[0].name == demo.baseline
    assert all(demo.load_of(c).connections == 2000 for c in climbed)
    baseline = demo.config(demo.baseline)
    assert baseline.locust and baseline.env["WS_DEFLATE"] == "on"
    # the A/A pair is not driver-limited: no deflate
    assert demo.aa_pair is not None
    assert all(demo.config(n).env.get("WS_DEFLATE") == "off" for n in demo.aa_pair)
    # two cost rates: the lower every rung runs, the higher every rung without deflate's
    # context takeover (shared deflate compresses a broadcast once: it holds it)
    assert any(c.env.get("WS_DEFLATE") == "shared" for c in climbed)
    low, high = demo.load.cost_rates
    for config in climbed:
        rates = (config.load or demo.load).cost_rates
        deflate = config.env.get("WS_DEFLATE") == "on"
        assert rates == ((low,) if deflate else (low, high)), config.name
    # the cost steps are paired: every rung, both relays and the profiled baseline share
    # the server's core in the paired phase, at least five rounds; the climbs take none
    paired = {c.name for c in demo.paired()}
    assert demo.load.pairs >= 5 and paired == {c.name for c in [*climbed, *profiled_of(demo)]}
    assert all(demo.load_of(c).cost_rates == () for c in climbed)
    # what profiling costs is a ratio at the same rate as the baseline's cost step
    profiled = profiled_of(demo)
    assert len(profiled) == 1 and not demo.load_of(profiled[0]).climb
    assert profiled[0].env == baseline.env
    assert demo.load_of(profiled[0]).rates == (low,)


def profiled_of(matrix: Matrix) -> list[Config]:
    """The matrix's profiled configurations."""
    return [c for c in matrix.configs if c.profile]


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[[config]]\nname='a'\ntarget='moon'\n", "target 'moon'"),
        ("[[config]]\nname='a'\nserializer='json'\n", "unknown keys"),
        ("[load]\nrates=[]\n[[config]]\nname='a'\n", "rates must be"),
        ("[load]\nlocust_profile='huge'\n[[config]]\nname='a'\n", "locust_profile 'huge'"),
        ("[load]\nconnections=15\n[[config]]\nname='a'\n", "multiple of room_size"),
        ("baseline='b'\n[[config]]\nname='a'\n", "baseline 'b'"),
        ("[[config]]\nname='a'\nsame_as='z'\n", "same_as 'z'"),
        ("[[config]]\nname='a'\n[[config]]\nname='a'\n", "unique"),
        ("this is = = not toml", "tiny.toml"),
        (
            "[[config]]\nname='a'\ntarget='relay'\n"
            "env={TRANSPORT='picows',RELAY_MODE='recv-broadcast'}\n",
            "RELAY_MODE 'recv-broadcast' on picows",
        ),
        ("[[config]]\nname='a'\ntarget='relay'\nenv={TRANSPORT='h2'}\n", "TRANSPORT 'h2'"),
        ("[load]\nmemory_traffic=['busy']\n[[config]]\nname='a'\n", "memory_traffic must"),
        ("[load]\nmemory_connections=15\n[[config]]\nname='a'\n", "multiple of 10"),
        ("[load]\nwire_messages=-1\n[[config]]\nname='a'\n", "must be >= 0"),
        ("[load]\npairs=2\n[[config]]\nname='a'\n", "pairs must be 0 or at least 5"),
        ("[[config]]\nname='a'\nload={pairs=6}\n", "pairs belongs to the matrix"),
    ],
)
def test_a_bad_matrix_file_is_refused_naming_the_problem(
    tmp_path: Path, text: str, complaint: str
) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    with pytest.raises(MatrixError, match=complaint.replace("(", r"\(")):
        load_matrix(str(path))


def test_the_cli_explains_itself_and_refuses_bad_arguments_with_status_2() -> None:
    helped = lab("--help")
    assert helped.returncode == 0
    for command in ("run", "capacity", "ceiling", "list", "report"):
        assert command in helped.stdout
    for command in ("run", "capacity", "ceiling"):
        assert lab(command, "--help").returncode == 0
    bad = lab("run", "--matrix", "no-such-matrix")
    assert bad.returncode == 2 and "no matrix 'no-such-matrix'" in bad.stderr
    assert lab("capacity", "--slo", "p99").returncode == 2
    assert lab("capacity", "--factor", "1").returncode == 2
    listed = lab("list")
    assert listed.returncode == 0 and "serializers" in listed.stdout


def _step(offered: float, delivered_per_s: float, p99: float, lost: int = 0) -> Step:
    sent = int(offered * 5)
    return Step(
        driver="fast",
        name=f"rate {offered:g}/s",
        connections=100,
        offered_per_s=offered,
        duration_s=5,
        sent=sent,
        delivered=sent * 10 - lost,
        expected=sent * 10,
        sent_per_s=offered,
        delivered_per_s=delivered_per_s,
        latency_ms={"p50": p99 / 4, "p90": p99 / 2, "p95": p99 / 1.5, "p99": p99, "max": p99 * 2},
    )


def test_capacity_is_the_highest_delivered_rate_that_held_the_slo() -> None:
    slo = parse_slo("p99=100")
    run = Run(config="c", repeat=0, target="chat", env={})
    run.steps = [
        _step(1000, 10_000, 5),
        _step(2000, 20_000, 20),
        _step(4000, 33_000, 400),  # broke on latency
        _step(2800, 28_000, 60),  # the refinement step held
    ]
    found = edge(run, slo)
    assert found.capacity_delivered_per_s == 28_000
    assert found.first_break_offered_per_s == 4000
    assert [s.holds for s in found.steps] == [True, True, True, False]
    # a lost message breaks the SLO whatever the latency
    run.steps = [_step(1000, 10_000, 5, lost=1)]
    assert edge(run, slo).capacity_delivered_per_s == 0


def test_a_knee_saved_by_an_older_lab_reads_back_typed() -> None:
    saved = {
        "config": "c",
        "capacity_delivered_per_s": 9000,
        "generator_limited_at_edge": True,  # before driver_limited was recorded
        "steps": [{"offered_per_s": 900.0, "delivered_per_s": 9000, "p99_ms": 5.0, "holds": True}],
    }
    run = Run.from_dict({"config": "c", "repeat": 0, "target": "chat", "env": {}, "knee": saved})
    assert isinstance(run.knee, Knee)
    assert run.knee.driver_limited and run.knee.capacity_delivered_per_s == 9000
    assert run.knee.steps[0].holds and run.knee.steps[0].offered_per_s == 900.0
    assert Run.from_dict({"config": "c", "repeat": 0, "target": "chat", "env": {}}).knee is None


def test_capacity_plan_adds_one_instance_for_redundancy() -> None:
    assert capacity_plan(28_000, 100_000)["instances"] == 5  # ceil(3.57) = 4, plus one
    assert capacity_plan(28_000, 28_000)["instances"] == 2


def test_slo_text_is_parsed_or_refused() -> None:
    assert parse_slo("p99=100,p95=50") == {"p99": 100.0, "p95": 50.0}
    for bad in ("p99", "p98=1", "p99=-1", ""):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_results_survive_a_round_trip_through_json(tmp_path: Path) -> None:
    results = Results(matrix="m", started="now", command="c", baseline="c", aa_pair=[], repeat=1)
    run = Run(config="c", repeat=0, target="chat", env={"SERIALIZER": "json"})
    run.steps = [_step(1000, 10_000, 5)]
    results.runs.append(run)
    path = tmp_path / "results.json"
    results.save(path)
    again = Results.load(path)
    assert again.runs[0].steps[0].latency_ms == run.steps[0].latency_ms
    assert json.loads(path.read_text())["runs"][0]["env"] == {"SERIALIZER": "json"}
