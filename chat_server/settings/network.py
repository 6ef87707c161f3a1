"""Where the chat server listens, how it speaks TLS, and where its page sends users to log in."""

from __future__ import annotations

from chatlab.forwarded import TRUSTED_PROXIES_SPEC
from chatlab.settings import Spec, http_urls, integer, optional_text, text
from chatlab.tls import TLS_SERVER_SPECS

NETWORK_SPECS: tuple[Spec, ...] = (
    Spec("CHAT_HOST", "host", "127.0.0.1", text, "address the chat server listens on"),
    Spec(
        "CHAT_PORT",
        "port",
        "8000",
        integer(1, 65535),
        "port of the websocket path /ws and /healthz",
    ),
    *TLS_SERVER_SPECS,
    TRUSTED_PROXIES_SPEC,
    Spec(
        "TLS_CA_FILE",
        "tls_ca_file",
        "",
        optional_text,
        "PEM CA certificates that verify an https:// JWT_JWKS_URL (empty: the system's CAs)",
    ),
    Spec(
        "AUTH_PUBLIC_URL",
        "auth_public_url",
        "http://127.0.0.1:8001",
        http_urls,
        "the auth service as the web page at GET / reaches it (register, log in); several "
        "replicas comma-separated: the page starts at one and tries the next on failure",
    ),
)
