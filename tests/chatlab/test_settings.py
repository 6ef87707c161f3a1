"""The settings machinery both services share: env files read strictly, enum values exactly.

The services' own start (exit 2 and one line) is tested beside each service; here the
rules themselves, in-process, for every setting of both.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from auth_service.settings import SPECS as AUTH_SPECS
from chat_server.settings import SPECS as CHAT_SPECS
from chatlab import setting_names
from chatlab.settings import (
    Choice,
    SettingError,
    Spec,
    Switch,
    read_env_file,
    read_environment,
    warn_misspelt_environment,
)

ALL_SPECS = CHAT_SPECS + AUTH_SPECS


def test_the_known_names_are_exactly_both_services_settings():
    assert {spec.env for spec in CHAT_SPECS} == setting_names.CHAT_SERVER
    assert {spec.env for spec in AUTH_SPECS} == setting_names.AUTH_SERVICE


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("SERIALISER", "SERIALIZER"),
        ("serializer", "SERIALIZER"),
        ("CHAT_PROT", "CHAT_PORT"),
        ("TOKEN_TTL", "TOKEN_TTL_S"),  # an auth setting: one file serves both
        ("WS_DEFLATES", "WS_DEFLATE"),
    ],
)
def test_a_key_resembling_a_setting_is_refused_naming_it(typo: str, meant: str, tmp_path: Path):
    env_file = tmp_path / "settings.env"
    env_file.write_text(f"EVENT_LOOP=asyncio\n{typo}=json\n")
    with pytest.raises(SettingError) as refused:
        read_env_file(env_file)
    assert refused.value.name == typo
    assert str(refused.value).endswith(f"did you mean {meant}?")
    assert str(env_file) in str(refused.value)


def test_keys_of_other_tools_and_every_known_name_pass(tmp_path: Path):
    env_file = tmp_path / ".env"
    known = "\n".join(f"{spec.env}={spec.default}" for spec in ALL_SPECS)
    env_file.write_text(f"{known}\nCOMPOSE_PROJECT_NAME=chat\nPOSTGRES_HOST=db\n")
    values = read_env_file(env_file)
    assert values["COMPOSE_PROJECT_NAME"] == "chat"
    assert values["SERIALIZER"] == "orjson"


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("SERIALISER", "SERIALIZER"),  # one letter changed
        ("serializer", "SERIALIZER"),  # case
        ("SERIALIZR", "SERIALIZER"),  # one dropped
        ("SERIALIZERR", "SERIALIZER"),  # one added
        ("SERIALIZRE", "SERIALIZER"),  # two neighbours swapped
        ("AUTH_PROT", "AUTH_PORT"),  # an auth setting
        ("TOKEN_TTL", None),  # two edits: "_S" dropped
        ("BROWSER", None),  # two edits from BROKER: another tool's
        ("REDIS_HOST", None),
        ("PATH", None),
        ("SERIALIZER", None),  # known
    ],
)
def test_an_environment_name_one_edit_from_a_setting_is_taken_for_its_typo(
    name: str, meant: str | None
):
    assert setting_names.one_edit_from(name) == meant


def test_a_misspelt_setting_in_the_environment_is_warned_about_not_refused(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)  # no .env here
    environ = {"SERIALISER": "json", "SERIALIZER": "orjson", "HOME": "/root", "BROWSER": "x"}
    with caplog.at_level(logging.WARNING):
        warn_misspelt_environment(logging.getLogger("test"), environ)
    assert [r.getMessage() for r in caplog.records] == [
        "environment variable SERIALISER is not a setting (ignored); did you mean SERIALIZER?"
    ]
    assert read_environment(environ, None)["SERIALIZER"] == "orjson"  # not refused


def test_a_named_env_file_must_exist_and_a_missing_default_is_fine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)  # no .env here
    assert read_environment({"SERIALIZER": "json"}) == {"SERIALIZER": "json"}
    with pytest.raises(SettingError) as missing:
        read_environment({}, tmp_path / "nowhere.env")
    assert missing.value.name == "--env-file"
    assert "no such file" in str(missing.value)
    with pytest.raises(SettingError) as directory:
        read_environment({}, tmp_path)
    assert "not a file" in str(directory.value)


def _enum_specs() -> list[Spec]:
    return [spec for spec in ALL_SPECS if isinstance(spec.parse, Choice)]


@pytest.mark.parametrize("spec", _enum_specs(), ids=lambda spec: spec.env)
def test_each_enum_setting_takes_exactly_the_values_it_lists(spec: Spec):
    assert isinstance(spec.parse, Choice)
    for value in spec.parse.allowed:
        spec.parse(f" {value} ")  # spaces around are not part of the value
    near_misses = {value.upper() for value in spec.parse.allowed} | {
        value.capitalize() for value in spec.parse.allowed
    }
    if isinstance(spec.parse, Switch):
        near_misses |= {"yes", "no", "true", "false", "1", "0", "enabled"}
    for value in near_misses - set(spec.parse.allowed):
        with pytest.raises(ValueError, match="allowed: "):
            spec.parse(value)


def test_ws_deflate_is_one_of_off_on_and_shared():
    ws_deflate = next(spec for spec in CHAT_SPECS if spec.env == "WS_DEFLATE")
    assert [ws_deflate.parse(v) for v in ("off", "on", "shared")] == ["off", "on", "shared"]
    with pytest.raises(ValueError, match="allowed: off, on, shared"):
        ws_deflate.parse("yes")


def test_a_database_urls_password_never_reaches_a_log_line_or_a_setting_error():
    from chatlab.log_redaction import redact
    from chatlab.settings import SettingError

    url = "postgresql://auth:pa%40ss:w0rd@db.example:5432/auth?sslmode=require"
    assert redact(url) == "postgresql://auth:[redacted]@db.example:5432/auth?sslmode=require"
    assert redact("host=db password='a b' dbname=auth") == "host=db password=[redacted] dbname=auth"
    assert redact("http://127.0.0.1:8001/login") == "http://127.0.0.1:8001/login"
    assert "w0rd" not in str(SettingError("AUTH_DB_URL", url, "cannot reach it"))
