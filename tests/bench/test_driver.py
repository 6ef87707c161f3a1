"""The fast driver (``python -m bench.lab.driver``) and the picows relay, as real processes.

Rates stay low (the machine is shared): these check counts and the written Steps,
never timings.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from bench.lab.driver import (
    DEFLATE_OFFER,
    DIGITS,
    MARKER,
    MIN_BODY_CHARS,
    DriverConfig,
    LatencyHistogram,
    negotiated_deflate,
    next_climb_rate,
    send_frame,
    worth_a_rerun,
)
from bench.lab.driver.config import DriverArgs, parse_args
from bench.lab.results import PERCENTILES, Step, TimePoint, stalled_points
from chat_server.codecs import get_codec
from chat_server.messages import Send
from chatlab.harness import ROOT, KeyPair, ServerProcess, free_port
from chatlab.throwaway_ca import ThrowawayCA
from tests.support import running_relay

#: a short run: 20 connections in rooms of 10, two 1 s steps
SHORT_RUN = (
    "--connections",
    "20",
    "--room-size",
    "10",
    "--rates",
    "200,400",
    "--step-s",
    "1",
    "--warmup-s",
    "0.5",
    "--drain-s",
    "0.5",
)


def run_driver(
    *args: str, timeout_s: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the driver to completion; its status and output."""
    return subprocess.run(
        [sys.executable, "-m", "bench.lab.driver", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture(params=["websockets", "picows"])
def relay_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A running relay on each transport; its websocket URL."""
    with running_relay(request.param) as url:
        yield url


def assert_complete_steps(out: Path, rates: tuple[int, ...], connections: int) -> list[Step]:
    """The written steps: one per rate, every frame delivered to the whole room, no error."""
    steps = [Step.from_dict(s) for s in json.loads(out.read_text())]
    assert [s.offered_per_s for s in steps] == list(rates)
    for step, rate in zip(steps, rates, strict=True):
        assert step.driver == "fast" and step.name == f"rate {rate}/s"
        assert step.sent == rate  # 1 s steps
        assert step.expected == step.sent * 10
        assert step.delivered == step.expected, step.error_detail
        assert step.errors == 0, step.error_detail
        assert set(step.latency_ms) == set(PERCENTILES)
        lat = step.latency_ms
        assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"] <= lat["max"]
        assert HdrHistogram.decode(step.histogram).get_total_count() == step.delivered
        assert step.generator_cpu_percent is not None and step.generator_cpu_percent > 0
        assert step.timeline and all(p.users == connections for p in step.timeline)
        assert sum(p.sent_per_s > 0 for p in step.timeline) >= 1
        for point in step.timeline:  # each second's slowest delivery, for locating a tail
            if point.delivered_per_s:
                assert point.p99_ms is not None and point.max_ms is not None
                assert 0 < point.p99_ms <= point.max_ms <= lat["max"]
    return steps


def test_the_drivers_own_collector_never_runs_inside_a_step(tmp_path: Path) -> None:
    """Even with a collection due at every allocation (a threshold of 1, set at the
    driver's start by a sitecustomize), none runs from a step's start to its drain's end."""
    (tmp_path / "sitecustomize.py").write_text("import gc\ngc.set_threshold(1)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = tmp_path / "steps.json"
    with running_relay("picows") as url:
        result = run_driver(
            *("--target", "relay", "--url", url, *SHORT_RUN, "--json-out", str(out)), env=env
        )
    assert result.returncode == 0, result.stderr
    steps = assert_complete_steps(out, (200, 400), connections=20)
    assert [s.generator_gc_runs for s in steps] == [0, 0]


def test_driver_delivers_every_frame_to_the_whole_room_through_the_relay(
    relay_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "steps.json"
    result = run_driver("--target", "relay", "--url", relay_url, *SHORT_RUN, "--json-out", str(out))
    assert result.returncode == 0, result.stderr
    assert_complete_steps(out, (200, 400), connections=20)
    lines = result.stderr.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["rate 200/s", "rate 400/s"], lines


@pytest.mark.parametrize("serializer", ["json", "protobuf"])
def test_driver_delivers_every_frame_to_the_whole_room_of_a_chat_server(
    serializer: str,
    start_server: Callable[..., ServerProcess],
    keys: KeyPair,
    tmp_path: Path,
) -> None:
    server = start_server(
        serializer=serializer, rate_limit_per_s=1000, rate_limit_burst=1000, log_level="warning"
    )
    token_file = tmp_path / "tokens"
    tokens = {f"lab{i}": keys.mint(f"lab{i}") for i in range(10)}
    if serializer == "json":  # both token file forms: loadtest.seed's JSON, and lines
        token_file.write_text(json.dumps(tokens))
    else:
        token_file.write_text("\n".join(tokens.values()) + "\n")
    out = tmp_path / "steps.json"
    result = run_driver(
        *("--target", "chat", "--url", server.url, "--serializer", serializer),
        *("--token-file", str(token_file), *SHORT_RUN, "--json-out", str(out)),
    )
    assert result.returncode == 0, result.stderr
    for step in assert_complete_steps(out, (200, 400), connections=20):
        assert set(step.ack_latency_ms) == set(PERCENTILES)
        assert 0 < step.ack_latency_ms["p50"] <= step.ack_latency_ms["max"]


def test_driver_speaks_wss_verified_against_the_ca_file_and_reads_the_servers_cpu(
    start_server: Callable[..., ServerProcess],
    keys: KeyPair,
    ca: ThrowawayCA,
    wrong_ca: ThrowawayCA,
    tmp_path: Path,
) -> None:
    server = start_server(
        ca_file=ca.ca_file,
        tls_cert_file=ca.cert_file,
        tls_key_file=ca.key_file,
        rate_limit_per_s=1000,
        rate_limit_burst=1000,
        log_level="warning",
    )
    assert server.url.startswith("wss://")
    token_file = tmp_path / "tokens.json"
    token_file.write_text(json.dumps({f"lab{i}": keys.mint(f"lab{i}") for i in range(10)}))
    out = tmp_path / "steps.json"
    common = ("--target", "chat", "--url", server.url, "--token-file", str(token_file))
    result = run_driver(
        *common,
        *("--ca-file", str(ca.ca_file), "--server-pid", str(server.proc.pid)),
        *(*SHORT_RUN, "--json-out", str(out)),
    )
    assert result.returncode == 0, result.stderr
    for step in assert_complete_steps(out, (200, 400), connections=20):
        # the TLS work is the server's own threads': counted in its CPU per frame
        assert step.server_us_per_frame is not None and step.server_us_per_frame > 0
        assert step.proxy_cpu_s is None and step.proxy_us_per_frame is None
    refused = run_driver(*common, "--ca-file", str(wrong_ca.ca_file), *SHORT_RUN)
    assert refused.returncode == 1, refused.stderr
    assert "SSLCertVerificationError" in refused.stderr


def test_with_retry_a_killed_server_is_reconnected_and_nothing_is_stored_twice(
    start_server: Callable[..., ServerProcess], keys: KeyPair, tmp_path: Path
) -> None:
    server = start_server(rate_limit_per_s=1000, rate_limit_burst=1000, log_level="warning")
    token_file = tmp_path / "tokens"
    token_file.write_text("\n".join(keys.mint(f"lab{i}") for i in range(10)) + "\n")
    out = tmp_path / "steps.json"
    driver = subprocess.Popen(
        [
            *(sys.executable, "-m", "bench.lab.driver", "--target", "chat", "--retry"),
            *("--url", server.url, "--token-file", str(token_file), "--connections", "20"),
            *("--rates", "200", "--step-s", "5", "--warmup-s", "0.5", "--drain-s", "3"),
            *("--json-out", str(out)),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # the kill lands in the driver's step (after its 0.5 s warm-up, 5 s long): a moment in
    # the driver's own schedule, which is what is tested
    time.sleep(3)
    server.kill()  # kill -9: sends in flight are answered by nobody
    time.sleep(0.3)  # down a moment: every connection is lost, not just paused
    server.start()  # same port, same database
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 0, stderr
    (step,) = [Step.from_dict(s) for s in json.loads(out.read_text())]
    assert step.retries.get("reconnects") == 20, step.retries
    stored: list[str] = []
    for room in ("lab-0", "lab-1"):
        before = None
        while True:
            page = asyncio.run(_history_page(server, keys, room, before))
            if not page:
                break
            stored += [m.ref or "" for m in page]
            before = page[0].seq
    assert stored and all(stored)
    assert len(stored) == len(set(stored))  # every send (and resend) stored once


async def _history_page(server: ServerProcess, keys: KeyPair, room: str, before: int | None):
    from chat_server.messages import History, HistoryRequest, Welcome
    from tests.support import Client

    client = await Client.connect(server, keys.mint("reader"))
    try:
        await client.expect(Welcome)
        await client.send(HistoryRequest(room=room, before=before, limit=500))
        return (await client.expect(History)).messages
    finally:
        await client.close()


def test_error_frames_and_closes_count_as_errors(
    start_server: Callable[..., ServerProcess], keys: KeyPair, tmp_path: Path
) -> None:
    # 3 connections at 150/s each against the default 20/s (burst 100) per connection
    server = start_server(log_level="warning")
    token_file = tmp_path / "tokens"
    token_file.write_text(keys.mint("lab0") + "\n")
    out = tmp_path / "steps.json"
    result = run_driver(
        *("--target", "chat", "--url", server.url, "--token-file", str(token_file)),
        *("--connections", "3", "--rates", "450", "--step-s", "1.5", "--warmup-s", "0"),
        *("--drain-s", "0.5", "--json-out", str(out)),
    )
    assert result.returncode == 0, result.stderr
    [step] = [Step.from_dict(s) for s in json.loads(out.read_text())]
    assert step.error_detail.get("rate_limited", 0) > 0, step.error_detail
    assert step.errors == sum(step.error_detail.values())
    assert step.delivered < step.expected


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--target", "relay", "--rates", "0"), "--rates"),
        (("--target", "relay", "--rates", "fast"), "--rates"),
        (
            (
                "--target",
                "chat",
            ),
            "--token-file",
        ),
        (("--target", "relay", "--connections", "0"), "--connections"),
        (("--target", "relay", "--body-chars", "5"), "--body-chars"),
        (("--target", "relay", "--cpu-affinity", "999"), "--cpu-affinity"),
        (("--target", "relay", "--url", "http://x/ws"), "--url"),
    ],
)
def test_a_bad_argument_exits_2_naming_it(args: tuple[str, ...], named: str) -> None:
    result = run_driver(*args, timeout_s=30)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr


def test_connections_that_cannot_open_exit_1(tmp_path: Path) -> None:
    url = f"ws://127.0.0.1:{free_port()}/ws"  # nobody listens there
    result = run_driver("--target", "relay", "--url", url, "--connections", "3", timeout_s=30)
    assert result.returncode == 1, result.stderr
    assert "could not open" in result.stderr


@pytest.mark.parametrize("serializer", ["json", "orjson", "protobuf"])
def test_a_spliced_frame_is_what_the_codec_encodes_for_that_time(serializer: str) -> None:
    codec = get_codec(serializer)
    frame, digits, ref_digits = send_frame(codec, "lab-12", body_chars=40)
    assert ref_digits is None
    frame[digits] = b"%019d" % 1234567890123
    body = MARKER.decode() + f"{1234567890123:019d}" + "x" * (40 - len(MARKER) - DIGITS)
    assert bytes(frame) == codec.encode_client(Send(room="lab-12", body=body))
    # --retry: the ref carries the same digits
    frame, digits, ref_digits = send_frame(codec, "lab-12", body_chars=40, with_ref=True)
    assert ref_digits is not None
    frame[digits] = frame[ref_digits] = b"%019d" % 1234567890123
    sent = Send(room="lab-12", body=body, ref=f"{1234567890123:019d}")
    assert bytes(frame) == codec.encode_client(sent)


def test_latencies_added_in_bulk_count_as_if_recorded_one_by_one() -> None:
    rng = random.Random(7)
    values = [rng.choice((rng.randint(0, 3000), rng.randint(0, 5_000_000))) for _ in range(5000)]
    one_by_one = HdrHistogram(1, 60_000_000, 3)
    for v in values:
        one_by_one.record_value(v)
    bulk = LatencyHistogram()
    bulk.add(np.array(values[:2500], dtype=np.int64))
    bulk.add(np.array(values[2500:], dtype=np.int64))
    assert bulk.count == len(values)
    hdr = bulk.to_hdr()
    assert list(hdr.counts) == list(one_by_one.counts)
    assert hdr.get_max_value() == one_by_one.get_max_value()
    for q in (1, 50, 90, 99, 99.9, 100):
        assert hdr.get_value_at_percentile(q) == one_by_one.get_value_at_percentile(q)
        assert bulk.value_at_percentile(q) == one_by_one.get_value_at_percentile(q)
    assert bulk.percentiles_ms()["max"] == one_by_one.get_max_value() / 1000


@pytest.mark.parametrize("transport", ["websockets", "picows"])
async def test_both_relays_send_every_frame_verbatim_to_their_whole_room(transport: str) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    with running_relay(transport) as url:
        async with (
            connect(f"{url}?room=a", compression=None) as a1,
            connect(f"{url}?room=a", compression=None) as a2,
            connect(f"{url}?room=b", compression=None) as b1,
        ):
            await a1.send("hello")
            assert [await a1.recv(), await a2.recv()] == ["hello", "hello"]
            await a2.send(b"\x00\x01")
            assert [await a1.recv(), await a2.recv()] == [b"\x00\x01", b"\x00\x01"]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(b1.recv(), 0.2)
        async with connect(url, compression=None) as nowhere:
            with pytest.raises(ConnectionClosed) as closed:
                await nowhere.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


@pytest.mark.parametrize("server_deflate", ["on", "shared", "off"])
def test_driver_compresses_both_ways_when_the_server_accepts_deflate(
    server_deflate: str,
    start_server: Callable[..., ServerProcess],
    keys: KeyPair,
    tmp_path: Path,
) -> None:
    # the server inflates what it reads and deflates every broadcast: a delivery the
    # driver did not inflate has no marker to find, a send it did not deflate right closes
    server = start_server(
        transport="websockets",
        ws_deflate=server_deflate,
        rate_limit_per_s=1000,
        rate_limit_burst=1000,
        log_level="warning",
    )
    token_file = tmp_path / "tokens"
    token_file.write_text(keys.mint("lab0") + "\n")
    out = tmp_path / "steps.json"
    result = run_driver(
        *("--target", "chat", "--url", server.url, "--token-file", str(token_file)),
        *(*SHORT_RUN, "--deflate", "on", "--json-out", str(out)),
    )
    assert result.returncode == 0, result.stderr
    for step in assert_complete_steps(out, (200, 400), connections=20):
        assert step.deflate is (server_deflate != "off")
        assert step.frame_bytes > step.body_chars == MIN_BODY_CHARS


@pytest.mark.parametrize("relay_deflate", ["on", "off"])
def test_driver_measures_its_ceiling_with_deflate_through_the_deflate_relay(
    relay_deflate: str, tmp_path: Path
) -> None:
    # `bench.lab ceiling --deflate on` climbs this relay: it must compress what it relays
    out = tmp_path / "steps.json"
    with running_relay("websockets", deflate=relay_deflate) as url:
        result = run_driver(
            *("--target", "relay", "--url", url, *SHORT_RUN),
            *("--deflate", "on", "--json-out", str(out)),
        )
    assert result.returncode == 0, result.stderr
    for step in assert_complete_steps(out, (200, 400), connections=20):
        assert step.deflate is (relay_deflate == "on")


def test_the_picows_relay_refuses_deflate() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.relay", "--transport", "picows", "--deflate", "on"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2 and "no permessage-deflate" in result.stderr


def test_negotiated_deflate_reads_the_servers_reply() -> None:
    assert negotiated_deflate(None) is None
    assert negotiated_deflate("x-other") is None
    assert "permessage-deflate" in DEFLATE_OFFER and "client_max_window_bits" in DEFLATE_OFFER
    agreed = negotiated_deflate("permessage-deflate; server_max_window_bits=12")
    assert agreed is not None and agreed.remote_max_window_bits == 12


def test_a_climb_stops_at_the_highest_rate_when_every_step_holds(tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    with running_relay("picows") as url:
        result = run_driver(
            *("--target", "relay", "--url", url, "--connections", "20", "--rates", "100"),
            *("--climb", "p99=5000", "--factor", "2", "--max-rate", "200", "--step-s", "1"),
            *("--warmup-s", "0", "--drain-s", "0.5", "--json-out", str(out)),
        )
    assert result.returncode == 0, result.stderr
    steps = [Step.from_dict(s) for s in json.loads(out.read_text())]
    assert [s.offered_per_s for s in steps] == [100, 200]
    assert all(s.holds({"p99": 5000}) and not s.superseded for s in steps)


def _climb_config(**given: float) -> DriverConfig:
    return DriverConfig(
        target="relay",
        url="ws://x/ws",
        serializer="orjson",
        tokens=(),
        connections=10,
        room_size=10,
        room_prefix="lab",
        rates=(1000.0,),
        step_s=1,
        warmup_s=0,
        drain_s=0,
        body_chars=MIN_BODY_CHARS,
        json_out=None,
        cores=None,
        event_loop="asyncio",
        connect_timeout_s=1,
        **given,
    )


def test_a_climb_multiplies_while_it_holds_then_bisects_to_the_resolution() -> None:
    config = _climb_config(factor=1.4, resolution=0.05, max_rate=10_000, min_rate=100)
    inf = float("inf")
    assert next_climb_rate(1000, 1000, inf, config) == pytest.approx(1400)
    assert next_climb_rate(9000, 9000, inf, config) == 10_000  # capped
    assert next_climb_rate(10_000, 10_000, inf, config) is None  # held at the top
    assert next_climb_rate(1000, 0, 1000, config) == pytest.approx(1000 / 1.4)  # down
    assert next_climb_rate(110, 0, 110, config) is None  # below min_rate
    assert next_climb_rate(1960, 1400, 1960, config) == pytest.approx((1400 * 1960) ** 0.5)
    assert next_climb_rate(1440, 1400, 1440, config) is None  # within 5 %
    # from 1000 held and 1400 broken, three bisections reach 5 %
    held, broke, rate, steps = 1000.0, 1400.0, 1400.0, 0
    while (following := next_climb_rate(rate, held, broke, config)) is not None:
        rate, steps = following, steps + 1
        held, broke = (rate, broke) if rate < 1200 else (held, rate)
    assert steps == 3 and broke / held <= 1.05


def test_a_stalled_second_passes_ten_times_the_median_or_delivers_nothing() -> None:
    def point(t: float, p99: float | None, delivered: float = 100.0) -> TimePoint:
        return TimePoint(t_s=t, delivered_per_s=delivered, p99_ms=p99)

    calm = [point(1, 3.0), point(2, 4.0), point(3, 29.0)]
    assert stalled_points(calm) == []
    gc = [point(1, 3.0), point(2, 145.0), point(3, 4.0)]
    assert [p.t_s for p in stalled_points(gc)] == [2]
    silent = [point(1, 3.0), point(2, None, delivered=0), point(3, 4.0)]
    assert [p.t_s for p in stalled_points(silent)] == [2]


def test_a_stalled_step_is_run_again_when_it_held_or_broke_only_in_its_stall() -> None:
    def step(p99s: list[float | None], p99_ms: float, delivered: int = 1000) -> Step:
        timeline = [
            TimePoint(t_s=t, delivered_per_s=0 if p is None else 100.0, p99_ms=p)
            for t, p in enumerate(p99s, 1)
        ]
        made = Step(
            driver="fast",
            name="rate 100/s",
            connections=10,
            offered_per_s=100,
            duration_s=len(p99s),
            sent=100,
            delivered=delivered,
            expected=1000,
            sent_per_s=100,
            delivered_per_s=delivered / len(p99s),
            latency_ms={"p99": p99_ms},
            timeline=timeline,
        )
        made.stall_s = [p.t_s for p in stalled_points(timeline)]
        return made

    slo = {"p99": 100.0}
    held_through_a_stall = step([3.0, 60.0, 4.0, 3.0], p99_ms=50)
    assert held_through_a_stall.stall_s == [2] and worth_a_rerun(held_through_a_stall, slo)
    # broke, but only in the stalled second (a GC pause, not an overload): run again
    passing_stall = step([3.0, 900.0, 4.0, 3.0], p99_ms=800)
    assert passing_stall.stall_s == [2] and worth_a_rerun(passing_stall, slo)
    # a second that delivered nothing is a stall too; the rest kept the SLO
    silent = step([3.0, None, 4.0, 3.0], p99_ms=400)
    assert silent.stall_s == [2] and worth_a_rerun(silent, slo)
    # broke outside its stall as well: an overload, the climb takes it as broken
    overloaded = step([3.0, 2000.0, 150.0, 180.0], p99_ms=1500)
    assert overloaded.stall_s == [2] and not worth_a_rerun(overloaded, slo)
    # something lost: not held, and the calm seconds decide
    lost = step([3.0, 900.0, 120.0, 3.0], p99_ms=800, delivered=990)
    assert not worth_a_rerun(lost, slo)


def test_the_one_builder_of_the_drivers_command_line_reads_back_to_the_same_values(
    tmp_path: Path,
) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text('{"u": "t"}')
    built = DriverArgs(
        target="chat",
        url="ws://127.0.0.1:9/ws",
        connections=20,
        room_size=5,
        rates=(100.0, 250.5),
        step_s=1.5,
        warmup_s=0.5,
        drain_s=0.25,
        cpu_affinity="1",
        serializer="protobuf",
        token_file=tokens,
        json_out=tmp_path / "out.json",
        t0_monotonic=12.345678,
        deflate=True,
        climb="p99=100",
        factor=1.6,
        resolution=0.1,
        max_rate=4000.0,
        cost_rates=(50.0, 75.0),
        cost_step_s=3.0,
        server_pid=os.getpid(),
        lab_pid=os.getppid(),
        retry=True,
        continuous=True,
        server_cores="0",
        ca_file=str(tokens),
        proxy_pid=os.getpid(),
    )
    config = parse_args(built.argv())
    assert (config.target, config.url, config.serializer) == ("chat", built.url, "protobuf")
    assert (config.connections, config.room_size, config.rates) == (20, 5, (100.0, 250.5))
    assert (config.step_s, config.warmup_s, config.drain_s) == (1.5, 0.5, 0.25)
    assert config.cores == (1,) and config.tokens == ("t",) and config.json_out == built.json_out
    assert config.t0_monotonic == 12.345678 and config.deflate and config.retry
    assert config.continuous
    assert config.climb_slo == {"p99": 100.0}
    assert (config.factor, config.resolution, config.max_rate) == (1.6, 0.1, 4000.0)
    assert (config.cost_rates, config.cost_step_s) == ((50.0, 75.0), 3.0)
    assert (config.server_pid, config.lab_pid) == (os.getpid(), os.getppid())
    assert config.server_cores == (0,)
    assert (config.ca_file, config.proxy_pid) == (str(tokens), os.getpid())
    assert built.command()[1:3] == ["-m", "bench.lab.driver"]
    # what is left unset keeps the driver's defaults
    plain = parse_args(DriverArgs("relay", "ws://h:1/ws", 10, (5.0,), 1, 0, 0).argv())
    assert plain.climb_slo is None and plain.cost_rates == () and plain.server_pid is None
    assert plain.server_cores is None
    assert plain.ca_file == "" and plain.proxy_pid is None
