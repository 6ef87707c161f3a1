"""deploy/prometheus: promtool accepts the files, the alerts' unit tests pass, and a real
Prometheus scraping real services reads every recording rule back."""

from __future__ import annotations

import asyncio
import contextlib
import math
import subprocess
from collections.abc import Callable

from tests.support import wait_until
from tests.support.prometheus import (
    DEPLOY,
    PROMTOOL,
    RULE_FILES,
    Observed,
    needs_prometheus,
    recording_rules,
)

pytestmark = needs_prometheus


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_accepts_the_config_and_the_rules():
    config = _promtool("check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert config.returncode == 0, config.stdout + config.stderr
    rules = _promtool("check", "rules", *map(str, RULE_FILES))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS" in rules.stdout


def test_the_alerts_fire_on_a_burn_a_shortage_or_a_stale_key_set_and_not_for_a_blip():
    tests = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))
    assert tests
    result = _promtool("test", "rules", *map(str, tests))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_recording_rule_reads_back_from_a_real_prometheus(observed: Observed):
    prometheus = observed.prometheus
    expected = recording_rules()
    assert len(expected) == len(set(expected)) > 20
    groups = prometheus.api("rules")["groups"]
    loaded = [r["name"] for g in groups for r in g["rules"] if r["type"] == "recording"]
    alerts = [r["name"] for g in groups for r in g["rules"] if r["type"] == "alerting"]
    assert sorted(loaded) == sorted(expected)
    assert sorted(alerts) == [
        "ChatAckLatencyBudgetBurnFast",
        "ChatAckLatencyBudgetBurnSlow",
        "ChatJwksStale",
        "ChatRedisPrimaryShortOfReplicas",
        "ChatRedisPrimaryUnreachable",
    ]
    missing = set(expected)

    def answered() -> bool:  # each rule in turn, until each had a result
        nonlocal missing
        missing = {name for name in missing if not prometheus.query(name)}
        return not missing

    asyncio.run(wait_until(answered, 60, lambda: f"no result for {sorted(missing)}", 0.5))


def _value(
    observed: Observed, expr: str, until: Callable[[float], bool] = lambda v: v > 0
) -> float:
    """The single sample's value of ``expr`` once ``until`` it (or the last one, after 60 s:
    the caller's assertion then says what it was)."""
    value = math.nan

    def reached() -> bool:
        nonlocal value
        result = observed.prometheus.query(expr)
        value = float(result[0]["value"][1]) if result else math.nan
        return until(value)

    with contextlib.suppress(AssertionError):
        asyncio.run(wait_until(reached, 60, expr, 0.5))
    return value


def test_the_rules_measure_the_traffic(observed: Observed):
    assert observed.traffic_failures == []
    assert _value(observed, 'job:chat_frames_out:rate1m{job="chat"}') > 0
    assert _value(observed, 'job:chat_broadcasts:rate1m{job="chat"}') > 0
    assert _value(observed, 'job:chat_connections:sum{job="chat"}') == 2
    p99 = _value(observed, 'job:chat_ack_latency_ms:p99_5m{job="chat"}')
    assert 0 < p99 <= 5000
    assert _value(observed, 'job_instance:process_cpu_seconds:rate1m{job="auth"}') > 0
    logins = 'job_route_status:auth_requests:rate5m{job="auth",route="/login",status="200"}'
    assert _value(observed, logins) > 0
    codes = observed.prometheus.query('job_code:chat_errors:rate5m{job="chat"}')
    assert {s["metric"]["code"] for s in codes} >= {"bad_request", "rate_limited", "internal"}
    assert all(float(s["value"][1]) == 0 for s in codes)
    # the SLO ratio: a quiet test machine acks well inside 100 ms
    slow = _value(
        observed, 'job:chat_ack_slow:ratio_rate5m{job="chat"}', lambda v: not math.isnan(v)
    )
    assert 0 <= slow < 0.5
