"""Settings: defaults, --help, and a bad value stopping the service with exit 2."""

from __future__ import annotations

import os

import argon2
import pytest

from auth_service.settings import SPECS, SettingError, Settings
from chatlab.harness import ROOT, AuthProcess


def test_defaults_are_argon2_cffis_and_the_usable_cores_less_one():
    settings = Settings.from_mapping({})
    hasher = argon2.PasswordHasher()
    assert settings.argon2_time_cost == hasher.time_cost
    assert settings.argon2_memory_cost_kib == hasher.memory_cost
    assert settings.argon2_parallelism == hasher.parallelism
    assert settings.hash_pool_size == max(1, len(os.sched_getaffinity(0)) - 1)
    assert (settings.host, settings.port, settings.token_ttl_s) == ("127.0.0.1", 8001, 900)
    assert (settings.jwt_issuer, settings.jwt_audience) == ("chatlab-auth", "chatlab-chat")


def test_memory_cost_must_cover_the_lanes():
    with pytest.raises(SettingError) as bad:
        Settings.from_mapping({"ARGON2_MEMORY_COST_KIB": "16", "ARGON2_PARALLELISM": "4"})
    assert bad.value.name == "ARGON2_MEMORY_COST_KIB"


def test_env_example_lists_every_setting_with_its_default():
    text = (ROOT / ".env.example").read_text()
    for spec in SPECS:
        assert f"\n{spec.env}={spec.default}\n" in text, spec.env


def test_help_lists_every_setting_with_its_default(tmp_path):
    result = AuthProcess(tmp_path).run("--help")
    assert result.returncode == 0
    for spec in SPECS:
        assert spec.env in result.stdout, spec.env
        assert f"[default: {spec.default or '(empty)'}]" in result.stdout
    assert "rotate-key" in result.stdout
    assert "migrate-users" in result.stdout


BAD_VALUES = {
    "AUTH_PORT": "70000",
    "ARGON2_TIME_COST": "0",
    "HASH_POOL_SIZE": "many",
    "HASH_QUEUE_MAX": "0",
    "EVENT_LOOP": "trio",
    "LOGIN_RATE_PER_USER_PER_MIN": "-1",
    "TOKEN_TTL_S": "forever",
}


@pytest.mark.parametrize("name", BAD_VALUES)
def test_a_bad_setting_exits_2_naming_it(tmp_path, name: str):
    result = AuthProcess(tmp_path, **{name: BAD_VALUES[name]}).run(timeout_s=20)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert name in lines[0] and BAD_VALUES[name] in lines[0]
    assert "allowed" in lines[0]


def test_a_misspelt_key_or_a_missing_env_file_exits_2(tmp_path):
    typo = tmp_path / "typo.env"
    typo.write_text("HASH_POOL_SIZ=2\n")
    missing = tmp_path / "missing.env"
    for env_file, expected in ((typo, "did you mean HASH_POOL_SIZE?"), (missing, "no such file")):
        result = AuthProcess(tmp_path).run("--env-file", str(env_file), timeout_s=20)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert expected in lines[0], lines[0]


def test_an_unusable_database_path_exits_2_naming_it(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    result = AuthProcess(tmp_path, AUTH_DB=str(tmp_path / "file" / "auth.sqlite3")).run()
    assert result.returncode == 2
    assert "AUTH_DB" in result.stderr
