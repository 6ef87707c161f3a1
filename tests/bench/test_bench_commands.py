"""The benchmark commands run end to end in a quick mode and report real figures."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.lab import run_bench


def test_codecs_bench_reports_every_codec(tmp_path: Path):
    out = tmp_path / "codecs.json"
    result = run_bench("bench.codecs", "--repeat", "1", "--number", "200", "--json", str(out))
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())
    rows = rows["results"] if isinstance(rows, dict) else rows
    assert {(r["frame"], r["codec"]) for r in rows} == {
        (frame, codec) for frame in ("message", "send") for codec in ("json", "orjson", "protobuf")
    }
    assert all(r["bare_ns"] > 0 and r["codec_ns"] > 0 and r["frame_bytes"] > 0 for r in rows)


def test_memory_bench_measures_deflate_settings_idle_and_after_traffic(tmp_path: Path):
    out = tmp_path / "memory.json"
    args = ("--connections", "20", "--deflate", "off,shared", "--traffic", "idle,after")
    result = run_bench("bench.memory", *args, "--json", str(out))
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())
    assert [(r["traffic"], r["deflate"]) for r in rows] == [
        (traffic, deflate) for traffic in ("idle", "after") for deflate in ("off", "shared")
    ]
    assert all(r["rss_after_bytes"] > 0 for r in rows)


def test_memory_bench_runs_the_transport_asked_for(tmp_path: Path):
    out = tmp_path / "memory.json"
    args = ("--connections", "20", "--transport", "picows", "--json", str(out))
    result = run_bench("bench.memory", *args, "--deflate", "shared")
    assert result.returncode == 0, result.stderr
    assert [(r["transport"], r["deflate"]) for r in json.loads(out.read_text())] == [
        ("picows", "shared")
    ]
    # the server got it: picows refuses deflate with context takeover at start
    refused = run_bench("bench.memory", *args, "--deflate", "on")
    assert refused.returncode != 0 and "WS_DEFLATE=on needs TRANSPORT=websockets" in refused.stderr


def test_wire_bench_reports_bytes_per_delivered_message_for_each_deflate_setting(tmp_path: Path):
    out = tmp_path / "wire.json"
    result = run_bench("bench.wire", "--rooms", "1", "--messages", "2", "--json", str(out))
    assert result.returncode == 0, result.stderr
    rows = {(r["deflate"], r["bodies"]): r for r in json.loads(out.read_text())}
    assert set(rows) == {(d, b) for d in ("off", "on", "shared") for b in ("demo", "chat", "long")}
    assert all(r["delivered"] == 20 * 10 for r in rows.values())  # 20 messages, 10 members
    for bodies in ("demo", "chat", "long"):
        off = rows["off", bodies]
        assert off["negotiated"] == ""
        assert off["wire_bytes_per_delivery"] == off["plain_bytes_per_delivery"]
    assert "server_no_context_takeover" in rows["shared", "long"]["negotiated"]
    assert "server_no_context_takeover" not in rows["on", "long"]["negotiated"]
    # long bodies of words compress either way
    for deflate in ("on", "shared"):
        assert (
            rows[deflate, "long"]["wire_bytes_per_delivery"]
            < 0.8 * (rows["off", "long"]["wire_bytes_per_delivery"])
        )


def test_auth_login_bench_compares_pool_and_inline(tmp_path: Path):
    out = tmp_path / "auth.json"
    result = run_bench(
        "bench.auth_login",
        "--duration-s",
        "1",
        "--concurrency",
        "2",
        "--time-cost",
        "1",
        "--memory-cost-kib",
        "8192",
        "--parallelism",
        "1",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    rows = {r["mode"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"pool", "inline"}
    assert rows["pool"]["logins"] > 0 and rows["inline"]["logins"] > 0


def test_serialization_microbenchmarks_run_once_and_render_the_seed_table(tmp_path: Path):
    out = tmp_path / "bench.json"
    result = run_bench(
        "pytest",
        "bench/test_serialization.py",
        "-q",
        "-p",
        "no:cacheprovider",
        "--benchmark-only",
        "--benchmark-min-rounds=1",
        "--benchmark-max-time=0.01",
        "--benchmark-warmup=off",
        f"--benchmark-json={out}",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    table = run_bench("bench.seed_table", str(out))
    assert table.returncode == 0, table.stderr
    for group in ("seed message: serialize", "chat send: decode (codec)"):
        assert sum(group in line for line in table.stdout.splitlines()) == 3, table.stdout


def test_shard_faults_bench_reports_healthy_and_struck_shards_apart(tmp_path: Path):
    out = tmp_path / "shard_faults.json"
    args = ("--fault", "replica", "--clients", "12", "--rooms", "6", "--rate", "120")
    quick = ("--before-s", "2", "--window-s", "2", "--runs", "1", "--json", str(out))
    result = run_bench("bench.shard_faults", *args, *quick)
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["rooms_struck"] > 0 and row["rooms_healthy"] > 0
    # the replica is lost for good: the struck shard refuses, the others go on
    assert row["healthy_after"]["sends"] == row["healthy_after"]["acked"] > 0
    assert row["healthy_after"]["unavailable"] == 0
    assert row["struck_after"]["unavailable"] > 0
    assert row["struck_before"]["acked"] > 0


def test_reconnect_storm_costs_no_argon2_with_refresh_and_a_hash_per_client_without(
    tmp_path: Path,
):
    out = tmp_path / "storm.json"
    clients = 20
    args = ("--clients", str(clients), "--users", "4", "--token-ttl-s", "2", "--fast-argon2")
    result = run_bench("bench.reconnect_storm", *args, "--timeout-s", "60", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    modes = {r["mode"]: r for r in json.loads(out.read_text())["modes"]}
    assert modes["refresh"]["hashes"] == 0
    assert modes["password"]["hashes"] == clients
    for r in modes.values():
        assert r["missing"] == r["given_up"] == r["gaps"] == 0, r
        assert r["auth_calls"] == clients
        assert 0 < r["back_s"] <= r["caught_up_s"]
    assert "all caught up s" in result.stdout


def test_the_lab_measures_refreshes_per_cpu_second_of_a_running_auth_service():
    from bench.lab.scaling_cli import refreshes_per_cpu_s

    # a refresh hashes no password: far more of them per CPU-second than argon2 logins
    # (about 5 at the default cost), whatever the machine
    assert refreshes_per_cpu_s(0.5, clients=2) > 20


def test_commit_layout_bench_times_every_variant_and_stores_every_message(tmp_path: Path):
    out = tmp_path / "commit.json"
    args = ("--batches", "1,5", "--messages", "200", "--rooms", "20", "--warm", "5")
    result = run_bench("bench.commit_layout", *args, "--repeat", "1", "--quiet", "--json", str(out))
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())
    from bench.commit_layout import VARIANTS

    assert [(r["variant"], r["batch"]) for r in rows] == [
        (variant, batch) for batch in (1, 5) for variant in VARIANTS
    ]
    assert all(r["us_per_message"] > 0 and r["messages"] == 200 for r in rows)
    # only the log variants copy, and their copy is part of their total
    assert all(
        (r["copy_us_per_message"] > 0) == r["variant"].startswith("log-")
        and r["copy_us_per_message"] <= r["us_per_message"]
        for r in rows
    )
    assert "schema-1" in result.stdout and "batches of 5" in result.stdout


def test_commit_layout_bench_refuses_an_unknown_variant():
    result = run_bench("bench.commit_layout", "--variants", "current,btree-of-dreams")
    assert result.returncode == 2
    assert "unknown variants: btree-of-dreams" in result.stderr
