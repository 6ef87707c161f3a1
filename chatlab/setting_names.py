"""Every environment name the two services read: one ``.env`` serves both.

A key in an env file that neither service knows is usually a typo of one they do
(``SERIALISER`` for ``SERIALIZER``); :func:`resembled` names the setting it looks like,
and :mod:`chatlab.settings` refuses such a file at start. The environment holds many
names neither service reads, so there only a name one edit from a setting's
(:func:`one_edit_from`: ``SERIALISER=json``) is taken for a typo, and warned about, not
refused. This table is written out
here (neither service is imported: the arrows point from them to ``chatlab``), and a
test holds it equal to the names in both services' ``SPECS``.
"""

from __future__ import annotations

import difflib

#: the chat server's settings (``chat_server/settings/``)
CHAT_SERVER = frozenset(
    {
        "AUTH_INLINE_PORT",
        "AUTH_PUBLIC_URL",
        "BROKER",
        "CHATLAB_WORKER",
        "CHAT_DB",
        "CHAT_DB_CHECKPOINTER",
        "CHAT_DB_CHECKPOINT_PAGES",
        "CHAT_DB_COMMIT",
        "CHAT_DB_COMMIT_INTERVAL_MS",
        "CHAT_DB_SYNCHRONOUS",
        "CHAT_DB_WAL_MAX_BYTES",
        "CHAT_HOST",
        "CHAT_PORT",
        "CLOSE_TIMEOUT_S",
        "CPU_AFFINITY",
        "DRAIN_GRACE_S",
        "DRAIN_NOTICE_S",
        "EVENT_LOOP",
        "EXPOSE_INTERNALS",
        "GC_FULL_INTERVAL_S",
        "GC_POLICY",
        "HISTORY_MAX",
        "JWKS_MAX_AGE_S",
        "JWKS_REFRESH_S",
        "JWT_ALGORITHM",
        "JWT_AUDIENCE",
        "JWT_ISSUER",
        "JWT_JWKS_URL",
        "JWT_LEEWAY_S",
        "JWT_PUBLIC_KEY",
        "LOG_LEVEL",
        "MAX_BODY_CHARS",
        "MAX_CONNECTIONS",
        "MAX_CONNECTIONS_PER_ADDRESS",
        "MAX_FRAME_BYTES",
        "MAX_HISTORY_BYTES",
        "MAX_OUTBOUND_BYTES",
        "MAX_PARTIAL_BYTES",
        "MAX_PROTOCOL_ERRORS",
        "MAX_ROOMS_PER_CONNECTION",
        "METRICS_PORT",
        "OVERLOAD_INTERVAL_MS",
        "OVERLOAD_LAG_MS",
        "PARTIAL_MESSAGE_TIMEOUT_S",
        "PING_INTERVAL_S",
        "PING_TIMEOUT_S",
        "PRESENCE_LEASE_S",
        "PROFILE",
        "PROFILE_DIR",
        "PROFILE_INTERVAL_S",
        "PROFILE_RUN",
        "RATE_LIMIT_BURST",
        "RATE_LIMIT_PER_S",
        "REDIS_ACK_REPLICAS",
        "REDIS_NODE_CONNECTIONS",
        "REDIS_POOL_WAIT_S",
        "REDIS_CLUSTER",
        "REDIS_URL",
        "REGRESSION",
        "SEND_REF_MAX",
        "SEND_REF_WINDOW_S",
        "SERIALIZER",
        "SOCKET_SEND_BUFFER_BYTES",
        "STORE_BATCH_MAX",
        "STORE_QUEUE_MAX",
        "TLS_CA_FILE",
        "TLS_CERT_FILE",
        "TLS_KEY_FILE",
        "TRANSPORT",
        "TRUSTED_PROXIES",
        "WORKERS",
        "WS_DEFLATE",
    }
)

#: the auth service's settings (``auth_service/settings.py``)
AUTH_SERVICE = frozenset(
    {
        "ARGON2_MEMORY_COST_KIB",
        "ARGON2_PARALLELISM",
        "ARGON2_TIME_COST",
        "AUTH_BODY_TIMEOUT_S",
        "AUTH_CORS_ORIGINS",
        "AUTH_DB",
        "AUTH_DB_POOL_MAX",
        "AUTH_DB_TIMEOUT_S",
        "AUTH_DB_URL",
        "AUTH_HEADER_TIMEOUT_S",
        "AUTH_HOST",
        "AUTH_IDLE_TIMEOUT_S",
        "AUTH_KEY_ACTIVATION_S",
        "AUTH_MAX_CONNECTIONS",
        "AUTH_PORT",
        "EVENT_LOOP",
        "HASH_POOL_SIZE",
        "HASH_QUEUE_MAX",
        "JWT_AUDIENCE",
        "JWT_ISSUER",
        "JWT_KEYRING",
        "JWT_PRIVATE_KEY",
        "JWT_PUBLIC_KEY",
        "LOGIN_BURST_PER_CLIENT",
        "LOGIN_BURST_PER_USER",
        "LOGIN_BURST_PER_USER_CLIENT",
        "LOGIN_RATE_PER_CLIENT_PER_MIN",
        "LOGIN_RATE_PER_USER_CLIENT_PER_MIN",
        "LOGIN_RATE_PER_USER_PER_MIN",
        "LOG_LEVEL",
        "RATE_LIMIT_KEYS_MAX",
        "REFRESH_BURST_PER_CLIENT",
        "REFRESH_FAMILIES_PER_USER",
        "REFRESH_GRACE_S",
        "REFRESH_RATE_PER_CLIENT_PER_MIN",
        "REFRESH_TTL_S",
        "REGISTER_BURST_PER_CLIENT",
        "REGISTER_RATE_PER_CLIENT_PER_MIN",
        "TLS_CERT_FILE",
        "TLS_KEY_FILE",
        "TOKEN_TTL_S",
        "TRUSTED_PROXIES",
    }
)

#: every name either service reads
KNOWN = CHAT_SERVER | AUTH_SERVICE

#: how alike (difflib's ratio, 0 to 1) an unknown name must be to a known one to be taken
#: for its typo: one letter swapped or missing in a name of 8 or more scores 0.88 or more
#: (SERIALISER 0.9, CHAT_PROT 0.89, LOG_LEVL 0.94), a missing unit suffix 0.9 (TOKEN_TTL);
#: two unrelated names sharing a prefix score less (REDIS_HOST against REDIS_URL 0.63)
RESEMBLANCE = 0.75


def resembled(name: str) -> str | None:
    """The known name that ``name`` (unknown to both services) looks like a typo of, if any.

    Case is ignored: ``serializer`` resembles ``SERIALIZER``. A known name resembles
    nothing (None).
    """
    if name in KNOWN:
        return None
    close = difflib.get_close_matches(name.upper(), sorted(KNOWN), n=1, cutoff=RESEMBLANCE)
    return close[0] if close else None


def one_edit_from(name: str) -> str | None:
    """The setting ``name`` (unknown to both services) is one edit from, if any: one letter
    changed, added, dropped, or two neighbours swapped, case ignored (``serializer`` and
    ``SERIALISER`` are one edit from ``SERIALIZER``). A known name is one edit from nothing.

    Stricter than :func:`resembled`: the environment holds names that merely look alike
    (``BROWSER`` and ``BROKER`` are two edits apart)."""
    if name in KNOWN:
        return None
    folded = name.upper()
    return next((known for known in sorted(KNOWN) if _within_one_edit(folded, known)), None)


def _within_one_edit(a: str, b: str) -> bool:
    """``a`` and ``b`` are equal or one substitution, insertion, deletion or swap of two
    neighbouring letters apart."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    start = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    if len(a) < len(b):  # one letter added to ``a``
        return a[start:] == b[start + 1 :]
    if a[start + 1 :] == b[start + 1 :]:  # one letter changed (or none)
        return True
    swapped = a[start : start + 2] == b[start : start + 2][::-1]
    return swapped and a[start + 2 :] == b[start + 2 :]
