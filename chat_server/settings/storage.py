"""Where history lives and how messages fan out: SQLite in one process, or Redis."""

from __future__ import annotations

from chat_server.store.sqlite_policy import (
    COMMIT_PLACES,
    DEFAULT_BATCH_MAX,
    DEFAULT_CHECKPOINT_PAGES,
    DEFAULT_COMMIT_INTERVAL_MS,
    DEFAULT_QUEUE_MAX,
    DEFAULT_SYNCHRONOUS,
    DEFAULT_WAL_MAX_BYTES,
)
from chatlab.settings import Spec, choice, integer, number, on_off, text


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


def redis_db(url: str) -> int:
    """The database number of a Redis URL (0 when it names none)."""
    path = url.partition("://")[2].partition("/")[2].partition("?")[0]
    return int(path) if path.isdigit() else 0


def redis_location(url: str) -> str:
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


STORAGE_SPECS: tuple[Spec, ...] = (
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
)
