"""Settings machinery both services share: parsers, a table of :class:`Spec`, ``--help``.

A service declares its settings as a tuple of :class:`Spec` and a frozen dataclass
deriving :class:`SpecSettings`. :meth:`SpecSettings.load` merges ``.env`` (from the
working directory) with the process environment (the environment wins), parses and
validates every value, and returns one frozen object that is passed explicitly to
whatever needs it. A bad value raises :class:`SettingError`, whose ``str()`` is the one
line a service's entry point prints (naming the variable, the value and what is
allowed) before it exits with status 2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

from dotenv import dotenv_values


class SettingError(ValueError):
    """A setting's value is not allowed; ``str()`` is the one line to print."""

    def __init__(self, name: str, value: str, allowed: str) -> None:
        super().__init__(f"bad setting {name}={value!r}: {allowed}")
        self.name = name
        self.value = value
        self.allowed = allowed


# ---- parsers: str -> value, raising ValueError(allowed) -----------------------------


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise ValueError(f"allowed: {', '.join(allowed)}")
        return value

    return parse


def on_off(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise ValueError("allowed: on, off")


def integer(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(_range_text(low, high, "an integer")) from None
        if value < low or (high is not None and value > high):
            raise ValueError(_range_text(low, high, "an integer"))
        return value

    return parse


def number(low: float, high: float | None = None) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(_range_text(low, high, "a number")) from None
        if not value >= low or (high is not None and value > high):
            raise ValueError(_range_text(low, high, "a number"))
        return value

    return parse


def _range_text(low: float, high: float | None, kind: str) -> str:
    if high is None:
        return f"allowed: {kind} >= {low}"
    return f"allowed: {kind} from {low} to {high}"


def text(raw: str) -> str:
    value = raw.strip()
    if not value:
        raise ValueError("allowed: a non-empty string")
    return value


def optional_text(raw: str) -> str:
    return raw.strip()


_CORE_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def parse_core_list(raw: str) -> tuple[int, ...] | None:
    """Parse ``off`` or a core list (``0``, ``0,1``, ``0-3``) checked against this process's cores.

    The check uses ``os.sched_getaffinity``: the cores this process may run on,
    which in a container or under ``taskset`` is fewer than the machine's count.
    """
    value = raw.strip().lower().replace(" ", "")
    usable = sorted(os.sched_getaffinity(0))
    allowed = f"allowed: off, or a list of usable cores such as 0, 0,1 or 0-1 (usable: {usable})"
    if value == "off":
        return None
    if not _CORE_LIST.match(value):
        raise ValueError(allowed)
    cores: set[int] = set()
    for part in value.split(","):
        first, _, last = part.partition("-")
        start, end = int(first), int(last or first)
        if end < start:
            raise ValueError(allowed)
        cores.update(range(start, end + 1))
    if not cores <= set(usable):
        raise ValueError(allowed)
    return tuple(sorted(cores))


def http_url(raw: str) -> str:
    """An absolute ``http://`` or ``https://`` URL with a host (a trailing ``/`` dropped)."""
    value = raw.strip().rstrip("/")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            "allowed: an absolute http:// or https:// URL such as http://127.0.0.1:8001"
        )
    return value


@dataclass(frozen=True)
class Spec:
    """One setting: its environment name, default, parser and one line of help."""

    env: str
    field: str
    default: str
    parse: Callable[[str], Any]
    help: str


class SpecSettings:
    """Base of a service's settings: built from its ``specs`` table, validated as a whole."""

    specs: ClassVar[tuple[Spec, ...]] = ()

    @classmethod
    def load(
        cls, environ: Mapping[str, str] | None = None, dotenv_path: str | Path | None = ".env"
    ) -> Self:
        """Read ``.env`` then the environment (which wins), validate every value, or raise."""
        return cls.from_mapping(read_environment(environ, dotenv_path))

    @classmethod
    def from_mapping(cls, values: Mapping[str, str]) -> Self:
        """Validate settings given by environment name; missing names take their defaults."""
        settings = cls(**parse_specs(cls.specs, values))
        settings._check_combinations()
        return settings

    def _check_combinations(self) -> None:
        """Raise SettingError when values valid alone do not go together."""


def read_environment(
    environ: Mapping[str, str] | None = None, dotenv_path: str | Path | None = ".env"
) -> dict[str, str]:
    """``.env`` (when the file exists) overlaid with the environment, which wins."""
    merged: dict[str, str] = {}
    if dotenv_path is not None and Path(dotenv_path).is_file():
        merged.update({k: v for k, v in dotenv_values(dotenv_path).items() if v is not None})
    merged.update(os.environ if environ is None else environ)
    return merged


def parse_specs(specs: tuple[Spec, ...], values: Mapping[str, str]) -> dict[str, Any]:
    """Parse each spec's value (or default) into ``{field: value}``; SettingError on a bad one."""
    parsed: dict[str, Any] = {}
    for spec in specs:
        raw = values.get(spec.env, spec.default)
        try:
            value = spec.parse(raw)
        except ValueError as exc:
            raise SettingError(spec.env, raw, str(exc)) from None
        parsed[spec.field] = value
    return parsed


def specs_help(specs: tuple[Spec, ...]) -> str:
    """A ``--help`` epilog: every setting with its default and what it does."""
    width = max(len(spec.env) for spec in specs)
    lines = ["settings (environment variables; .env in the working directory; env wins):"]
    for spec in specs:
        default = spec.default if spec.default else "(empty)"
        lines.append(f"  {spec.env:<{width}}  {spec.help} [default: {default}]")
    return "\n".join(lines)
