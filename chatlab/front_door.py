"""The front door: an HAProxy configuration that terminates TLS for both services on one
address and balances over N chat processes and M auth replicas.

:func:`render` turns a :class:`FrontDoor` (the backends' addresses, the certificate, where
to log) into the text of a ``haproxy.cfg`` for Debian's haproxy (2.6 and up), and does no
I/O. ``python -m chatlab.front_door`` writes one (``--help``); ``deploy/haproxy/`` holds
two it wrote, each naming in its first line the command that made it.

What the configuration guarantees:

- one ``bind ... ssl`` frontend: the page, ``/ws`` and everything else go to the chat
  processes, :data:`AUTH_PATHS` to the auth replicas, so the page reaches the auth service
  on its own origin (``AUTH_PUBLIC_URL`` is the front door's URL); :data:`HIDDEN_PATHS`
  answer 404 (they stay on the private network); ``/healthz`` is the front door's own
  (200 while each backend has a server up, else 503);
- websocket connections go to the chat process holding the fewest (``leastconn``: they
  last, so counting them balances better than taking turns), and an established one is
  idle at the proxy for at most :attr:`FrontDoor.tunnel_timeout_s`, which must exceed the
  chat server's ``PING_INTERVAL_S`` + ``PING_TIMEOUT_S`` (its pings keep a live one busy);
- HTTP to the auth replicas is balanced by the client's address (``balance source``,
  consistent hashing): each client's per-address login limits live on one replica, as
  the contract's "N replicas" note asks of the load balancer;
- each server is checked with ``GET /healthz`` (200 or out) every
  :attr:`FrontDoor.check_interval_ms`, which must stay below the chat server's
  ``DRAIN_NOTICE_S``: a draining one is out before its listener closes, a dead one gets
  no new connections, and a connection refused meanwhile is retried on another server;
- the client's address reaches the services in ``X-Forwarded-For`` (appended: a service
  takes the right-most address that is not one of its ``TRUSTED_PROXIES``);
- the log records the path without its query (``%HPO``): the page sends its token as
  ``?token=``, which must never reach a log;
- the hop to the backends is plain (a private network) unless :attr:`FrontDoor.backend_ca_file`
  is set: then TLS, each server's certificate verified against that CA (and its name
  against :attr:`FrontDoor.backend_server_name` when set).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

#: the auth service's paths the page and clients call through the front door
AUTH_PATHS = ("/register", "/login", "/refresh", "/logout", "/.well-known/jwks.json")
#: the services' internal answers, never through the front door (``/stats`` names hosts
#: and pids; ``/metrics`` is for Prometheus on the private network)
HIDDEN_PATHS = ("/stats", "/metrics")
#: what the log records of each request: HAProxy's ``option httplog`` fields, but the
#: request as method, path without query (``%HPO``) and version, never ``%r``/``%HU``
LOG_FORMAT = (
    "%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %tsc %ac/%fc/%bc/%sc/%rc %sq/%bq"
    " %{+Q}HM %{+Q}HPO %{+Q}HV"
)


@dataclass(frozen=True)
class FrontDoor:
    """What a front door is made of; :func:`render` writes its configuration."""

    #: chat processes, ``host:port`` each
    chat_servers: tuple[str, ...]
    #: auth replicas, ``host:port`` each
    auth_servers: tuple[str, ...]
    #: PEM holding the certificate chain and its private key (HAProxy's ``crt``)
    cert_file: str
    #: the address clients connect to
    bind: str = ":443"
    #: where the log goes: a syslog socket (Debian's rsyslog reads ``/dev/log``) or
    #: ``stdout`` (haproxy in the foreground, its output captured to a file)
    log_target: str = "/dev/log"
    #: TLS to the backends, verified against this CA file (empty: plain, a private network)
    backend_ca_file: str = ""
    #: the name each backend's certificate must carry (SNI and ``verifyhost``; empty:
    #: any certificate the CA signed)
    backend_server_name: str = ""
    #: an established websocket idle this long in both directions is closed
    tunnel_timeout_s: int = 60
    #: a client that half-closed and went quiet is let go after this long
    client_fin_timeout_s: int = 5
    #: each server's /healthz every this often; a failure takes it out, 2 passes bring
    #: it back: below the chat server's DRAIN_NOTICE_S, so a draining one is out before
    #: its listener closes
    check_interval_ms: int = 1000
    #: connections the proxy holds at once; past it, new ones wait in the kernel's backlog
    max_connections: int = 10000
    #: run as Debian's ``haproxy`` user, chrooted (haproxy started as root, as systemd
    #: does); False: as whoever starts it
    drop_privileges: bool = True
    #: a Unix socket for HAProxy's runtime API (``show stat``), mode 600 (empty: none)
    stats_socket: str = ""
    #: HAProxy's threads (0: its default, one per core it may run on); the lab runs one,
    #: pinned beside the server it measures
    threads: int = 0

    def __post_init__(self) -> None:
        for name, servers in (("chat", self.chat_servers), ("auth", self.auth_servers)):
            if not servers:
                raise ValueError(f"a front door needs at least one {name} server")
            for server in servers:
                host, _, port = server.rpartition(":")
                if not host or not port.isdigit():
                    raise ValueError(f"{name} server {server!r}: host:port expected")
        if self.backend_server_name and not self.backend_ca_file:
            raise ValueError("a backend server name is checked only with a backend CA file")


def _server_lines(prefix: str, servers: tuple[str, ...], front: FrontDoor) -> list[str]:
    tls = ""
    if front.backend_ca_file:
        tls = f" ssl verify required ca-file {front.backend_ca_file}"
        if front.backend_server_name:
            name = front.backend_server_name
            tls += f" sni str({name}) verifyhost {name}"
    return [
        f"    server {prefix}{index} {address} check{tls}"
        for index, address in enumerate(servers, start=1)
    ]


def render(front: FrontDoor, command: str = "") -> str:
    """The ``haproxy.cfg`` text of ``front`` (``command``: the line that made it, as a
    comment at the top)."""
    header = [f"# made by: {command}"] if command else []
    privileges = (
        ["    user haproxy", "    group haproxy", "    chroot /var/lib/haproxy"]
        if front.drop_privileges
        else []
    )
    stats = [f"    stats socket {front.stats_socket} mode 600 level operator"] * bool(
        front.stats_socket
    )
    hop = (
        f"TLS, verified against {front.backend_ca_file}"
        if front.backend_ca_file
        else "plain: the backends are on a private network"
    )
    lines = [
        *header,
        "# The front door of chatlab (chatlab/front_door.py says what it guarantees).",
        f"# The hop to the backends: {hop}.",
        "global",
        f"    log {front.log_target} format raw local0",
        f"    maxconn {front.max_connections}",
        *[f"    nbthread {front.threads}"] * bool(front.threads),
        *privileges,
        *stats,
        # as the services themselves (chatlab.tls.MINIMUM_VERSION)
        "    ssl-default-bind-options ssl-min-ver TLSv1.2",
        "    ssl-default-server-options ssl-min-ver TLSv1.2",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option dontlognull",
        f'    log-format "{LOG_FORMAT}"',
        "    option forwardfor",
        # a connection refused (a process just killed, not yet marked down) is tried
        # again on another server
        "    option redispatch 1",
        "    retries 2",
        "    timeout connect 5s",
        "    timeout client 30s",
        "    timeout server 30s",
        "    timeout http-request 10s",
        "    timeout http-keep-alive 10s",
        f"    timeout tunnel {front.tunnel_timeout_s}s",
        f"    timeout client-fin {front.client_fin_timeout_s}s",
        f"    timeout server-fin {front.client_fin_timeout_s}s",
        "    timeout check 2s",
        f"    default-server inter {front.check_interval_ms}ms fall 1 rise 2",
        "",
        "frontend front_door",
        # HTTP/1.1 only: each websocket its own TCP connection, which leastconn counts
        # and the tunnel timeout applies to
        f"    bind {front.bind} ssl crt {front.cert_file} alpn http/1.1",
        "    monitor-uri /healthz",
        "    monitor fail if { nbsrv(chat) lt 1 } || { nbsrv(auth) lt 1 }",
        f"    http-request deny deny_status 404 if {{ path {' '.join(HIDDEN_PATHS)} }}",
        "    http-request set-header X-Forwarded-Proto https",
        f"    use_backend auth if {{ path {' '.join(AUTH_PATHS)} }}",
        "    default_backend chat",
        "",
        "backend chat",
        "    balance leastconn",
        "    option httpchk GET /healthz",
        "    http-check expect status 200",
        *_server_lines("chat", front.chat_servers, front),
        "",
        "backend auth",
        "    balance source",
        "    hash-type consistent",
        "    option httpchk GET /healthz",
        "    http-check expect status 200",
        *_server_lines("auth", front.auth_servers, front),
    ]
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    defaults = FrontDoor(("h:1",), ("h:1",), "")
    parser = argparse.ArgumentParser(
        prog="python -m chatlab.front_door",
        description="Write an HAProxy configuration that terminates TLS on one address in "
        "front of chat processes (websockets, leastconn) and auth replicas (HTTP).",
    )
    parser.add_argument(
        "--chat", action="append", required=True, metavar="HOST:PORT", help="a chat process"
    )
    parser.add_argument(
        "--auth", action="append", required=True, metavar="HOST:PORT", help="an auth replica"
    )
    parser.add_argument(
        "--cert", required=True, help="PEM with the certificate chain and its private key"
    )
    parser.add_argument("--bind", default=defaults.bind, help="address:port (default %(default)s)")
    parser.add_argument(
        "--log",
        default=defaults.log_target,
        help="syslog socket, or stdout with haproxy in the foreground (default %(default)s)",
    )
    parser.add_argument(
        "--backend-ca", default="", help="TLS to the backends, verified against this CA file"
    )
    parser.add_argument(
        "--backend-name", default="", help="the name the backends' certificates carry"
    )
    parser.add_argument(
        "--tunnel-timeout-s",
        type=int,
        default=defaults.tunnel_timeout_s,
        help="an idle websocket is closed after this long; keep it above the chat server's"
        " PING_INTERVAL_S + PING_TIMEOUT_S (default %(default)s)",
    )
    parser.add_argument(
        "--check-interval-ms",
        type=int,
        default=defaults.check_interval_ms,
        help="GET /healthz on each server this often (default %(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=defaults.max_connections,
        help="connections held at once (default %(default)s)",
    )
    parser.add_argument(
        "--as-current-user",
        action="store_true",
        help="no user/group/chroot: haproxy run unprivileged (tests, the lab)",
    )
    parser.add_argument("--stats-socket", default="", help="a Unix socket for the runtime API")
    parser.add_argument("--out", type=Path, help="write here (default: standard output)")
    return parser


def _without_out(argv: list[str]) -> list[str]:
    """``argv`` without ``--out PATH`` (the file's first line says how to make it anywhere)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            kept.append(arg)
    return kept


def main(argv: list[str] | None = None) -> int:
    """``python -m chatlab.front_door``: write the configuration; exit 2 on a bad argument."""
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        front = FrontDoor(
            chat_servers=tuple(args.chat),
            auth_servers=tuple(args.auth),
            cert_file=args.cert,
            bind=args.bind,
            log_target=args.log,
            backend_ca_file=args.backend_ca,
            backend_server_name=args.backend_name,
            tunnel_timeout_s=args.tunnel_timeout_s,
            check_interval_ms=args.check_interval_ms,
            max_connections=args.max_connections,
            drop_privileges=not args.as_current_user,
            stats_socket=args.stats_socket,
        )
    except ValueError as exc:
        parser.error(str(exc))
    text = render(front, f"{parser.prog} {shlex.join(_without_out(argv))}")
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
