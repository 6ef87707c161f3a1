"""Settings: every toggle of the chat server, read once from ``.env`` and the environment.

:meth:`Settings.load` (from :class:`chatlab.settings.SpecSettings`) merges ``.env``
(from the working directory) with the process environment (the environment wins),
parses and validates every value, and returns one frozen object that is passed
explicitly to whatever needs it. A bad value raises :class:`SettingError`, which
``python -m chat_server`` turns into one line naming the variable, the value and what
is allowed, and exit status 2.

The table of settings is kept by concern, one module each: :mod:`.network` (where it
listens, TLS), :mod:`.performance` (the toggles the lab compares), :mod:`.storage`
(broker and history), :mod:`.keys` (token verification), :mod:`.observability` and
:mod:`.limits` (every bound a client can push against). ``--help`` lists them in that
order. This module joins them into :data:`SPECS` and the one :class:`Settings`, and
checks the values that must go together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from chat_server.settings.keys import KEYS_SPECS
from chat_server.settings.limits import LIMITS_SPECS
from chat_server.settings.network import NETWORK_SPECS
from chat_server.settings.observability import OBSERVABILITY_SPECS
from chat_server.settings.performance import PERFORMANCE_SPECS, REGRESSIONS, TRANSPORTS
from chat_server.settings.storage import (
    STORAGE_SPECS,
    redact_url,
    redis_db,
    redis_location,
)
from chat_server.store.sqlite_policy import commit_place
from chatlab.forwarded import TrustedProxies
from chatlab.settings import SettingError, Spec, SpecSettings, specs_help
from chatlab.tls import check_ca_file, server_context

__all__ = [
    "REGRESSIONS",
    "SPECS",
    "TRANSPORTS",
    "SettingError",
    "Settings",
    "redact_url",
    "settings_help",
]

SPECS: tuple[Spec, ...] = (
    *NETWORK_SPECS,
    *PERFORMANCE_SPECS,
    *STORAGE_SPECS,
    *KEYS_SPECS,
    *OBSERVABILITY_SPECS,
    *LIMITS_SPECS,
)


@dataclass(frozen=True)
class Settings(SpecSettings):
    """Every chat server setting, validated. Build it with :meth:`load`."""

    specs: ClassVar[tuple[Spec, ...]] = SPECS

    host: str
    port: int
    tls_cert_file: str
    tls_key_file: str
    trusted_proxies: TrustedProxies
    tls_ca_file: str
    serializer: str
    event_loop: str
    ws_deflate: str
    cpu_affinity: tuple[int, ...] | None
    workers: int
    broker: str
    redis_url: str
    redis_cluster: bool
    redis_ack_replicas: int | None
    redis_node_connections: int
    redis_pool_wait_s: float
    presence_lease_s: float
    chat_db: str
    chat_db_synchronous: str
    store_queue_max: int
    send_ref_window_s: float
    send_ref_max: int
    store_batch_max: int
    chat_db_commit: str
    chat_db_commit_interval_ms: float
    chat_db_checkpoint_pages: int
    chat_db_checkpointer: str
    chat_db_wal_max_bytes: int
    gc_policy: str
    gc_full_interval_s: float
    jwt_public_key: str
    jwt_algorithm: str
    jwt_issuer: str
    jwt_audience: str
    jwt_jwks_url: tuple[str, ...]
    jwks_refresh_s: float
    #: None: auto (see :meth:`jwks_stale_after_s`)
    jwks_max_age_s: float | None
    jwt_leeway_s: float
    profile: str
    profile_interval_s: float
    profile_dir: str
    profile_run: str
    metrics_port: int
    expose_internals: bool
    auth_public_url: tuple[str, ...]
    max_frame_bytes: int
    max_body_chars: int
    max_protocol_errors: int
    max_outbound_bytes: int
    socket_send_buffer_bytes: int
    partial_message_timeout_s: float
    max_partial_bytes: int
    rate_limit_per_s: float
    rate_limit_burst: int
    max_rooms_per_connection: int
    max_history_bytes: int
    history_max: int
    max_connections: int
    max_connections_per_address: int
    transport: str
    regression: str
    auth_inline_port: int
    close_timeout_s: float
    drain_grace_s: float
    drain_notice_s: float
    ping_interval_s: float
    ping_timeout_s: float
    overload_lag_ms: int
    overload_interval_ms: int
    log_level: str
    worker_seat: str

    def jwks_stale_after_s(self) -> float:
        """``JWKS_MAX_AGE_S``, or 3 x ``JWKS_REFRESH_S`` when it is ``auto``."""
        return 3 * self.jwks_refresh_s if self.jwks_max_age_s is None else self.jwks_max_age_s

    def _check_combinations(self) -> None:
        if self.tls_cert_file or self.tls_key_file:
            server_context(self.tls_cert_file, self.tls_key_file)
        check_ca_file("TLS_CA_FILE", self.tls_ca_file)
        if self.jwks_max_age_s is not None and self.jwks_max_age_s < 2 * self.jwks_refresh_s:
            raise SettingError(
                "JWKS_MAX_AGE_S",
                f"{self.jwks_max_age_s:g}",
                f"at least 2 x JWKS_REFRESH_S = {2 * self.jwks_refresh_s:g} (one missed refresh "
                "is no alarm)",
            )
        if self.transport == "picows" and self.regression == "deflate_max_window":
            raise SettingError(
                "REGRESSION",
                self.regression,
                "deflate_max_window needs TRANSPORT=websockets (on picows only WS_DEFLATE=shared)",
            )
        if self.transport == "picows" and self.ws_deflate == "on":
            raise SettingError(
                "TRANSPORT",
                self.transport,
                "picows has no permessage-deflate with context takeover: WS_DEFLATE=on needs"
                " TRANSPORT=websockets (WS_DEFLATE=shared runs on both)",
            )
        if self.regression == "deflate_max_window" and self.ws_deflate != "on":
            raise SettingError(
                "REGRESSION",
                self.regression,
                "deflate_max_window needs WS_DEFLATE=on (shared compresses with one window,"
                " 2^9, for every connection)",
            )
        if self.regression == "auth_inline" and self.workers > 1:
            raise SettingError(
                "REGRESSION", self.regression, "auth_inline needs WORKERS=1 (one inline port)"
            )
        if self.workers > 1 and self.broker == "memory":
            raise SettingError(
                "WORKERS",
                str(self.workers),
                "WORKERS above 1 needs BROKER=redis (BROKER=memory fans out in one process only)",
            )
        if self.redis_cluster and self.broker != "redis":
            raise SettingError("REDIS_CLUSTER", "on", "REDIS_CLUSTER=on needs BROKER=redis")
        if self.redis_cluster and (
            self.redis_url.startswith("unix://")
            or any(redis_db(seed) for seed in self.redis_url.split(","))
        ):
            raise SettingError(
                "REDIS_URL",
                redact_url(self.redis_url),
                "a Redis Cluster's seeds are redis:// or rediss:// URLs of database 0",
            )
        if not self.redis_cluster and "," in self.redis_url:
            raise SettingError(
                "REDIS_URL",
                redact_url(self.redis_url),
                "one URL (several seed nodes need REDIS_CLUSTER=on)",
            )
        try:
            commit_place(self.chat_db_commit, self.chat_db_synchronous)
        except ValueError:
            raise SettingError(
                "CHAT_DB_COMMIT",
                self.chat_db_commit,
                "CHAT_DB_SYNCHRONOUS=full fsyncs every commit: it stays off the event loop"
                " (thread or auto)",
            ) from None
        if self.max_partial_bytes < self.max_frame_bytes:
            raise SettingError(
                "MAX_PARTIAL_BYTES",
                str(self.max_partial_bytes),
                f"at least MAX_FRAME_BYTES ({self.max_frame_bytes}): one whole message must fit",
            )
        if self.ping_interval_s and not self.ping_timeout_s:
            raise SettingError("PING_TIMEOUT_S", "0", "must be above 0 while PING_INTERVAL_S is on")

    @property
    def ack_replicas(self) -> int:
        """Replicas each commit waits for: ``REDIS_ACK_REPLICAS``, ``auto`` resolved."""
        if self.redis_ack_replicas is not None:
            return self.redis_ack_replicas
        return 1 if self.redis_cluster else 0

    @property
    def store_commit_place(self) -> str:
        """Where SQLite group commits run: ``loop`` or ``thread`` (``auto`` resolved by
        :func:`~chat_server.store.sqlite_policy.commit_place`)."""
        return commit_place(self.chat_db_commit, self.chat_db_synchronous)

    def summary(self) -> str:
        """One line naming the performance toggles in force, for the start-up log."""
        affinity = "off" if self.cpu_affinity is None else ",".join(map(str, self.cpu_affinity))
        return (
            f"serializer={self.serializer} loop={self.event_loop} "
            f"deflate={self.ws_deflate} affinity={affinity} "
            f"workers={self.workers} broker={self.broker} transport={self.transport} "
            + (
                f"store=redis{'-cluster' if self.redis_cluster else ''}:"
                f"{redis_location(self.redis_url.split(',')[0])}"
                f" ack_replicas={self.ack_replicas}"
                if self.broker == "redis"
                else f"store=sqlite:{self.chat_db} synchronous={self.chat_db_synchronous}"
                f" commit={self.store_commit_place}"
            )
            + f" gc={self.gc_policy}"
            + (f" REGRESSION={self.regression}" if self.regression != "off" else "")
        )


def settings_help() -> str:
    """The chat server's ``--help`` epilog."""
    return specs_help(SPECS)
