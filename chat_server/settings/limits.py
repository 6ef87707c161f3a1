"""The bounds each client may push against: sizes, rates, counts and timeouts.

Each one is a row of ``docs/protocol.md``'s Limits table, with its answer past it.
"""

from __future__ import annotations

from chat_server.core.chat import MAX_ROOMS_PER_CONNECTION_DEFAULT
from chatlab.settings import Spec, integer, number

#: MAX_CONNECTIONS_PER_ADDRESS's default: far above what one person opens (a connection
#: per browser tab), so an office or campus behind one NAT address is served, and still
#: 1/39 of MAX_CONNECTIONS' default, so no one address takes a process' every connection
MAX_CONNECTIONS_PER_ADDRESS_DEFAULT = 256

LIMITS_SPECS: tuple[Spec, ...] = (
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
        "MAX_CONNECTIONS_PER_ADDRESS",
        "max_connections_per_address",
        str(MAX_CONNECTIONS_PER_ADDRESS_DEFAULT),
        integer(0),
        "open connections from one client address (behind a proxy in TRUSTED_PROXIES: the"
        " address its X-Forwarded-For names); past it the handshake gets 503 (0: no bound)",
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
    Spec(
        "DRAIN_NOTICE_S",
        "drain_notice_s",
        "2",
        number(0, 300),
        "on SIGTERM: first answer /healthz 503 (draining) this long, still accepting and"
        " serving, so a proxy checking it stops sending connections before the listener"
        " closes (0: close it at once)",
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
        "OVERLOAD_LAG_MS",
        "overload_lag_ms",
        "10",
        integer(0),
        "the event loop this far behind (a 10-ms ticker this late) at every tick for"
        " OVERLOAD_INTERVAL_MS: new sends get unavailable until a tick is on time (0: never)",
    ),
    Spec(
        "OVERLOAD_INTERVAL_MS",
        "overload_interval_ms",
        "20",
        integer(1),
        "how long the loop must stay OVERLOAD_LAG_MS behind before sends are refused: a"
        " standing queue, not one long pause",
    ),
)
