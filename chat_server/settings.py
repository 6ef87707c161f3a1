"""Settings: every toggle of the chat server, read once from ``.env`` and the environment.

:meth:`Settings.load` (from :class:`chatlab.settings.SpecSettings`) merges ``.env``
(from the working directory) with the process environment (the environment wins),
parses and validates every value, and returns one frozen object that is passed
explicitly to whatever needs it. A bad value raises :class:`SettingError`, which
``python -m chat_server`` turns into one line naming the variable, the value and what
is allowed, and exit status 2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from chat_server.core.chat import MAX_ROOMS_PER_CONNECTION_DEFAULT
from chat_server.store.sqlite_policy import (
    COMMIT_PLACES,
    DEFAULT_BATCH_MAX,
    DEFAULT_CHECKPOINT_PAGES,
    DEFAULT_COMMIT_INTERVAL_MS,
    DEFAULT_QUEUE_MAX,
    DEFAULT_SYNCHRONOUS,
    DEFAULT_WAL_MAX_BYTES,
    commit_place,
)
from chatlab.settings import (
    SettingError,
    Spec,
    SpecSettings,
    choice,
    http_urls,
    integer,
    number,
    on_off,
    optional_text,
    parse_core_list,
    specs_help,
    text,
)
from chatlab.tls import TLS_SERVER_SPECS, check_ca_file, server_context

__all__ = ["REGRESSIONS", "SPECS", "TRANSPORTS", "SettingError", "Settings", "settings_help"]


def _redis_url(raw: str) -> str:
    value = raw.strip()
    seeds = [seed.strip() for seed in value.split(",")]
    if not all(seed.startswith(("redis://", "rediss://", "unix://")) for seed in seeds):
        raise ValueError(
            "allowed: a redis://, rediss:// or unix:// URL (with REDIS_CLUSTER=on: several,"
            " comma-separated)"
        )
    return ",".join(seeds)


#: most replicas REDIS_ACK_REPLICAS may ask for (a primary with more is rare)
ACK_REPLICAS_MAX = 8


def _ack_replicas(raw: str) -> int | None:
    """``auto`` (None: 0 on one Redis, 1 on a cluster) or how many replicas, 0-8."""
    value = raw.strip().lower()
    if value == "auto":
        return None
    if value.isdigit() and int(value) <= ACK_REPLICAS_MAX:
        return int(value)
    raise ValueError(f"allowed: auto, or 0 to {ACK_REPLICAS_MAX}")


ASYMMETRIC_JWT_ALGORITHMS = ("EdDSA", "ES256", "ES384", "ES512", "RS256", "RS384", "RS512", "PS256")


def _jwt_algorithm(raw: str) -> str:
    value = raw.strip()
    if value not in ASYMMETRIC_JWT_ALGORITHMS:
        raise ValueError(
            "allowed: " + ", ".join(ASYMMETRIC_JWT_ALGORITHMS) + " (never none, never HS*)"
        )
    return value


_WORKER_SEAT = re.compile(r"^\d+(:\d+){4}$")


def _max_age(raw: str) -> float | None:
    """``auto`` (None) or a number of seconds, at least 1."""
    if raw.strip() == "auto":
        return None
    try:
        return number(1)(raw)
    except ValueError:
        raise ValueError("allowed: auto (3 x JWKS_REFRESH_S) or a number >= 1") from None


def _jwks_urls(raw: str) -> tuple[str, ...]:
    """Empty (keys from JWT_PUBLIC_KEY) or one or more JWK set URLs, comma-separated."""
    return http_urls(raw) if raw.strip() else ()


def _worker_seat(raw: str) -> str:
    value = raw.strip()
    if value and not _WORKER_SEAT.match(value):
        raise ValueError("allowed: empty (the supervisor sets it for its workers)")
    return value


_RUN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def _run_name(raw: str) -> str:
    value = raw.strip()
    if value and not _RUN_NAME.match(value):
        raise ValueError(
            "allowed: empty, or a directory name of A-Za-z0-9_.- (not starting with . or -)"
        )
    return value


# ---- the table of settings ------------------------------------------------------------


#: ``TRANSPORT`` values: the websocket implementations the server runs on
TRANSPORTS = ("websockets", "picows")

REGRESSIONS = (
    "off",
    "commit_per_message",
    "encode_per_recipient",
    "blocking_loop",
    "auth_inline",
    "deflate_max_window",
)

SPECS: tuple[Spec, ...] = (
    Spec("CHAT_HOST", "host", "127.0.0.1", text, "address the chat server listens on"),
    Spec(
        "CHAT_PORT",
        "port",
        "8000",
        integer(1, 65535),
        "port of the websocket path /ws and /healthz",
    ),
    *TLS_SERVER_SPECS,
    Spec(
        "TLS_CA_FILE",
        "tls_ca_file",
        "",
        optional_text,
        "PEM CA certificates that verify an https:// JWT_JWKS_URL (empty: the system's CAs)",
    ),
    Spec(
        "SERIALIZER",
        "serializer",
        "orjson",
        choice("json", "orjson", "protobuf"),
        "wire codec: json (stdlib), orjson, protobuf (binary frames)",
    ),
    Spec(
        "EVENT_LOOP",
        "event_loop",
        "uvloop",
        choice("asyncio", "uvloop"),
        "event loop implementation",
    ),
    Spec(
        "WS_DEFLATE",
        "ws_deflate",
        "off",
        choice("off", "on", "shared"),
        "accept permessage-deflate: off; on (context takeover: a compressor per connection,"
        " window 2^12, memLevel 5); shared (no context takeover: each broadcast compressed"
        " once, window 2^9, for every member that negotiated it)",
    ),
    Spec(
        "CPU_AFFINITY",
        "cpu_affinity",
        "off",
        parse_core_list,
        "pin the process to these cores (off, 0, 0,1, 0-1)",
    ),
    Spec(
        "WORKERS",
        "workers",
        "1",
        integer(1, 1024),
        "server processes sharing the port (above 1: needs BROKER=redis)",
    ),
    Spec(
        "BROKER",
        "broker",
        "memory",
        choice("memory", "redis"),
        "the backend of fan-out AND history: memory (one process; SQLite history at CHAT_DB)"
        " or redis (many processes; pub/sub fan-out and Redis Streams history)",
    ),
    Spec(
        "REDIS_URL",
        "redis_url",
        "redis://127.0.0.1:6379/0",
        _redis_url,
        "used when BROKER=redis; unreachable at start: exit 2. With REDIS_CLUSTER=on: seed"
        " nodes of the cluster, comma-separated (redis://10.0.0.1:7000,redis://10.0.0.2:7000)",
    ),
    Spec(
        "REDIS_CLUSTER",
        "redis_cluster",
        "off",
        on_off,
        "with BROKER=redis: off (one Redis at REDIS_URL) or on (a Redis Cluster: rooms spread"
        " over its primaries by slot, sharded pub/sub on each room's node)",
    ),
    Spec(
        "REDIS_ACK_REPLICAS",
        "redis_ack_replicas",
        "auto",
        _ack_replicas,
        "with BROKER=redis: replicas that must hold a commit (Redis WAIT) before it is acked"
        " or delivered; auto: 0 on one Redis, 1 with REDIS_CLUSTER=on. A shard with fewer"
        " answers sends to its rooms unavailable",
    ),
    Spec(
        "REDIS_NODE_CONNECTIONS",
        "redis_node_connections",
        "64",
        integer(1, 10000),
        "with BROKER=redis: requests (reads, presence) one process has in flight to one Redis"
        " node at most, besides each node's commit writer and subscription; past it a request"
        " waits REDIS_POOL_WAIT_S for its turn, then gets unavailable",
    ),
    Spec(
        "REDIS_POOL_WAIT_S",
        "redis_pool_wait_s",
        "1",
        number(0.01, 60),
        "with BROKER=redis: how long a request waits for a turn on a busy Redis node"
        " (REDIS_NODE_CONNECTIONS) before it is answered unavailable",
    ),
    Spec(
        "PRESENCE_LEASE_S",
        "presence_lease_s",
        "5",
        number(1, 3600),
        "with BROKER=redis: a process silent this long loses its members' presence",
    ),
    Spec(
        "CHAT_DB",
        "chat_db",
        "data/chat.sqlite3",
        text,
        "SQLite file holding rooms' history (unused with BROKER=redis)",
    ),
    Spec(
        "CHAT_DB_SYNCHRONOUS",
        "chat_db_synchronous",
        DEFAULT_SYNCHRONOUS,
        choice("normal", "full"),
        "SQLite synchronous level: normal survives kill -9, full also power loss",
    ),
    Spec(
        "STORE_QUEUE_MAX",
        "store_queue_max",
        str(DEFAULT_QUEUE_MAX),
        integer(1),
        "messages waiting for the history writer; past it a send gets unavailable",
    ),
    Spec(
        "SEND_REF_WINDOW_S",
        "send_ref_window_s",
        "300",
        number(0),
        "a resent send (same ref and body) within it gets the original ack; 0: off",
    ),
    Spec(
        "SEND_REF_MAX",
        "send_ref_max",
        "100000",
        integer(1),
        "committed (ref, body) pairs kept for SEND_REF_WINDOW_S at most (oldest forgotten first)",
    ),
    Spec(
        "STORE_BATCH_MAX",
        "store_batch_max",
        str(DEFAULT_BATCH_MAX),
        integer(1),
        "most messages in one group commit",
    ),
    Spec(
        "CHAT_DB_COMMIT",
        "chat_db_commit",
        "auto",
        choice(*COMMIT_PLACES),
        "where group commits run: loop (on the event loop, no thread hand-off), thread"
        " (a writer thread); auto: loop with synchronous=normal, thread with full",
    ),
    Spec(
        "CHAT_DB_COMMIT_INTERVAL_MS",
        "chat_db_commit_interval_ms",
        str(DEFAULT_COMMIT_INTERVAL_MS),
        number(0, 100),
        "least time between two group commits: sends arriving sooner wait for it and join"
        " the next one (0: a commit every event-loop iteration)",
    ),
    Spec(
        "CHAT_DB_CHECKPOINT_PAGES",
        "chat_db_checkpoint_pages",
        str(DEFAULT_CHECKPOINT_PAGES),
        integer(1),
        "WAL pages that start a PASSIVE checkpoint, run on its own thread and connection"
        " (its priority: CHAT_DB_CHECKPOINTER); at 16 times that the checkpointer holds the"
        " commits for a few ms and restarts the WAL, so its file stays bounded under load",
    ),
    Spec(
        "CHAT_DB_CHECKPOINTER",
        "chat_db_checkpointer",
        "idle",
        choice("idle", "normal"),
        "the checkpointer thread's priority on the server's core: idle (SCHED_IDLE, in the"
        " loop's idle time; raised while a checkpoint runs past 2 s and while it holds the"
        " commits to restart the WAL) or normal",
    ),
    Spec(
        "CHAT_DB_WAL_MAX_BYTES",
        "chat_db_wal_max_bytes",
        str(DEFAULT_WAL_MAX_BYTES),
        integer(1 << 20),
        "WAL size past which sends get unavailable until a checkpoint catches up"
        " (a reader holding an old snapshot can stall checkpoints)",
    ),
    Spec(
        "GC_POLICY",
        "gc_policy",
        "tuned",
        choice("tuned", "default"),
        "tuned: freeze start-up objects, raise thresholds, full collections when idle"
        " (docs/performance.md); default: CPython's own",
    ),
    Spec(
        "GC_FULL_INTERVAL_S",
        "gc_full_interval_s",
        "600",
        number(1),
        "with GC_POLICY=tuned: at most this long between full collections under load",
    ),
    Spec(
        "JWT_PUBLIC_KEY",
        "jwt_public_key",
        "keys/jwt_public.pem",
        text,
        "PEM public key the chat server verifies tokens with",
    ),
    Spec(
        "JWT_ALGORITHM",
        "jwt_algorithm",
        "EdDSA",
        _jwt_algorithm,
        "the only token algorithm accepted",
    ),
    Spec("JWT_ISSUER", "jwt_issuer", "chatlab-auth", text, "required iss of every token"),
    Spec("JWT_AUDIENCE", "jwt_audience", "chatlab-chat", text, "required aud of every token"),
    Spec(
        "JWT_JWKS_URL",
        "jwt_jwks_url",
        "",
        _jwks_urls,
        "take keys from this JWK set instead of JWT_PUBLIC_KEY (empty: off); several "
        "auth replicas' sets, comma-separated: the keys of every set that answers",
    ),
    Spec(
        "JWKS_REFRESH_S",
        "jwks_refresh_s",
        "60",
        number(1),
        "seconds between background refreshes of the JWK set",
    ),
    Spec(
        "JWKS_MAX_AGE_S",
        "jwks_max_age_s",
        "auto",
        _max_age,
        "age (since the last refresh that worked) past which the JWK set is stale: its keys "
        "are still accepted, /healthz and chat_jwks_age_seconds say so, the alert fires "
        "(auto: 3 x JWKS_REFRESH_S; a number: at least 2 x JWKS_REFRESH_S)",
    ),
    Spec(
        "JWT_LEEWAY_S",
        "jwt_leeway_s",
        "5",
        number(0, 300),
        "seconds the auth host's clock may be off from this one's: allowed on exp, nbf, iat",
    ),
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
    Spec(
        "AUTH_PUBLIC_URL",
        "auth_public_url",
        "http://127.0.0.1:8001",
        http_urls,
        "the auth service as the web page at GET / reaches it (register, log in); several "
        "replicas comma-separated: the page starts at one and tries the next on failure",
    ),
    Spec(
        "MAX_FRAME_BYTES",
        "max_frame_bytes",
        "65536",
        integer(64),
        "largest incoming frame; above it close 1009",
    ),
    Spec(
        "MAX_BODY_CHARS",
        "max_body_chars",
        "4000",
        integer(1),
        "longest message body; above it too_large",
    ),
    Spec(
        "MAX_PROTOCOL_ERRORS",
        "max_protocol_errors",
        "10",
        integer(1),
        "errors in one connection before close 1008",
    ),
    Spec(
        "MAX_OUTBOUND_BYTES",
        "max_outbound_bytes",
        "1048576",
        integer(1024),
        "bytes held for a connection that is not reading; past it close 1013",
    ),
    Spec(
        "SOCKET_SEND_BUFFER_BYTES",
        "socket_send_buffer_bytes",
        "65536",
        integer(0),
        "kernel send buffer per connection (SO_SNDBUF; Linux doubles it); 0: the kernel's own",
    ),
    Spec(
        "PARTIAL_MESSAGE_TIMEOUT_S",
        "partial_message_timeout_s",
        "10",
        number(0.01),
        "a message sent in several frames must be whole this long after its first; past it"
        " close 1008",
    ),
    Spec(
        "MAX_PARTIAL_BYTES",
        "max_partial_bytes",
        str(16 * 1024 * 1024),
        integer(1024),
        "bytes all connections' partial messages may hold in one process (40 KiB more for each"
        " compressed one's inflater); the frame that would pass it: close 1013",
    ),
    Spec(
        "RATE_LIMIT_PER_S",
        "rate_limit_per_s",
        "20",
        number(0.001),
        "frames per second per connection (token bucket)",
    ),
    Spec("RATE_LIMIT_BURST", "rate_limit_burst", "100", integer(1), "token bucket size"),
    Spec(
        "MAX_ROOMS_PER_CONNECTION",
        "max_rooms_per_connection",
        str(MAX_ROOMS_PER_CONNECTION_DEFAULT),
        integer(1),
        "rooms one connection may be in at once; a join past it gets too_many_rooms",
    ),
    Spec(
        "MAX_HISTORY_BYTES",
        "max_history_bytes",
        "262144",
        integer(1024),
        "encoded size one history reply may reach",
    ),
    Spec("HISTORY_MAX", "history_max", "0", integer(0), "messages kept per room (0: all)"),
    Spec(
        "MAX_CONNECTIONS",
        "max_connections",
        "10000",
        integer(1),
        "open connections; past it the handshake gets 503; sizes the open-files limit",
    ),
    Spec(
        "TRANSPORT",
        "transport",
        "websockets",
        choice(*TRANSPORTS),
        "websocket implementation: websockets, or picows (permessage-deflate only shared)",
    ),
    Spec(
        "REGRESSION",
        "regression",
        "off",
        choice(*REGRESSIONS),
        "one deliberate mistake for the lab (off in real use)",
    ),
    Spec(
        "AUTH_INLINE_PORT",
        "auth_inline_port",
        "8002",
        integer(1, 65535),
        "with REGRESSION=auth_inline: port of the inline POST /login",
    ),
    Spec(
        "CLOSE_TIMEOUT_S",
        "close_timeout_s",
        "5",
        number(0.01),
        "wait for a closing handshake (1013, 1001) before dropping the connection",
    ),
    Spec(
        "DRAIN_GRACE_S",
        "drain_grace_s",
        "1",
        number(0, 300),
        "on SIGTERM: after committing, keep connections this long (sends get unavailable)",
    ),
    Spec("PING_INTERVAL_S", "ping_interval_s", "20", number(0), "keepalive ping interval (0: off)"),
    Spec(
        "PING_TIMEOUT_S",
        "ping_timeout_s",
        "20",
        number(0),
        "a peer that does not answer a ping within this is closed with 1011",
    ),
    Spec(
        "LOG_LEVEL",
        "log_level",
        "info",
        choice("debug", "info", "warning", "error"),
        "logging level",
    ),
    Spec(
        "CHATLAB_WORKER",
        "worker_seat",
        "",
        _worker_seat,
        "set by the supervisor for each worker it starts (WORKERS > 1): leave it empty",
    ),
)


@dataclass(frozen=True)
class Settings(SpecSettings):
    """Every chat server setting, validated. Build it with :meth:`load`."""

    specs: ClassVar[tuple[Spec, ...]] = SPECS

    host: str
    port: int
    tls_cert_file: str
    tls_key_file: str
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
    transport: str
    regression: str
    auth_inline_port: int
    close_timeout_s: float
    drain_grace_s: float
    ping_interval_s: float
    ping_timeout_s: float
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
            or any(_redis_db(seed) for seed in self.redis_url.split(","))
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
                f"{_redis_location(self.redis_url.split(',')[0])}"
                f" ack_replicas={self.ack_replicas}"
                if self.broker == "redis"
                else f"store=sqlite:{self.chat_db} synchronous={self.chat_db_synchronous}"
                f" commit={self.store_commit_place}"
            )
            + f" gc={self.gc_policy}"
            + (f" REGRESSION={self.regression}" if self.regression != "off" else "")
        )


def _redis_db(url: str) -> int:
    """The database number of a Redis URL (0 when it names none)."""
    path = url.partition("://")[2].partition("/")[2].partition("?")[0]
    return int(path) if path.isdigit() else 0


def _redis_location(url: str) -> str:
    """``host:port/db`` of a Redis URL, without any password it holds (for logs)."""
    _, _, rest = url.partition("://")
    return rest.rpartition("@")[2]


def redact_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part, if any, replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    user = credentials.partition(":")[0]
    return f"{scheme}{sep}{user}:***@{location}"


def settings_help() -> str:
    """The chat server's ``--help`` epilog."""
    return specs_help(SPECS)
