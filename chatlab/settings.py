"""Settings machinery both services share: parsers, a table of :class:`Spec`, ``--help``.

A service declares its settings as a tuple of :class:`Spec` and a frozen dataclass
deriving :class:`SpecSettings`. :meth:`SpecSettings.load` merges an env file (``.env``
in the working directory, or the one ``--env-file`` names) with the process
environment (the environment wins), parses and validates every value, and returns one
frozen object that is passed explicitly to whatever needs it. A bad value raises
:class:`SettingError`, whose ``str()`` is the one line a service's entry point prints
(naming the variable, the value and what is allowed) before it exits with status 2.

Mistakes are refused, not passed over: an enum setting takes exactly the values its
help lists (``WS_DEFLATE=yes`` is not ``on``), a key in the env file that neither
service reads but that resembles one they do (``SERIALISER``) is named with the
setting it resembles, and an env file named explicitly must exist (a missing default
``.env`` is fine: every setting has a default). The environment holds other programs'
names too: one there within one edit of a setting's is warned about
(:func:`warn_misspelt_environment`), not refused.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

from dotenv import dotenv_values

from chatlab.log_redaction import redact
from chatlab.setting_names import one_edit_from, resembled

#: the env file read when no ``--env-file`` is given (in the working directory; may be absent)
DEFAULT_ENV_FILE = ".env"


class SettingError(ValueError):
    """A setting's value is not allowed; ``str()`` is the one line to print.

    The value is shown redacted (:func:`~chatlab.log_redaction.redact`): a database
    URL's password never reaches the line.
    """

    def __init__(self, name: str, value: str, allowed: str) -> None:
        value = redact(value)
        super().__init__(f"bad setting {name}={value!r}: {allowed}")
        self.name = name
        self.value = value
        self.allowed = allowed


# ---- parsers: str -> value, raising ValueError(allowed) -----------------------------


@dataclass(frozen=True)
class Choice:
    """A parser taking exactly one of ``allowed`` (case counts; spaces around are dropped).

    ``--help`` lists the values (:func:`specs_help`), so what is listed is what is taken.
    """

    allowed: tuple[str, ...]

    def __call__(self, raw: str) -> Any:
        """The value, or ValueError naming what is allowed."""
        value = raw.strip()
        if value not in self.allowed:
            raise ValueError(f"allowed: {', '.join(self.allowed)}")
        return value


def choice(*allowed: str) -> Choice:
    """A parser taking exactly one of ``allowed``."""
    return Choice(allowed)


@dataclass(frozen=True)
class Switch(Choice):
    """``on`` (True) or ``off`` (False), exactly: not yes, true or 1."""

    allowed: tuple[str, ...] = ("off", "on")

    def __call__(self, raw: str) -> bool:
        """True for ``on``, False for ``off``; ValueError otherwise."""
        return bool(super().__call__(raw) == "on")


on_off = Switch()


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
    value = raw.strip().replace(" ", "")
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


def http_urls(raw: str) -> tuple[str, ...]:
    """One or more absolute http(s) URLs, comma-separated (each as :func:`http_url` takes it).

    Several URLs name replicas of one service: a client spreads its requests over them
    and tries another when one refuses the connection or answers 503.
    """
    urls = tuple(http_url(part) for part in raw.split(",") if part.strip())
    if not urls:
        raise ValueError(
            "allowed: one or more absolute http:// or https:// URLs, comma-separated, "
            "such as http://127.0.0.1:8001"
        )
    return urls


@dataclass(frozen=True)
class Spec:
    """One setting: its environment name, default, parser and one line of help."""

    env: str
    field: str
    default: str
    parse: Callable[[str], Any]
    help: str


#: settings both services read with the same name, default and values (one ``.env``
#: serves both)
EVENT_LOOP_SPEC = Spec(
    "EVENT_LOOP",
    "event_loop",
    "uvloop",
    choice("asyncio", "uvloop"),
    "event loop implementation",
)
LOG_LEVEL_SPEC = Spec(
    "LOG_LEVEL",
    "log_level",
    "info",
    choice("debug", "info", "warning", "error"),
    "logging level",
)


class SpecSettings:
    """Base of a service's settings: built from its ``specs`` table, validated as a whole."""

    specs: ClassVar[tuple[Spec, ...]] = ()

    @classmethod
    def load(
        cls, environ: Mapping[str, str] | None = None, env_file: str | Path | None = None
    ) -> Self:
        """Read the env file then the environment (which wins), validate every value, or raise.

        ``env_file`` None reads ``.env`` if there is one; a file named must exist.
        """
        return cls.from_mapping(read_environment(environ, env_file))

    @classmethod
    def from_mapping(cls, values: Mapping[str, str]) -> Self:
        """Validate settings given by environment name; missing names take their defaults."""
        settings = cls(**parse_specs(cls.specs, values))
        settings._check_combinations()
        return settings

    def _check_combinations(self) -> None:
        """Raise SettingError when values valid alone do not go together."""


def read_environment(
    environ: Mapping[str, str] | None = None, env_file: str | Path | None = None
) -> dict[str, str]:
    """The env file's values overlaid with the environment, which wins.

    ``env_file`` None reads ``.env`` in the working directory when it exists. SettingError
    for a named file that does not exist or cannot be read, and for a key in the file
    that neither service reads but that resembles a name one does (its likely typo).
    """
    merged = dict(read_env_file(env_file))
    merged.update(os.environ if environ is None else environ)
    return merged


def warn_misspelt_environment(
    log: logging.Logger, environ: Mapping[str, str] | None = None
) -> None:
    """Log a warning for each environment name (``environ`` None: this process') that is
    one edit from a setting either service reads (:func:`one_edit_from`): the setting is
    not set by it. Not refused as in an env file: the environment is not ours alone."""
    names = os.environ if environ is None else environ
    for name in sorted(names):
        known = one_edit_from(name)
        if known is not None:
            log.warning(
                "environment variable %s is not a setting (ignored); did you mean %s?",
                name,
                known,
            )


def read_env_file(env_file: str | Path | None = None) -> dict[str, str]:
    """The settings an env file holds (``env_file`` None: ``.env``, or nothing when absent).

    Raises SettingError as :func:`read_environment` says.
    """
    path = Path(DEFAULT_ENV_FILE if env_file is None else env_file)
    if env_file is None and not path.exists():
        return {}
    try:
        values = dotenv_values(path) if path.is_file() else None
    except OSError as exc:
        raise SettingError("--env-file", str(path), f"cannot read it ({exc.strerror})") from None
    if values is None:
        what = "not a file" if path.exists() else "no such file"
        raise SettingError(
            "--env-file", str(path), f"{what} (without --env-file a missing .env is fine)"
        )
    for name in values:
        known = resembled(name)
        if known is not None:
            raise SettingError(
                name,
                values[name] or "",
                f"not a setting of either service (in {path}); did you mean {known}?",
            )
    return {k: v for k, v in values.items() if v is not None}


def add_env_file_option(parser: argparse.ArgumentParser) -> None:
    """The ``--env-file`` option both services take (None when not given)."""
    parser.add_argument(
        "--env-file",
        default=None,
        help="settings file; it must exist (default: .env in the working directory, if any)",
    )


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
    lines = [
        "settings (environment variables, or an env file: .env in the working directory or",
        "--env-file; the environment wins; a key in the file that resembles a setting's",
        "name, such as SERIALISER, is refused; in the environment it is warned about):",
    ]
    for spec in specs:
        default = spec.default if spec.default else "(empty)"
        values = ""
        if isinstance(spec.parse, Choice):
            values = f" [one of: {', '.join(spec.parse.allowed)}]"
        lines.append(f"  {spec.env:<{width}}  {spec.help}{values} [default: {default}]")
    return "\n".join(lines)
