"""What the server tells its operator: logs, Prometheus metrics, /stats and profiles."""

from __future__ import annotations

import re

from chatlab.settings import LOG_LEVEL_SPEC, Spec, choice, integer, number, on_off, text

_RUN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def _run_name(raw: str) -> str:
    value = raw.strip()
    if value and not _RUN_NAME.match(value):
        raise ValueError(
            "allowed: empty, or a directory name of A-Za-z0-9_.- (not starting with . or -)"
        )
    return value


OBSERVABILITY_SPECS: tuple[Spec, ...] = (
    Spec(
        "PROFILE",
        "profile",
        "off",
        choice("off", "cprofile"),
        "cprofile: profile the server, snapshots to PROFILE_DIR/<run>/<n>.prof",
    ),
    Spec(
        "PROFILE_INTERVAL_S",
        "profile_interval_s",
        "10",
        number(0.1),
        "seconds between profile snapshots (and one on SIGUSR1, one at shutdown)",
    ),
    Spec(
        "PROFILE_DIR",
        "profile_dir",
        "profiles",
        text,
        "directory holding the profile runs (relative: to the working directory)",
    ),
    Spec(
        "PROFILE_RUN",
        "profile_run",
        "",
        _run_name,
        "run directory's name (empty: <timestamp>-<pid>); a worker adds -w<index>-<pid>",
    ),
    Spec(
        "METRICS_PORT",
        "metrics_port",
        "0",
        integer(0, 65535),
        "Prometheus metrics on CHAT_HOST:METRICS_PORT/metrics (0: off)",
    ),
    Spec(
        "EXPOSE_INTERNALS",
        "expose_internals",
        "off",
        on_off,
        "on: GET /stats (counters, host name, pids) on the chat port and X-Chatlab-Worker:"
        " <pid> on every response, for tests and the lab; off: /stats is 404, no such header",
    ),
    LOG_LEVEL_SPEC,
)
