"""The Locust load test, run as users run it: ``locust -f loadtest/chat.py --headless``.

Real auth service, real chat servers and the relay on free ports; Locust only as a
subprocess. The profile and threshold parsers are tested in-process (pure code).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from chatlab.harness import AuthProcess, KeyPair, ServerProcess, free_port
from chatlab.throwaway_ca import ThrowawayCA
from loadtest.profiles import (
    PROFILES,
    QUIET_TAIL_S,
    Profile,
    Schedule,
    Stage,
    judge,
    parse_duration,
    parse_pause,
    parse_slo,
    parse_stages,
)
from tests.support.locust import LOAD_TEST_AUTH, LOCUST, LocustRun, run_command, run_locust

SMOKE_USERS = 20
ROOM_SIZE = 10


def _token_file(path: Path, keys: KeyPair, users: int) -> Path:
    """Tokens minted for load0..load{users-1}, as ``--token-file`` reads them."""
    path.write_text(json.dumps({f"load{i}": keys.mint(f"load{i}") for i in range(users)}))
    return path


def _assert_clean_delivery(run: LocustRun) -> None:
    """No failures anywhere, and every message reached every member that was in its room."""
    assert run.returncode == 0, run.output
    for name in ("fanout", "ack", "connect"):
        assert run.count(name) > 0, run.output
    assert run.failures == [], run.failures
    assert int(run.entry("Aggregated")["Failure Count"]) == 0
    deliveries = run.report["deliveries"]
    assert deliveries["sent"] > 0
    assert deliveries["acked"] == deliveries["sent"], deliveries
    assert deliveries["missing"] == deliveries["unacked"] == deliveries["duplicates"] == 0
    assert deliveries["server_errors"] == deliveries["unexpected_closes"] == 0
    assert deliveries["delivered"] == run.count("fanout")
    assert run.count("ack") == deliveries["sent"]
    assert "chatlab verdict" in run.output


# ---- full runs -----------------------------------------------------------------------


# its verdict fails when the generator falls behind: alone, after the parallel tests
@pytest.mark.owns_machine
def test_smoke_run_logs_users_in_and_delivers_every_message(
    tmp_path: Path, load_test_auth: AuthProcess, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(jwt_public_key=str(load_test_auth.public_path), log_level="warning")
    run = run_locust(
        tmp_path,
        "-H",
        server.url,
        "--load-profile",
        "smoke",
        "--auth-url",
        load_test_auth.url(),
        "--auth-mode",
        "login",
    )
    _assert_clean_delivery(run)
    assert run.count("login") == SMOKE_USERS
    assert run.count("connect") == SMOKE_USERS
    # a member joining mid-run is owed the messages after its join; the sender's own echo counts
    assert run.report["deliveries"]["delivered"] <= run.report["deliveries"]["sent"] * ROOM_SIZE


# its verdict fails when the generator falls behind: alone, after the parallel tests
@pytest.mark.owns_machine
def test_a_protobuf_prelogin_run_on_two_processes_delivers_to_every_member(
    tmp_path: Path, load_test_auth: AuthProcess, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(
        jwt_public_key=str(load_test_auth.public_path), serializer="protobuf", log_level="warning"
    )
    # the smoke profile's users in under half its time (the profile has its own run above)
    run = run_locust(
        tmp_path,
        "-H",
        server.url,
        "--stages",
        f"2s:{SMOKE_USERS}@10,3s:{SMOKE_USERS},2s:{SMOKE_USERS}:quiet",
        "--serializer",
        "protobuf",
        "--auth-url",
        load_test_auth.url(),
        "--auth-mode",
        "prelogin",
        "--processes",
        "2",
    )
    _assert_clean_delivery(run)
    assert run.count("login") == SMOKE_USERS
    assert run.report["generator"]["processes"] == 2
    # prelogin: nobody sends before every user has joined, so each message reaches exactly
    # the ROOM_SIZE members of its room (two processes, one full room each)
    deliveries = run.report["deliveries"]
    assert deliveries["delivered"] == deliveries["sent"] * ROOM_SIZE


def test_a_login_refused_503_and_retried_is_counted_apart_not_as_a_failure(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    # one hashing job at a time (HASH_QUEUE_MAX=1), each about 0.1 s: of two users
    # logging in 10 ms apart, the second is refused 503 and its retry a second later taken
    (tmp_path / "auth").mkdir()
    slow_one_at_a_time = {"ARGON2_MEMORY_COST_KIB": "65536", "HASH_QUEUE_MAX": "1"}
    auth = AuthProcess(tmp_path / "auth", **{**LOAD_TEST_AUTH, **slow_one_at_a_time}).start()
    try:
        server = start_server(jwt_public_key=str(auth.public_path), log_level="warning")
        run = run_locust(
            tmp_path,
            "-H",
            server.url,
            "--stages",
            "2s:2@100,2s:2,2s:2:quiet",  # a short quiet tail: every message in flight arrives
            "--pause",
            "0.2-0.3",
            "--auth-url",
            auth.url(),
            "--auth-mode",
            "login",
        )
    finally:
        auth.stop()
    assert run.report["auth"]["retried"] >= 1, run.output  # what is tested happened
    _assert_clean_delivery(run)  # exit 0, no failure in any entry
    assert run.count("login") == 2
    assert "auth: calls answered 429/503 and retried after Retry-After: " in run.output


def test_users_log_in_over_https_and_chat_over_wss_verified_against_the_ca_file(
    tmp_path: Path,
    start_server: Callable[..., ServerProcess],
    ca: ThrowawayCA,
    wrong_ca: ThrowawayCA,
) -> None:
    tls = {"TLS_CERT_FILE": str(ca.cert_file), "TLS_KEY_FILE": str(ca.key_file)}
    (tmp_path / "auth").mkdir()
    auth = AuthProcess(tmp_path / "auth", ca_file=ca.ca_file, **LOAD_TEST_AUTH, **tls).start()
    try:
        server = start_server(
            ca_file=ca.ca_file, jwt_public_key=str(auth.public_path), log_level="warning", **tls
        )
        assert server.url.startswith("wss://") and auth.url().startswith("https://")
        common = ["-H", server.url, "--auth-url", auth.url(), "--auth-mode", "login"]
        run = run_locust(
            tmp_path,
            *common,
            "--stages",
            "2s:4@100,3s:4,2s:4:quiet",
            "--pause",
            "0.2-0.3",
            "--ca-file",
            str(ca.ca_file),
        )
        # a CA that did not sign the services' certificate: nothing is believed, the run stops
        (tmp_path / "wrong").mkdir()
        wrong = ["--ca-file", str(wrong_ca.ca_file)]
        refused = run_locust(tmp_path / "wrong", *common, "--load-profile", "smoke", *wrong)
    finally:
        auth.stop()
    _assert_clean_delivery(run)
    assert run.count("login") == 4
    # every member in the room got every message (missing == 0 above); a send made before
    # the fourth user joined reaches three, so the fan-out is over two per send, not
    # exactly four (383 of 96 x 4 in one CI run)
    assert run.report["deliveries"]["delivered"] > 2 * run.report["deliveries"]["sent"]
    assert refused.returncode == 2, refused.output
    assert "(SSLCertVerificationError)" in refused.output
    assert "fanout" not in refused.stats


def test_an_unreachable_auth_service_stops_the_run_with_one_clear_line(tmp_path: Path) -> None:
    nobody = free_port()
    run = run_locust(
        tmp_path,
        "-H",
        f"ws://127.0.0.1:{free_port()}/ws",
        "--load-profile",
        "smoke",
        "--auth-url",
        f"http://127.0.0.1:{nobody}",
    )
    assert run.returncode == 2, run.output
    reason = f"auth service unreachable at http://127.0.0.1:{nobody} (ConnectionRefusedError)"
    assert f"chatlab: run stopped: {reason}" in run.output
    assert "make loadtest-services" in run.output
    assert "login" not in run.stats, run.stats  # not one failed login per user
    assert run.failures == []


def test_seed_registers_users_once_and_writes_tokens(
    tmp_path: Path, load_test_auth: AuthProcess
) -> None:
    tokens_path = tmp_path / "tokens.json"
    command = [
        sys.executable,
        "-m",
        "loadtest.seed",
        "--users",
        "5",
        "--auth-url",
        load_test_auth.url(),
    ]
    first = run_command(*command, "--token-file", str(tokens_path))
    assert first.returncode == 0, first.stderr
    assert "5 registered, 0 already there, 0 failed" in first.stdout
    assert sorted(json.loads(tokens_path.read_text())) == [f"load{i}" for i in range(5)]
    again = run_command(*command)
    assert again.returncode == 0, again.stderr
    assert "0 registered, 5 already there" in again.stdout


def test_impossible_slo_exits_1_with_a_verdict(
    tmp_path: Path, keys: KeyPair, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(log_level="warning")
    tokens = _token_file(tmp_path / "tokens.json", keys, 4)
    run = run_locust(
        tmp_path,
        "-H",
        server.url,
        "--stages",
        "2s:4@4,2s:4,1s:4:quiet",  # a short quiet tail: the verdict needs none
        "--pause",
        "0.05-0.1",
        "--auth-mode",
        "prelogin",
        "--token-file",
        str(tokens),
        "--slo",
        "p50=1000,p99.9=0",
    )
    assert run.returncode == 1, run.output
    assert run.failures == [], run.failures
    verdicts = {v["name"]: v for v in run.report["slo"]["thresholds"]}
    assert verdicts["p50"]["passed"] is True
    assert verdicts["p99.9"]["passed"] is False
    assert "BROKEN (exit code 1)" in run.output


def test_server_closing_users_gives_failures_with_reasons(
    tmp_path: Path, keys: KeyPair, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(rate_limit_per_s=2, rate_limit_burst=2, log_level="warning")
    tokens = _token_file(tmp_path / "tokens.json", keys, 4)
    run = run_locust(
        tmp_path,
        "-H",
        server.url,
        "--stages",
        "1s:4@4,4s:4,1s:4:quiet",  # a short quiet tail: the closes came before it
        "--pause",
        "0.02-0.03",
        "--token-file",
        str(tokens),
    )
    assert run.returncode == 1, run.output
    reasons = {(row["Name"], row["Error"]) for row in run.failures}
    assert any(name == "ack" and "rate_limited" in error for name, error in reasons), reasons
    assert any(
        name == "connect" and "closed by the server: 1008" in error for name, error in reasons
    ), reasons
    assert run.report["deliveries"]["unexpected_closes"] > 0


def test_sends_behind_schedule_are_reported_as_generator_overload(
    tmp_path: Path, relay_url: str
) -> None:
    run = run_locust(
        tmp_path,
        "-H",
        relay_url,
        "--target",
        "relay",
        "--stages",
        "2s:100@50,4s:100,1s:100:quiet",  # a short quiet tail: the overload came before it
        "--pause",
        "0.001-0.002",
    )
    assert run.count("fanout") > 0
    assert run.fails("generator_overload") > 0, run.output
    assert run.report["generator"]["overloaded"] is True
    assert run.report["generator"]["late_sends"] > 0
    assert "WARNING: the load generator was overloaded" in run.output
    assert run.returncode == 1  # overload is a failure: the numbers include the generator's delay


def test_help_lists_the_custom_options() -> None:
    result = run_command(sys.executable, "-m", "loadtest.chat", "--help")
    assert result.returncode == 0, result.stderr
    for option in (
        "--load-profile",
        "--stages",
        "--auth-url",
        "--auth-mode",
        "--room-size",
        "--slo",
        "--target",
    ):
        assert option in result.stdout


def test_bad_stage_table_stops_locust_at_start_naming_it(tmp_path: Path) -> None:
    result = run_command(*LOCUST, "--headless", "--stages", "30s:twenty", cwd=tmp_path)
    assert result.returncode == 2
    assert "30s:twenty" in result.stderr


# ---- profiles and thresholds (pure) ------------------------------------------------------


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_every_profile_ends_by_itself_after_a_quiet_tail(profile: Profile) -> None:
    schedule = Schedule(profile.stages)
    assert math.isfinite(schedule.duration_s)
    assert schedule.at(schedule.duration_s) is None
    last = schedule.at(schedule.duration_s - 0.01)
    assert last is not None and last.quiet
    first_quiet = next(s for s in profile.stages if s.quiet)
    assert first_quiet.duration_s >= min(QUIET_TAIL_S, 4)
    low, high = profile.pause_s
    assert 0 < low <= high


def test_smoke_profile_is_under_30_seconds() -> None:
    assert Schedule(PROFILES["smoke"].stages).duration_s < 30


def test_report_profile_is_the_labs_run() -> None:
    profile = PROFILES["report"]
    schedule = Schedule(profile.stages)
    assert schedule.peak_users == 250
    assert schedule.at(59) is not None and schedule.at(59).spawn_rate == pytest.approx(
        250 / 60, 1e-2
    )
    assert schedule.at(100).users == 250 and not schedule.at(100).quiet
    assert profile.pause_s == (0.3, 0.5)


def test_stage_syntax_with_rates_quiet_and_tail() -> None:
    stages = parse_stages("30s:20@5,1m:20,30s:0")
    assert stages == (
        Stage(30, 20, 5),
        Stage(60, 20),
        Stage(30, 0),
        Stage(QUIET_TAIL_S, 0, quiet=True),
    )
    assert parse_stages("10s:5,5s:5:quiet") == (Stage(10, 5), Stage(5, 5, quiet=True))
    schedule = Schedule(parse_stages("30s:20@5,1m:20,30s:0"))
    assert schedule.at(0).spawn_rate == 5
    assert schedule.at(100).spawn_rate == pytest.approx(20 / 30, 1e-2)


@pytest.mark.parametrize("bad", ["", "30s", "30s:x", "0s:5", "30s:5@0", "30s:5:loud", "1x:5"])
def test_bad_stages_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"stage|duration"):
        parse_stages(bad)


def test_durations_and_pauses() -> None:
    assert parse_duration("90") == parse_duration("1m30s") == 90
    assert parse_duration("2m") == 120
    assert parse_pause("0.3-0.5") == (0.3, 0.5)
    assert parse_pause("1") == (1.0, 1.0)
    for bad in ("0.5-0.3", "0", "x"):
        with pytest.raises(ValueError):
            parse_pause(bad)


def test_slo_parsing_and_judging() -> None:
    slo = parse_slo("p90=200,p95=500,p99.9=1000")
    assert slo == {
        "p90": (pytest.approx(0.9), 200.0),
        "p95": (pytest.approx(0.95), 500.0),
        "p99.9": (pytest.approx(0.999), 1000.0),
    }
    measured = {"p90": 150, "p95": 600, "p99.9": 900}
    by_quantile = {quantile: measured[name] for name, (quantile, _) in slo.items()}
    verdicts = judge(slo, by_quantile.__getitem__, samples=10)
    assert [v.passed for v in verdicts] == [True, False, True]
    assert all(not v.passed for v in judge(slo, by_quantile.__getitem__, samples=0))
    assert parse_slo("") == {}
    for bad in ("p100=5", "90=200", "p90=", "p90=fast"):
        with pytest.raises(ValueError):
            parse_slo(bad)


_NEGOTIATED = """
import sys
from loadtest.client import WsConnection
url, token, deflate = sys.argv[1], sys.argv[2], sys.argv[3] == "on"
conn = WsConnection(url, headers={"Authorization": "Bearer " + token}, deflate=deflate)
print([type(e).__name__ for e in conn.protocol.extensions])
"""


@pytest.mark.parametrize(
    ("server_deflate", "client_deflate", "negotiated"),
    [("on", "on", True), ("on", "off", False), ("off", "on", False)],
)
def test_the_load_client_offers_permessage_deflate_as_browsers_do(
    start_server: Callable[..., ServerProcess],
    keys: KeyPair,
    server_deflate: str,
    client_deflate: str,
    negotiated: bool,
) -> None:
    server = start_server(ws_deflate=server_deflate, log_level="warning")
    done = run_command(
        sys.executable, "-c", _NEGOTIATED, server.url, keys.mint("alice"), client_deflate
    )
    assert done.returncode == 0, done.stderr
    assert ("PerMessageDeflate" in done.stdout) is negotiated, done.stdout
