"""deploy/grafana/chatlab.json: a Grafana 10 dashboard on the recording rules.

Grafana itself is not installed here: the test checks the dashboard JSON model's
structure, that every expression names series the rules or the services produce,
and runs each expression against the real Prometheus of ``observed``.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import wait_until
from tests.support.prometheus import DEPLOY, Observed, needs_prometheus, recording_rules

DASHBOARD = DEPLOY / "grafana" / "chatlab.json"
PANEL_TYPES = {"row", "timeseries", "stat"}
#: what the dashboard must show (README, Monitoring), each a word of some panel's title
SUBJECTS = ("per second", "SLO", "Connections", "CPU", "GC pauses", "loop lag")
#: PromQL words that are not series names
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "on", "ignoring", "group_left",
    "group_right", "and", "or", "unless", "rate", "irate", "increase", "histogram_quantile",
    "clamp_min", "clamp_max", "vector", "scalar", "abs", "round", "offset", "bool",
}  # fmt: skip
#: the template variables' values when the expressions run against the test's Prometheus
VARIABLES = {"$job": "chat", "$auth_job": "auth"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p["targets"]]


def series_names(expr: str) -> set[str]:
    """The series an expression reads: its identifiers outside label matchers and strings."""
    bare = re.sub(r"\{[^}]*\}|\"[^\"]*\"|\[[^\]]*\]", " ", expr)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return {w for w in words if w not in PROMQL_WORDS and not re.fullmatch(r"e\d*", w)}


def test_the_dashboard_is_a_grafana_10_model(dashboard: dict[str, Any]):
    assert dashboard["uid"] and dashboard["title"] == "chatlab"
    assert dashboard["schemaVersion"] >= 36  # Grafana 9.x/10.x
    assert dashboard["id"] is None  # importable anywhere
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"job", "auth_job"} <= variables.keys()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in dashboard["panels"])
    for subject in SUBJECTS:
        assert subject in titles, subject
    for panel in dashboard["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$\w+", target["expr"]))
            assert used <= {f"${name}" for name in variables}, target["expr"]


def test_the_latency_panel_draws_the_slo_line(dashboard: dict[str, Any]):
    (latency,) = [p for p in _panels(dashboard) if "against the SLO" in p["title"]]
    defaults = latency["fieldConfig"]["defaults"]
    assert defaults["unit"] == "ms"
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    assert [s["value"] for s in defaults["thresholds"]["steps"]] == [None, 100]
    exprs = " ".join(t["expr"] for t in latency["targets"])
    assert "p99" in exprs and "p50" in exprs


def _exposed(port: int) -> set[str]:
    """Every family and sample name a service's /metrics exposes."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


@needs_prometheus
def test_every_expression_names_series_the_rules_or_services_produce(
    dashboard: dict[str, Any], observed: Observed
):
    rules = set(recording_rules())
    produced = rules | _exposed(observed.metrics_port) | _exposed(observed.auth.port)
    for expr in _expressions(dashboard):
        names = series_names(expr)
        assert names, expr
        assert names <= produced, f"{expr}: {names - produced} is produced by nothing"
        assert names & rules, f"{expr}: not built on a recording rule"


@needs_prometheus
def test_every_expression_runs_against_prometheus(dashboard: dict[str, Any], observed: Observed):
    pending = {}
    for expr in _expressions(dashboard):
        ready = expr
        for variable, value in VARIABLES.items():
            ready = ready.replace(variable, value)
        pending[expr] = ready
    for variable in ("job", "auth_job"):
        query = next(v for v in dashboard["templating"]["list"] if v["name"] == variable)
        series = re.fullmatch(r"label_values\((\S+), job\)", query["definition"])
        assert series is not None
        pending[query["definition"]] = series.group(1)

    def answered() -> bool:  # each query in turn, until each had a result
        nonlocal pending
        pending = {e: q for e, q in pending.items() if not observed.prometheus.query(q)}
        return not pending

    asyncio.run(wait_until(answered, 60, lambda: f"no result for {sorted(pending)}", 0.5))
