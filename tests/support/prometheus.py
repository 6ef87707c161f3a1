"""Debian's Prometheus run with ``deploy/prometheus``'s rule files, and what a test reads of it."""

from __future__ import annotations

import json
import re
import shutil
import urllib.parse
import urllib.request
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chatlab.harness import (
    ROOT,
    AuthProcess,
    ServerProcess,
    ServiceProcess,
    free_port,
)

__all__ = [
    "DEPLOY",
    "PASSWORD",
    "PROMETHEUS",
    "PROMTOOL",
    "RULE_FILES",
    "Observed",
    "PrometheusProcess",
    "needs_prometheus",
    "recording_rules",
]

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
DEPLOY = ROOT / "deploy"
RULE_FILES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
PASSWORD = "correct horse"

needs_prometheus = pytest.mark.skipif(
    shutil.which(PROMETHEUS) is None or shutil.which(PROMTOOL) is None,
    reason=f"no {PROMETHEUS}: CI and the setup script install Debian's prometheus",
)


def recording_rules() -> list[str]:
    """The name of every recording rule in deploy/prometheus/rules, in file order."""
    return [
        name
        for path in RULE_FILES
        for name in re.findall(r"^\s*- record:\s*(\S+)", path.read_text(), re.M)
    ]


class PrometheusProcess(ServiceProcess):
    """``prometheus`` with the deploy rule files, scraping ``targets`` every second."""

    module = ""

    def __init__(self, workdir: Path, targets: dict[str, str]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.env = {"PATH": "/usr/bin:/bin"}
        self.log_path = workdir / "prometheus.log"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in RULE_FILES],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in targets.items()
            ],
        }
        self.config_path = workdir / "prometheus.yml"  # JSON is YAML
        self.config_path.write_text(json.dumps(config, indent=2))

    def command(self) -> list[str]:
        return [
            PROMETHEUS,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]

    def ready(self) -> bool:
        with suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)
            return True
        return False

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data`` (the call must succeed)."""
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            answer = json.loads(reply.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        return list(self.api("query", query=expr)["result"])


@dataclass
class Observed:
    """The services under traffic and the Prometheus scraping them."""

    prometheus: PrometheusProcess
    chat: ServerProcess
    auth: AuthProcess
    metrics_port: int
    #: what stopped the traffic, if anything did
    traffic_failures: list[BaseException]


def scrape_metrics(port: int) -> dict[str, float]:
    """A process's ``/metrics`` on ``port``, each sample by name (and its labels, sorted,
    as ``name{k=v,...}``); the exposition's content type is checked on the way."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples
