"""Settings: every toggle of the auth service, read once from ``.env`` and the environment.

The same rules as the chat server's: both build on :mod:`chatlab.settings` (its
parsers, :class:`~chatlab.settings.Spec` table and
:class:`~chatlab.settings.SettingError`): ``.env`` from the
working directory, the environment wins, every value is validated once at start, and
a bad one raises :class:`SettingError`, which ``python -m auth_service`` turns into one
line naming the variable, the value and what is allowed, and exit status 2.
Settings the two services share (``JWT_PUBLIC_KEY``, ``JWT_ISSUER``, ``JWT_AUDIENCE``,
``EVENT_LOOP``, ``LOG_LEVEL``) have the same names, so one ``.env`` serves both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

import argon2

from chatlab.forwarded import TRUSTED_PROXIES_SPEC, TrustedProxies
from chatlab.log_redaction import redact
from chatlab.settings import (
    EVENT_LOOP_SPEC,
    LOG_LEVEL_SPEC,
    SettingError,
    Spec,
    SpecSettings,
    integer,
    number,
    specs_help,
    text,
)
from chatlab.tls import TLS_SERVER_SPECS, server_context

__all__ = ["SPECS", "SettingError", "Settings", "settings_help"]

# argon2-cffi's own defaults (RFC 9106's low-memory profile: t=3, m=64 MiB, p=4)
_ARGON2_DEFAULTS = argon2.PasswordHasher()


def usable_cores() -> int:
    """How many cores this process may run on (``os.sched_getaffinity``, not the machine's)."""
    return len(os.sched_getaffinity(0))


def _pool_size(raw: str) -> int:
    value = raw.strip()
    if value == "auto":
        return max(1, usable_cores() - 1)
    try:
        return integer(1, 256)(value)
    except ValueError:
        raise ValueError("allowed: auto (usable cores - 1, at least 1) or 1 to 256") from None


def _rate(raw: str) -> float:
    try:
        return number(0)(raw)
    except ValueError:
        raise ValueError("allowed: a number >= 0 (0: no limit)") from None


def _origins(raw: str) -> tuple[str, ...]:
    """Comma-separated origins (``scheme://host[:port]``, no path); empty: none."""
    origins = tuple(part.strip().rstrip("/") for part in raw.split(",") if part.strip())
    for origin in origins:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path:
            raise ValueError(
                "allowed: comma-separated origins such as http://127.0.0.1:8000 (no path)"
            )
    return origins


def _db_url(raw: str) -> str:
    """Empty (the SQLite file ``AUTH_DB``) or a PostgreSQL URL, ``postgresql://...``."""
    value = raw.strip()
    if not value:
        return ""
    parts = urlsplit(value)
    if parts.scheme not in ("postgresql", "postgres") or not (parts.hostname or parts.query):
        raise ValueError(
            "allowed: empty (users in the SQLite file AUTH_DB) or a PostgreSQL URL such as "
            "postgresql://auth:PASSWORD@db.example:5432/auth"
        )
    return value


SPECS: tuple[Spec, ...] = (
    Spec("AUTH_HOST", "host", "127.0.0.1", text, "address the auth service listens on"),
    Spec(
        "AUTH_PORT",
        "port",
        "8001",
        integer(1, 65535),
        "port of the HTTP API (and of GET /metrics, Prometheus)",
    ),
    *TLS_SERVER_SPECS,
    TRUSTED_PROXIES_SPEC,
    Spec(
        "AUTH_DB",
        "auth_db",
        "data/auth.sqlite3",
        text,
        "SQLite file holding the users (when AUTH_DB_URL is empty)",
    ),
    Spec(
        "AUTH_DB_URL",
        "auth_db_url",
        "",
        _db_url,
        "users and keys in PostgreSQL, shared by every replica: postgresql://user:pw@host/db "
        "(empty: SQLite, one replica)",
    ),
    Spec(
        "AUTH_DB_POOL_MAX",
        "auth_db_pool_max",
        "10",
        integer(1, 1000),
        "PostgreSQL connections one replica holds at most",
    ),
    Spec(
        "AUTH_DB_TIMEOUT_S",
        "auth_db_timeout_s",
        "5",
        number(0.1, 600),
        "longest a request waits for PostgreSQL (a connection and the query); past it 503",
    ),
    Spec(
        "AUTH_KEY_ACTIVATION_S",
        "auth_key_activation_s",
        "90",
        integer(0, 86400),
        "with AUTH_DB_URL: seconds a key made by rotate-key is in the JWK set before any "
        "replica signs with it (more than the chat servers' JWKS_REFRESH_S + 5)",
    ),
    Spec(
        "JWT_PRIVATE_KEY",
        "jwt_private_key",
        "keys/jwt_private.pem",
        text,
        "Ed25519 signing key (PEM, mode 0600); created on first start",
    ),
    Spec(
        "JWT_PUBLIC_KEY",
        "jwt_public_key",
        "keys/jwt_public.pem",
        text,
        "the signing key's public PEM, written for the chat server",
    ),
    Spec(
        "JWT_KEYRING",
        "jwt_keyring",
        "keys/jwt_keyring.json",
        text,
        "every public key still served in the JWK set (rotate-key adds to it)",
    ),
    Spec("JWT_ISSUER", "jwt_issuer", "chatlab-auth", text, "iss of every token"),
    Spec("JWT_AUDIENCE", "jwt_audience", "chatlab-chat", text, "aud of every token"),
    Spec("TOKEN_TTL_S", "token_ttl_s", "900", integer(1, 604800), "token lifetime in seconds"),
    Spec(
        "REFRESH_TTL_S",
        "refresh_ttl_s",
        "2592000",
        integer(1, 31622400),
        "a refresh token's life from its issue; each refresh issues the next with a fresh one "
        "(a session used at least this often lasts)",
    ),
    Spec(
        "REFRESH_GRACE_S",
        "refresh_grace_s",
        "10",
        integer(0, 300),
        "seconds a spent refresh token still answers its same successor (two tabs refreshing "
        "at once); after it, presenting it again revokes the session (0: no grace)",
    ),
    Spec(
        "REFRESH_RATE_PER_CLIENT_PER_MIN",
        "refresh_rate_per_client_per_min",
        "300",
        _rate,
        "refreshes and logouts per client address per minute (0: no limit)",
    ),
    Spec(
        "REFRESH_BURST_PER_CLIENT",
        "refresh_burst_per_client",
        "100",
        integer(1),
        "refreshes and logouts one client address may make at once",
    ),
    Spec(
        "REFRESH_FAMILIES_PER_USER",
        "refresh_families_per_user",
        "50",
        integer(1, 100000),
        "live sessions (refresh token families) per username; a login past it revokes the "
        "user's oldest",
    ),
    Spec(
        "ARGON2_TIME_COST",
        "argon2_time_cost",
        str(_ARGON2_DEFAULTS.time_cost),
        integer(1, 100),
        "argon2id passes (argon2-cffi's default)",
    ),
    Spec(
        "ARGON2_MEMORY_COST_KIB",
        "argon2_memory_cost_kib",
        str(_ARGON2_DEFAULTS.memory_cost),
        integer(8, 4 * 1024 * 1024),
        "argon2id memory per hash in KiB (argon2-cffi's default)",
    ),
    Spec(
        "ARGON2_PARALLELISM",
        "argon2_parallelism",
        str(_ARGON2_DEFAULTS.parallelism),
        integer(1, 64),
        "argon2id lanes (argon2-cffi's default)",
    ),
    Spec(
        "HASH_POOL_SIZE",
        "hash_pool_size",
        "auto",
        _pool_size,
        "processes hashing passwords (auto: usable cores - 1, at least 1)",
    ),
    Spec(
        "HASH_QUEUE_MAX",
        "hash_queue_max",
        "16",
        integer(1, 100000),
        "hashing jobs waiting or running; past it 503 with Retry-After",
    ),
    Spec(
        "LOGIN_RATE_PER_USER_PER_MIN",
        "login_rate_per_user_per_min",
        "10",
        _rate,
        "failed logins per username per minute, from every address together; past it only "
        "addresses the username logged in from in the last 30 days may try (0: no limit)",
    ),
    Spec(
        "LOGIN_BURST_PER_USER",
        "login_burst_per_user",
        "5",
        integer(1),
        "failed logins one username may make at once",
    ),
    Spec(
        "LOGIN_RATE_PER_USER_CLIENT_PER_MIN",
        "login_rate_per_user_client_per_min",
        "10",
        _rate,
        "failed logins per (username, client address) per minute (0: no limit)",
    ),
    Spec(
        "LOGIN_BURST_PER_USER_CLIENT",
        "login_burst_per_user_client",
        "5",
        integer(1),
        "failed logins one (username, client address) may make at once",
    ),
    Spec(
        "LOGIN_RATE_PER_CLIENT_PER_MIN",
        "login_rate_per_client_per_min",
        "60",
        _rate,
        "logins per client address per minute (0: no limit)",
    ),
    Spec(
        "LOGIN_BURST_PER_CLIENT",
        "login_burst_per_client",
        "20",
        integer(1),
        "logins one client address may make at once",
    ),
    Spec(
        "REGISTER_RATE_PER_CLIENT_PER_MIN",
        "register_rate_per_client_per_min",
        "10",
        _rate,
        "registrations per client address per minute (0: no limit)",
    ),
    Spec(
        "REGISTER_BURST_PER_CLIENT",
        "register_burst_per_client",
        "10",
        integer(1),
        "registrations one client address may make at once",
    ),
    Spec(
        "RATE_LIMIT_KEYS_MAX",
        "rate_limit_keys_max",
        "100000",
        integer(1),
        "usernames or addresses tracked per limit; past it the least recent is forgotten",
    ),
    Spec(
        "AUTH_HEADER_TIMEOUT_S",
        "header_timeout_s",
        "10",
        number(0.1, 3600),
        "a request's header must arrive within this of the connection's first byte; past it "
        "408 and the connection closes",
    ),
    Spec(
        "AUTH_BODY_TIMEOUT_S",
        "body_timeout_s",
        "10",
        number(0.1, 3600),
        "a request's body must arrive within this of its header; past it 408 and the "
        "connection closes",
    ),
    Spec(
        "AUTH_IDLE_TIMEOUT_S",
        "idle_timeout_s",
        "5",
        number(0.1, 3600),
        "a kept-alive connection with no request in progress is closed after this",
    ),
    Spec(
        "AUTH_MAX_CONNECTIONS",
        "max_connections",
        "1000",
        integer(1, 1000000),
        "connections open at once (cut at start to what the open-files limit allows); one "
        "more is answered 503 with Retry-After and closed, with a warning in the log",
    ),
    Spec(
        "AUTH_CORS_ORIGINS",
        "cors_origins",
        "http://127.0.0.1:8000,http://localhost:8000",
        _origins,
        "origins whose pages may call the API from a browser (CORS), comma-separated",
    ),
    EVENT_LOOP_SPEC,
    LOG_LEVEL_SPEC,
)


@dataclass(frozen=True)
class Settings(SpecSettings):
    """Every auth service setting, validated. Build it with :meth:`load`."""

    specs: ClassVar[tuple[Spec, ...]] = SPECS

    host: str
    port: int
    tls_cert_file: str
    tls_key_file: str
    trusted_proxies: TrustedProxies
    auth_db: str
    auth_db_url: str
    auth_db_pool_max: int
    auth_db_timeout_s: float
    auth_key_activation_s: int
    jwt_private_key: str
    jwt_public_key: str
    jwt_keyring: str
    jwt_issuer: str
    jwt_audience: str
    token_ttl_s: int
    refresh_ttl_s: int
    refresh_grace_s: int
    refresh_rate_per_client_per_min: float
    refresh_burst_per_client: int
    refresh_families_per_user: int
    argon2_time_cost: int
    argon2_memory_cost_kib: int
    argon2_parallelism: int
    hash_pool_size: int
    hash_queue_max: int
    login_rate_per_user_per_min: float
    login_burst_per_user: int
    login_rate_per_user_client_per_min: float
    login_burst_per_user_client: int
    login_rate_per_client_per_min: float
    login_burst_per_client: int
    register_rate_per_client_per_min: float
    register_burst_per_client: int
    rate_limit_keys_max: int
    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    max_connections: int
    cors_origins: tuple[str, ...]
    event_loop: str
    log_level: str

    def _check_combinations(self) -> None:
        if self.tls_cert_file or self.tls_key_file:
            server_context(self.tls_cert_file, self.tls_key_file)
        # argon2 needs at least 8 KiB per lane
        if self.argon2_memory_cost_kib < 8 * self.argon2_parallelism:
            raise SettingError(
                "ARGON2_MEMORY_COST_KIB",
                str(self.argon2_memory_cost_kib),
                f"at least 8 x ARGON2_PARALLELISM = {8 * self.argon2_parallelism}",
            )

    def summary(self) -> str:
        """One line naming the cost and capacity settings in force, for the start-up log."""
        return (
            f"argon2id t={self.argon2_time_cost} m={self.argon2_memory_cost_kib}KiB "
            f"p={self.argon2_parallelism} pool={self.hash_pool_size} "
            f"queue_max={self.hash_queue_max} loop={self.event_loop} "
            f"token_ttl_s={self.token_ttl_s} db={self.database()}"
        )

    def database(self) -> str:
        """Where the users are, fit for a log: ``sqlite:PATH`` or the URL without its password."""
        return redact(self.auth_db_url) if self.auth_db_url else f"sqlite:{self.auth_db}"


def settings_help() -> str:
    """The auth service's ``--help`` epilog: every setting with its default and what it does."""
    return specs_help(SPECS)
