"""The lab report: tables with the real figures, ratios and noise floor, PNGs that exist,
an HTML page that stands alone (and renders in a real browser), and the CLI re-render."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

import bench.lab.report
from bench.lab.report import metric_cells, summary_table, to_html, to_markdown, write_report
from bench.lab.report.model import Code, Heading, Table
from bench.lab.results import Results, Run, Sample, Step, TimePoint
from chatlab.harness import ROOT
from tests.support import CHROMIUM, chromium_dom

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

BASELINE = "orjson+uvloop"
AA = "orjson+uvloop (A/A)"
SLOW = "json+asyncio"
RELAY = "relay"
#: fan-out p50 (ms) of each configuration at 1000 messages/s; other percentiles scale it
P50_MS = {BASELINE: 2.0, AA: 2.1, SLOW: 16.0, RELAY: 0.8}
RATES = {BASELINE: (1000, 2000), AA: (1000, 2000), SLOW: (1000, 2000), RELAY: (1000, 2000, 4000)}
RATE_FACTOR = {1000: 1.0, 2000: 1.5, 4000: 2.0}
#: repeat r's latencies are this much of the configuration's: the median is repeat 2's
REPEAT_FACTOR = (1.0, 1.2, 1.1)
#: server CPU % while a step ran, by configuration and rate (0: the Locust step)
CPU = {BASELINE: 30.0, AA: 31.0, SLOW: 70.0, RELAY: 10.0}
ROOM = 10
STEP_S = 5.0
LIMITED_NOTE = "sends fell 42 ms behind schedule"
#: as bench.lab.capacity records a climb (edges per configuration, a plan)
CAPACITY = {
    "slo_ms": {"p99": 100.0},
    "edges": {
        BASELINE: {
            "config": BASELINE,
            "capacity_delivered_per_s": 20000,
            "p99_ms_at_capacity": 16.5,
            "first_break_offered_per_s": 8000.0,
            "generator_limited_at_edge": False,
            "steps": [
                {"offered_per_s": 2000.0, "delivered_per_s": 20000, "p99_ms": 16.5, "holds": True},
                {
                    "offered_per_s": 8000.0,
                    "delivered_per_s": 61000,
                    "p99_ms": 240.0,
                    "holds": False,
                },
            ],
            "error": "",
        },
    },
    "fraction_of_relay": 0.5,
    "plan": {"target_delivered_per_s": 100000, "instances": 6},
}


def _latency(p50: float) -> dict[str, float]:
    return {
        "p50": p50,
        "p90": 2 * p50,
        "p95": 3 * p50,
        "p99": 5 * p50,
        "p999": 8 * p50,
        "max": 12 * p50,
    }


def _fast_step(config: str, repeat: int, rate: int, started_s: float) -> Step:
    p50 = P50_MS[config] * RATE_FACTOR[rate] * REPEAT_FACTOR[repeat]
    sent = int(rate * STEP_S)
    lost = sent if config == SLOW and rate == 2000 else 0  # the slow one drops some at 2000/s
    delivered = sent * ROOM - lost
    limited = config == SLOW and rate == 2000 and repeat == 1
    return Step(
        driver="fast",
        name=f"rate {rate}/s",
        connections=200,
        offered_per_s=float(rate),
        duration_s=STEP_S,
        sent=sent,
        delivered=delivered,
        expected=sent * ROOM,
        sent_per_s=sent / STEP_S,
        delivered_per_s=delivered / STEP_S,
        latency_ms=_latency(p50),
        generator_cpu_percent=96.0 if limited else 40.0,
        generator_limited=limited,
        generator_notes=[LIMITED_NOTE] if limited else [],
        timeline=[
            TimePoint(
                t_s=started_s + i + 1,
                users=200,
                sent_per_s=rate,
                delivered_per_s=rate * ROOM,
                p50_ms=p50 * (0.9 + 0.05 * i),
                p99_ms=5 * p50 * (0.9 + 0.05 * i),
            )
            for i in range(int(STEP_S))
        ],
        started_s=started_s,
    )


def _locust_step(config: str, repeat: int, started_s: float) -> Step:
    p50 = P50_MS[config] * REPEAT_FACTOR[repeat]
    timeline = [
        TimePoint(
            t_s=started_s + i,
            users=min(20, 2 * (i + 1)),
            sent_per_s=min(20, 2 * (i + 1)) * 1.0,
            delivered_per_s=min(20, 2 * (i + 1)) * 10.0,
            p50_ms=p50,
            p99_ms=5 * p50 if i else None,  # Locust has no percentile in its first second
        )
        for i in range(20)
    ]
    return Step(
        driver="locust",
        name="profile smoke",
        connections=20,
        offered_per_s=None,
        duration_s=20.0,
        sent=300,
        delivered=3000,
        expected=3000,
        sent_per_s=15.0,
        delivered_per_s=150.0,
        latency_ms=_latency(p50),
        errors=1 if config == SLOW else 0,
        error_detail={"rate_limited": 1} if config == SLOW else {},
        timeline=timeline,
        started_s=started_s,
    )


def _run(config: str, repeat: int, started_s: float) -> Run:
    steps = []
    t = started_s + 2.0
    for rate in RATES[config]:
        steps.append(_fast_step(config, repeat, rate, t))
        t += STEP_S + 1.0
    if config != RELAY:
        steps.append(_locust_step(config, repeat, t))
        t += 20.0
    server, generator = [], []
    for i in range(int((t - started_s) / 0.5) + 2):
        s_t = started_s + i * 0.5
        step = next((s for s in steps if s.started_s <= s_t <= s.started_s + s.duration_s), None)
        level = 2.0
        if step is not None:
            level = CPU[config] * (
                RATE_FACTOR[int(step.offered_per_s)] if step.offered_per_s else 1.3
            )
        wiggle = 5.0 if i % 2 else -5.0
        server.append(Sample(s_t, max(0.0, level + wiggle), (60 + i // 4) * 2**20))
        generator.append(Sample(s_t, 35.0 + wiggle, 80 * 2**20))
    metrics = {}
    if config != RELAY:
        # as the runner's scrape_metrics flattens them: bare label values, no buckets
        metrics = {
            "chat_frames_in_total": 15300.0 + repeat,
            "chat_frames_out_total": 153000.0,
            "chat_errors_total{code=rate_limited}": 3.0 if config == SLOW else 0.0,
            "chat_errors_total{code=too_large}": 0.0,
            "chat_connections": 0.0,
            "chat_ack_latency_ms_sum": 30600.0,
            "chat_ack_latency_ms_count": 15300.0,
            "chat_group_commit_batch_size_sum": 15300.0,
            "chat_group_commit_batch_size_count": 1200.0,
        }
    return Run(
        config=config,
        repeat=repeat,
        target="relay" if config == RELAY else "chat",
        env={} if config == RELAY else {"SERIALIZER": config.split("+", maxsplit=1)[0]},
        started_s=started_s,
        steps=steps,
        samples={"server": server, "generator": generator},
        metrics=metrics,
    )


def _results() -> Results:
    configs = {
        BASELINE: {"env": {"SERIALIZER": "orjson", "EVENT_LOOP": "uvloop"}},
        AA: {"env": {"SERIALIZER": "orjson", "EVENT_LOOP": "uvloop"}, "description": "A/A"},
        SLOW: {"env": {"SERIALIZER": "json", "EVENT_LOOP": "asyncio"}},
        RELAY: {"target": "relay", "description": "bare websockets relay"},
    }
    runs = []
    t = 0.0
    for repeat in range(len(REPEAT_FACTOR)):
        for config in configs:
            runs.append(_run(config, repeat, t))
            t += 50.0
    ceiling = replace(
        _fast_step(RELAY, 0, 4000, 0.0),
        name="ceiling",
        sent_per_s=15000.0,
        delivered_per_s=150000.0,
        timeline=[],
        started_s=None,
    )
    return Results(
        matrix="serializers",
        started="2026-11-23T10:00:00",
        command="python -m bench.lab run serializers --repeat 3",
        baseline=BASELINE,
        aa_pair=[BASELINE, AA],
        repeat=len(REPEAT_FACTOR),
        machine={"cores": 2, "python": "3.11.2"},
        configs=configs,
        runs=runs,
        ceilings={"fast": ceiling},
        capacity=CAPACITY,
        duration_s=650.0,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The report of the hand-built results: its directory, markdown and HTML."""
    out = tmp_path_factory.mktemp("report")
    md_path, html_path = write_report(_results(), out)
    return out, md_path.read_text(), html_path.read_text()


def _table_row(md: str, heading: str, first_cell: str) -> list[str]:
    """The cells of the first table row under ``heading`` (``### `` unless it has its own
    hashes) whose first cell starts with ``first_cell``."""
    marker = heading if heading.startswith("#") else f"### {heading}"
    section = md.split(f"{marker}\n", 1)[1]
    for line in section.splitlines():
        if line.startswith(f"| {first_cell}"):
            return [c.strip() for c in line.strip("|").split(" | ")]
    raise AssertionError(f"no row {first_cell!r} under {heading!r}")


def test_driver_tables_show_medians_with_their_range(report: tuple[Path, str, str]):
    _, md, _ = report
    heading = "fast driver (open loop), rate 2000/s"
    base = _table_row(md, heading, BASELINE)
    # p99 = 5 x 2.0 ms x 1.5 x (1.0, 1.2, 1.1): median 16.5, range 15.0-18.0
    assert base[2:7] == [
        "3.30 (3.00\u20133.60)",
        "6.60 (6.00\u20137.20)",
        "9.90 (9.00\u201310.8)",
        "16.5 (15.0\u201318.0)",
        "39.6 (36.0\u201343.2)",
    ]
    assert base[7:9] == ["2,000", "20,000"]  # sent/s, delivered/s
    assert base[-2:] == ["\u2713 3/3", "\u2713 3/3"]
    slow = _table_row(md, heading, SLOW)
    assert slow[5] == "132 (120\u2013144)"
    assert slow[-2:] == ["\u2717 0/3", "\u2717 0/3"]  # messages were lost: neither holds
    locust = _table_row(md, "Locust (closed loop), profile smoke", SLOW)
    assert locust[-3] == "3 (rate_limited 3)"  # one a repeat, summed over the three


def test_ratios_to_the_baseline_and_no_difference_within_the_noise_floor(
    report: tuple[Path, str, str],
):
    _, md, _ = report
    heading = "fast driver (open loop), rate 2000/s"
    section = md.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
    ratios = section.split(f"| configuration / {BASELINE}", 1)[1]
    slow = next(line for line in ratios.splitlines() if line.startswith(f"| {SLOW}"))
    # 132 / 16.5 = 8.00; the ranges allow 120/18.0 = 6.67 to 144/15.0 = 9.60
    assert "\u00d78.00 (6.67\u20139.60)" in slow
    aa = next(line for line in ratios.splitlines() if line.startswith(f"| {AA}"))
    assert "\u2248 no difference (\u00d71.05)" in aa


def test_noise_floor_is_the_aa_pairs_difference(report: tuple[Path, str, str]):
    _, md, _ = report
    assert f"The A/A pair ({BASELINE} = {AA}) has identical settings" in md
    floor_row = _table_row(md, "## Noise floor", "fast driver")
    assert floor_row[1:6] == ["\u00b15.0 %"] * 5
    assert floor_row[6] == "\u00b10.0 %"  # delivered/s: identical


def test_generator_limited_step_is_marked_with_its_notes(report: tuple[Path, str, str]):
    _, md, _ = report
    row = _table_row(md, "fast driver (open loop), rate 2000/s", SLOW)
    assert row[0] == f"{SLOW} \u26a0[1]"
    assert f"[1] {SLOW}, fast driver (open loop), rate 2000/s, repeat 2:" in md
    assert LIMITED_NOTE in md
    assert "\u26a0" not in _table_row(md, "fast driver (open loop), rate 1000/s", SLOW)[0]


def test_limit_section_compares_with_the_relay_and_the_driver_ceiling(
    report: tuple[Path, str, str],
):
    _, md, _ = report
    limit = md.split("## Limit", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in limit.splitlines() if "|" in line}
    # best holding: baseline 20,000/s at 2000/s; slow 10,000/s at 1000/s; relay 40,000/s
    assert "| 20,000 | rate 2000/s |" in rows[BASELINE] and "| 50% | 13% |" in rows[BASELINE]
    assert "| 10,000 | rate 1000/s |" in rows[SLOW] and "| 25% |" in rows[SLOW]
    assert "| 100% |" in rows[RELAY]
    assert "held the SLO at every rate tried" in limit
    ceilings = md.split("## Driver ceilings", 1)[1].split("\n## ", 1)[0]
    assert "| fast driver (open loop) | ceiling | 200 |" in ceilings
    assert "150,000" in ceilings


def test_limit_section_sends_to_the_ladder_when_the_relays_only_climbed(tmp_path: Path):
    # the demo's relays run climbs only: the limit table has no step of theirs
    results = _results()
    results.runs = [
        replace(r, steps=[s for s in r.steps if s.driver != "fast"]) if r.target == "relay" else r
        for r in results.runs
    ]
    md = write_report(results, tmp_path)[0].read_text()
    limit = md.split("## Limit", 1)[1].split("\n## ", 1)[0]
    assert "The relays ran only climbs here" in limit
    assert "did not hold the SLO" not in limit


def test_header_capacity_and_metrics(report: tuple[Path, str, str]):
    _, md, _ = report
    assert md.startswith("# Lab report: serializers\n")
    assert "- started: 2026-11-23T10:00:00" in md
    assert "- duration: 10 min 50 s" in md
    assert "- interrupted: no" in md
    assert "python -m bench.lab run serializers --repeat 3" in md
    assert "headline | p99 < 100 ms" in md and "p90 < 200 ms, p95 < 500 ms, p99 < 1000 ms" in md
    capacity = md.split("## Capacity search", 1)[1].split("\n## ", 1)[0]
    assert "| slo_ms.p99 | 100 |" in capacity
    assert "| fraction_of_relay | 0.50 |" in capacity
    assert "| plan.instances | 6 |" in capacity
    assert f"### edges\n\n#### {BASELINE}\n\n| key | value |" in capacity
    assert "| capacity_delivered_per_s | 20,000 |" in capacity
    assert "| 8,000 | 61,000 | 240 | no |" in capacity
    metrics = md.split("## Server metrics", 1)[1].split("\n## ", 1)[0]
    errors = next(line for line in metrics.splitlines() if line.startswith("| chat_errors "))
    assert "rate_limited 3, too_large 0" in errors
    ack = next(line for line in metrics.splitlines() if line.startswith("| chat_ack_latency_ms "))
    assert "| n 15,300, mean 2.00 ms |" in ack
    batches = next(line for line in metrics.splitlines() if "chat_group_commit_batch_size" in line)
    assert "| n 1,200, mean 12.8 |" in batches
    frames = next(line for line in metrics.splitlines() if line.startswith("| chat_frames_in "))
    assert "| 15,301 |" in frames  # the median of 15,300, 15,301 and 15,302
    header = next(line for line in metrics.splitlines() if line.startswith("| metric "))
    assert RELAY not in header  # the relay has no metrics to scrape


def test_every_referenced_png_exists(report: tuple[Path, str, str]):
    out, md, _ = report
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert {Path(p).name for p in images} == {
        "latency-fast.png",
        "latency-locust.png",
        "latency-time-locust.png",
        "latency-time-fast.png",
        "cpu.png",
        "throughput.png",
        "rss.png",
    }
    for rel in images:
        assert not Path(rel).is_absolute()
        assert (out / rel).read_bytes().startswith(PNG_SIGNATURE), rel
    assert "Skipped" not in md


def test_html_is_self_contained(report: tuple[Path, str, str]):
    _, md, page = report
    assert not re.search(r"(?i)\b(?:https?|file):", page)
    assert not re.search(r"(?i)<link\b|@import|url\(", page)
    sources = re.findall(r'<img\b[^>]*\bsrc="([^"]*)"', page)
    assert len(sources) == md.count("![")
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<table>" in page and "16.5 (15.0\u201318.0)" in page
    assert "\u26a0[1]" in page


@pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason=f"no {CHROMIUM}: CI and the setup script install it"
)
def test_html_images_load_in_headless_chromium(report: tuple[Path, str, str], tmp_path: Path):
    out, _, page = report
    images = page.count("<img ")
    dom = chromium_dom(out / "report.html", tmp_path / "chromium")
    assert images > 0
    assert f'data-images-loaded="{images}/{images}"' in dom


def test_missing_data_skips_plots_and_says_so(tmp_path: Path):
    results = _results()
    results.runs = [
        replace(r, steps=[s for s in r.steps if s.driver == "fast"]) for r in results.runs
    ]
    for run in results.runs:
        for step in run.steps:
            step.started_s = None  # an older runner: CPU falls back to the whole run
    results.aa_pair = []
    md_path, html_path = write_report(results, tmp_path)
    md = md_path.read_text()
    assert "Skipped: no Locust (closed loop) step in these results." in md
    assert "Skipped: no Locust (closed loop) step with a timeline in these results." in md
    assert "No A/A pair with data in these results" in md
    assert "\u2020 CPU and RSS over the whole run" in md
    assert "(plots/latency-fast.png)" in md and "(plots/cpu.png)" in md
    assert html_path.read_text().count("<img ") == md.count("![")


def test_empty_results_still_render(tmp_path: Path):
    flat_capacity = {"config": BASELINE, "capacity_delivered_per_s": 20000, "instances": 5}
    results = replace(_results(), runs=[], ceilings={}, capacity=flat_capacity, interrupted=True)
    md_path, _ = write_report(results, tmp_path)
    md = md_path.read_text()
    assert "| instances | 5 |" in md
    assert "- interrupted: yes" in md
    assert "No run produced a step" in md
    assert md.count("Skipped:") == 7
    assert summary_table(results) == "no run produced a step"


def test_profiles_tables_and_call_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "base-0.prof").write_bytes(b"not read by the fake")
    calls: dict[str, object] = {}

    def top_functions(paths: list[Path], limit: int) -> dict[str, list[dict[str, object]]]:
        calls["paths"] = paths
        rows = [{"function": "chat.py:42(handle_send)", "calls": 3000, "seconds": 0.5}]
        return {"cumulative": rows, "own": rows}

    def markdown_table(rows: list[dict[str, object]]) -> str:
        header = "| function | calls | seconds |\n|---|---:|---:|\n"
        return header + "".join(
            f"| {r['function']} | {r['calls']} | {r['seconds']} |\n" for r in rows
        )

    def call_graph_png(paths: list[Path], out_png: Path) -> Path:
        out_png.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(next((tmp_path / "plots").glob("cpu.png")), out_png)
        return out_png

    fake = types.ModuleType("bench.lab.profiles")
    fake.top_functions = top_functions  # type: ignore[attr-defined]
    fake.markdown_table = markdown_table  # type: ignore[attr-defined]
    fake.call_graph_png = call_graph_png  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.lab.profiles", fake)
    import bench.lab

    monkeypatch.setattr(bench.lab, "profiles", fake, raising=False)
    results = _results()
    results.runs[0].profiles = ["profiles/base-0.prof", "profiles/missing.prof"]
    md_path, html_path = write_report(results, tmp_path)
    md = md_path.read_text()
    profiles = md.split("## Profiles", 1)[1]
    assert calls["paths"] == [tmp_path / "profiles" / "base-0.prof"]
    assert "(1 of 2 found)" in profiles
    assert profiles.count("| chat.py:42(handle_send) | 3000 | 0.5 |") == 2
    assert f"![call graph, {BASELINE}](plots/profile-orjson-uvloop.png)" in profiles
    page = html_path.read_text()
    assert "<td>chat.py:42(handle_send)</td>" in page
    assert f'alt="call graph, {BASELINE}" src="data:image/png;base64,' in page


def test_summary_table_names_the_driver_and_the_verdicts():
    text = summary_table(_results())
    assert "fast driver (open loop), rate 2000/s (medians)" in text
    assert "Locust (closed loop), profile smoke (medians)" in text
    slow = next(
        line
        for line in text.split("rate 2000/s (medians)", 1)[1].splitlines()
        if line.startswith(SLOW)
    )
    assert "\u2717 0/3" in slow and "\u00d78.00 (6.67\u20139.60)" in slow
    assert LIMITED_NOTE in text


def _report_cli(*args: str, cwd: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m bench.lab.report ARGS`` run in ``cwd`` with the repository importable."""
    return subprocess.run(
        [sys.executable, "-m", "bench.lab.report", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_cli_rerenders_a_saved_results_json(tmp_path: Path):
    saved = tmp_path / "run" / "results.json"
    saved.parent.mkdir()
    _results().save(saved)
    out = tmp_path / "again"
    result = _report_cli(str(saved), "--out", str(out), cwd=ROOT, timeout_s=300)
    assert result.returncode == 0, result.stderr
    assert "rate 2000/s (medians)" in result.stdout
    md = (out / "report.md").read_text()
    assert "16.5 (15.0\u201318.0)" in md
    assert (out / "report.html").is_file()
    assert (out / "plots" / "cpu.png").read_bytes().startswith(PNG_SIGNATURE)


def test_cli_help_outside_the_repository_and_a_missing_file(tmp_path: Path):
    # from another directory: the templates are found beside the package, not in the cwd
    help_text = _report_cli("--help", cwd=tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    assert "RESULTS_JSON" in help_text.stdout.upper() and "--out" in help_text.stdout
    missing = _report_cli(str(tmp_path / "nope.json"), cwd=tmp_path)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_metric_cells_fold_histograms_and_labels():
    cells = metric_cells(
        {
            'chat_ack_latency_ms_bucket{le="1"}': 9000.0,
            'chat_ack_latency_ms_bucket{le="5"}': 15000.0,
            'chat_ack_latency_ms_bucket{le="50"}': 15300.0,
            'chat_ack_latency_ms_bucket{le="+Inf"}': 15300.0,
            "chat_ack_latency_ms_sum": 30600.0,
            "chat_ack_latency_ms_count": 15300.0,
            'chat_errors_total{code="bad_request"}': 2.0,
            "chat_slow_consumer_closes_total": 0.0,
            "chat_slow_consumer_closes_created": 1.7e9,
            "chat_outbound_buffer_bytes": 1536.5,
        }
    )
    assert cells == {
        "chat_ack_latency_ms": "n 15,300, mean 2.00 ms, p50 \u2264 1.00 ms, p99 \u2264 50.0 ms",
        "chat_errors": "bad_request 2",
        "chat_outbound_buffer_bytes": "1,536",
        "chat_slow_consumer_closes": "0",
    }


#: a name a configuration or a matrix could carry, that must stay text in the page
SCRIPT_NAME = '<script>alert("name")</script>'


def test_a_name_with_markup_is_escaped_in_the_html_and_literal_in_the_markdown(tmp_path: Path):
    results = _results()
    results.matrix = SCRIPT_NAME
    results.configs[SCRIPT_NAME] = results.configs.pop(SLOW)
    for run in results.runs:
        if run.config == SLOW:
            run.config = SCRIPT_NAME
    md_path, html_path = write_report(results, tmp_path)
    md, page = md_path.read_text(), html_path.read_text()
    assert md.startswith(f"# Lab report: {SCRIPT_NAME}\n")
    assert f"| {SCRIPT_NAME} |" in md
    assert SCRIPT_NAME not in page
    assert page.count("<script>") == 1  # the page's own, that counts the loaded images
    escaped = "&lt;script&gt;alert(&#34;name&#34;)&lt;/script&gt;"
    assert f"<title>Lab report: {escaped}</title>" in page
    assert f"<td>{escaped}</td>" in page


def _markdown_tables(md: str) -> list[list[list[str]]]:
    """Every pipe table's rows of cells, without the alignment row; code spans as text."""
    tables: list[list[list[str]]] = []
    for chunk in md.split("\n\n"):
        lines = chunk.strip().splitlines()
        if not lines or not all(line.startswith("|") for line in lines):
            continue
        rows = [lines[0], *lines[2:]]
        cells = [re.split(r"(?<!\\)\|", row.strip()[1:-1]) for row in rows]
        tables.append([[c.strip().replace("\\|", "|").strip("`") for c in row] for row in cells])
    return tables


class _HtmlTables(HTMLParser):
    """Every <table>'s rows of cell texts, entities decoded."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_markdown_and_html_hold_the_same_tables(report: tuple[Path, str, str]):
    _, md, page = report
    parser = _HtmlTables()
    parser.feed(page)
    tables = _markdown_tables(md)
    assert len(tables) >= 10 and any("16.5 (15.0\u201318.0)" in row for t in tables for row in t)
    assert parser.tables == tables


def test_markdown_cells_escape_pipes_and_html_cells_show_code_spans():
    blocks = [
        Heading(2, "a <b>"),
        Table(["name", "value"], [["`f(a|b)`", "x | y"], ["plain", "z"]]),
        Code("x < y"),
    ]
    md = to_markdown(blocks)
    assert md == (
        "## a <b>\n\n| name | value |\n|---|---|\n| `f(a\\|b)` | x \\| y |\n"
        "| plain | z |\n\n```\nx < y\n```\n"
    )
    page = to_html(blocks, "t & u")
    assert "<title>t &amp; u</title>" in page
    assert "<h2>a &lt;b&gt;</h2>" in page
    assert "<td><code>f(a|b)</code></td><td>x | y</td>" in page
    assert "<pre>x &lt; y</pre>" in page


def test_every_public_name_of_the_package_imports():
    for name in bench.lab.report.__all__:
        assert getattr(bench.lab.report, name) is not None, name
    with pytest.raises(AttributeError):
        _ = bench.lab.report.no_such_name
