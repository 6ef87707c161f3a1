"""Settings: defaults, validation, and exit 2 with one line naming the variable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chat_server.settings import SPECS, SettingError, Settings
from chatlab.settings import Choice
from tests.support import ROOT, KeyPair


def test_defaults_match_the_contract():
    settings = Settings.from_mapping({})
    assert (settings.serializer, settings.event_loop, settings.ws_deflate) == (
        "orjson",
        "uvloop",
        "off",
    )
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)
    assert settings.cpu_affinity is None
    assert (settings.max_frame_bytes, settings.max_outbound_bytes) == (65536, 1048576)
    assert (settings.rate_limit_per_s, settings.rate_limit_burst) == (20, 100)
    assert settings.jwt_algorithm == "EdDSA"


def test_environment_wins_over_dotenv(tmp_path: Path):
    dotenv = tmp_path / ".env"
    dotenv.write_text("SERIALIZER=json\nEVENT_LOOP=asyncio\n")
    settings = Settings.load(environ={"SERIALIZER": "protobuf"}, env_file=dotenv)
    assert (settings.serializer, settings.event_loop) == ("protobuf", "asyncio")


def test_core_list_is_checked_against_usable_cores():
    usable = sorted(os.sched_getaffinity(0))
    assert Settings.from_mapping({"CPU_AFFINITY": str(usable[0])}).cpu_affinity == (usable[0],)
    if len(usable) > 1:
        spec = f"{usable[0]}-{usable[1]}"
        assert Settings.from_mapping({"CPU_AFFINITY": spec}).cpu_affinity == tuple(usable[:2])
    with pytest.raises(SettingError) as bad:
        Settings.from_mapping({"CPU_AFFINITY": str(max(usable) + 1)})
    assert bad.value.name == "CPU_AFFINITY"


def test_env_example_lists_every_setting_with_its_default():
    text = (ROOT / ".env.example").read_text()
    for spec in SPECS:
        assert f"\n{spec.env}={spec.default}\n" in text, spec.env


BAD_VALUES = {
    "SERIALIZER": "xml",
    "EVENT_LOOP": "trio",
    "WS_DEFLATE": "yes",  # the docs list off, on and shared
    "CPU_AFFINITY": "999",
    "WORKERS": "2",  # needs BROKER=redis
    "BROKER": "kafka",
    "TRANSPORT": "aiohttp",
    "PROFILE": "pyspy",
    "PROFILE_INTERVAL_S": "0",
    "PROFILE_RUN": "../elsewhere",
    "REGRESSION": "commit-per-message",
    "CHAT_PORT": "70000",
    "MAX_FRAME_BYTES": "lots",
    "JWT_ALGORITHM": "HS256",
    "JWT_PUBLIC_KEY": "missing/key.pem",
    "RATE_LIMIT_PER_S": "-1",
    "REDIS_URL": "127.0.0.1:6379",
    "PRESENCE_LEASE_S": "0",
    "MAX_ROOMS_PER_CONNECTION": "0",
}


def _run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in {s.env for s in SPECS}}
    return subprocess.run(
        [sys.executable, "-m", "chat_server", *args],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        cwd=cwd,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_misspelt_setting_in_the_environment_starts_with_a_warning_naming_it(
    tmp_path: Path, keys: KeyPair
):
    env = {"JWT_PUBLIC_KEY": str(keys.public_path), "SERIALISER": "json"}
    result = _run(env, tmp_path, "--check")
    assert result.returncode == 0, result.stderr
    assert "SERIALISER is not a setting (ignored); did you mean SERIALIZER?" in result.stderr
    assert "serializer=orjson" in result.stdout  # the default, not the misspelt value


@pytest.mark.parametrize("name", BAD_VALUES)
def test_bad_value_exits_2_naming_the_variable(name: str, tmp_path: Path, keys: KeyPair):
    env = {"JWT_PUBLIC_KEY": str(keys.public_path), name: BAD_VALUES[name]}
    result = _run(env, tmp_path, "--check")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert name in lines[0] and BAD_VALUES[name] in lines[0]


def test_a_misspelt_key_in_an_env_file_exits_2_naming_the_setting_it_resembles(
    tmp_path: Path, keys: KeyPair
):
    env = {"JWT_PUBLIC_KEY": str(keys.public_path)}
    named = tmp_path / "typo.env"
    named.write_text("EVENT_LOOP=asyncio\nSERIALISER=json\n")
    (tmp_path / ".env").write_text("serializer=json\n")  # the default file is read as strictly
    for args in (("--env-file", str(named)), ()):
        result = _run(env, tmp_path, "--check", *args)
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].endswith("did you mean SERIALIZER?"), lines[0]
        assert ("SERIALISER" if args else "serializer") in lines[0]


def test_check_of_an_env_file_that_does_not_exist_exits_2(tmp_path: Path, keys: KeyPair):
    env = {"JWT_PUBLIC_KEY": str(keys.public_path)}
    result = _run(env, tmp_path, "--check", "--env-file", "missing.env")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--env-file='missing.env'" in lines[0] and "no such file" in lines[0]
    without = _run(env, tmp_path, "--check")  # no .env in tmp_path: every default holds
    assert without.returncode == 0, without.stderr
    assert without.stdout.startswith("settings ok")


def test_the_readme_lists_exactly_the_values_each_toggle_takes():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| setting | values |") :].split("\n\n")[0]
    listed = {}
    for row in table.splitlines()[2:]:
        name, values = row.split("|")[1:3]
        listed[name.strip().strip("`")] = values
    parsers = {spec.env: spec.parse for spec in SPECS}
    enums = [name for name in listed if isinstance(parsers[name], Choice)]
    assert {"SERIALIZER", "EVENT_LOOP", "WS_DEFLATE", "TRANSPORT"} <= set(enums)
    for name in enums:
        assert re.findall(r"`([^`]+)`", listed[name]) == list(parsers[name].allowed), name


def test_the_first_log_line_names_every_toggle_of_the_readme(start_server):
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| setting | values |") :].split("\n\n")[0]
    toggles = [row.split("|")[1].strip().strip("`") for row in table.splitlines()[2:]]
    # each toggle as the start-up line names it, with the value this server runs
    named = {
        "SERIALIZER": "serializer=json",
        "EVENT_LOOP": "loop=asyncio",
        "WS_DEFLATE": "deflate=on",
        "CPU_AFFINITY": "affinity=off",
        "CHAT_DB_SYNCHRONOUS": "synchronous=full",
        "TRANSPORT": "transport=websockets",
    }
    assert sorted(toggles) == sorted(named)
    server = start_server(
        serializer="json",
        event_loop="asyncio",
        ws_deflate="on",
        chat_db_synchronous="full",
        transport="websockets",
    )
    first = server.log().splitlines()[0]
    assert "chat_server listening on ws://127.0.0.1:" in first, server.log()
    for toggle in toggles:
        assert named[toggle] in first.split(), (toggle, first)


def test_profile_cprofile_is_accepted_with_its_directory_settings():
    settings = Settings.from_mapping({"PROFILE": "cprofile"})
    assert (settings.profile, settings.profile_interval_s) == ("cprofile", 10)
    assert (settings.profile_dir, settings.profile_run) == ("profiles", "")
    named = Settings.from_mapping({"PROFILE_DIR": "/tmp/lab", "PROFILE_RUN": "run-1.a"})
    assert (named.profile_dir, named.profile_run) == ("/tmp/lab", "run-1.a")


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"TRANSPORT": "picows", "WS_DEFLATE": "on"}, ("TRANSPORT", "WS_DEFLATE")),
        (
            {"TRANSPORT": "picows", "WS_DEFLATE": "on", "REGRESSION": "deflate_max_window"},
            ("REGRESSION", "TRANSPORT"),
        ),
    ],
)
def test_picows_refuses_what_needs_deflate_naming_both_settings(
    env: dict[str, str], names: tuple[str, str], tmp_path: Path, keys: KeyPair
):
    result = _run({"JWT_PUBLIC_KEY": str(keys.public_path), **env}, tmp_path, "--check")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert all(name in lines[0] for name in names), lines[0]
    assert "picows" in lines[0]


def test_picows_is_accepted_without_deflate_and_with_shared_deflate():
    settings = Settings.from_mapping({"TRANSPORT": "picows"})
    assert (settings.transport, settings.ws_deflate) == ("picows", "off")
    shared = Settings.from_mapping({"TRANSPORT": "picows", "WS_DEFLATE": "shared"})
    assert (shared.transport, shared.ws_deflate) == ("picows", "shared")


def test_deflate_max_window_needs_deflate_with_context_takeover():
    with pytest.raises(SettingError) as bad:
        Settings.from_mapping({"REGRESSION": "deflate_max_window", "WS_DEFLATE": "off"})
    assert bad.value.name == "REGRESSION"


def test_max_partial_bytes_must_hold_one_whole_message():
    with pytest.raises(SettingError) as bad:
        Settings.from_mapping({"MAX_PARTIAL_BYTES": "65535", "MAX_FRAME_BYTES": "65536"})
    assert bad.value.name == "MAX_PARTIAL_BYTES"
    assert Settings.from_mapping({"MAX_PARTIAL_BYTES": "65536"}).max_partial_bytes == 65536


def test_a_cluster_takes_seed_nodes_and_one_redis_takes_one_url():
    seeds = "redis://10.0.0.1:7000, redis://:secret@10.0.0.2:7000"
    settings = Settings.from_mapping({"BROKER": "redis", "REDIS_CLUSTER": "on", "REDIS_URL": seeds})
    assert settings.redis_url == "redis://10.0.0.1:7000,redis://:secret@10.0.0.2:7000"
    assert "store=redis-cluster:10.0.0.1:7000" in settings.summary()
    refusals = [
        ({"BROKER": "redis", "REDIS_URL": seeds}, "REDIS_URL"),  # several URLs, no cluster
        ({"BROKER": "memory", "REDIS_CLUSTER": "on"}, "REDIS_CLUSTER"),
        ({"BROKER": "redis", "REDIS_CLUSTER": "on", "REDIS_URL": "redis://h:1/2"}, "REDIS_URL"),
        ({"BROKER": "redis", "REDIS_CLUSTER": "on", "REDIS_URL": "unix:///r.sock"}, "REDIS_URL"),
    ]
    for mapping, name in refusals:
        with pytest.raises(SettingError) as bad:
            Settings.from_mapping(mapping)
        assert bad.value.name == name, mapping
        assert "secret" not in str(bad.value)


def test_deflate_max_window_with_shared_deflate_exits_2_at_start(tmp_path: Path, keys: KeyPair):
    # shared compresses every broadcast with one window (2^9): there is no window to widen
    env = {"REGRESSION": "deflate_max_window", "WS_DEFLATE": "shared"}
    result = _run({"JWT_PUBLIC_KEY": str(keys.public_path), **env}, tmp_path, "--check")
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert "REGRESSION" in line and "WS_DEFLATE=on" in line, line


def test_unusable_database_exits_2_naming_chat_db(tmp_path: Path, keys: KeyPair):
    env = {"JWT_PUBLIC_KEY": str(keys.public_path), "CHAT_DB": str(tmp_path)}  # a directory
    result = _run(env, tmp_path)
    assert result.returncode == 2, result.stderr
    assert "CHAT_DB" in result.stderr


def test_help_lists_every_setting_with_its_default(tmp_path: Path):
    result = _run({}, tmp_path, "--help")
    assert result.returncode == 0
    for spec in SPECS:
        assert spec.env in result.stdout
    assert "[default: orjson]" in result.stdout


def test_auth_inline_without_the_auth_services_key_exits_2(tmp_path: Path, keys: KeyPair):
    env = {
        "JWT_PUBLIC_KEY": str(keys.public_path),
        "REGRESSION": "auth_inline",
        "CHAT_DB": str(tmp_path / "chat.sqlite3"),
        "AUTH_DB": str(tmp_path / "auth.sqlite3"),
        "JWT_PRIVATE_KEY": str(tmp_path / "missing.pem"),
    }
    result = _run(env, tmp_path)
    assert result.returncode == 2, result.stderr
    assert "JWT_PRIVATE_KEY" in result.stderr.strip().splitlines()[-1]


def test_ack_replicas_default_to_one_on_a_cluster_and_none_on_one_redis():
    cluster = {"BROKER": "redis", "REDIS_CLUSTER": "on", "REDIS_URL": "redis://10.0.0.1:7000"}
    assert Settings.from_mapping({"BROKER": "redis"}).ack_replicas == 0
    assert Settings.from_mapping(cluster).ack_replicas == 1
    assert Settings.from_mapping({**cluster, "REDIS_ACK_REPLICAS": "0"}).ack_replicas == 0
    one = Settings.from_mapping({"BROKER": "redis", "REDIS_ACK_REPLICAS": "2"})
    assert one.ack_replicas == 2
    assert "ack_replicas=2" in one.summary()
    for bad in ("-1", "9", "one", "1.5"):
        with pytest.raises(SettingError) as refused:
            Settings.from_mapping({"REDIS_ACK_REPLICAS": bad})
        assert refused.value.name == "REDIS_ACK_REPLICAS"
