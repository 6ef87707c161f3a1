"""The lab's front door: Debian's HAProxy terminating TLS in front of one chat server, the
hop behind it plain (a private network), started and stopped as a lab run's process.

What a lab run measures through it is the proxy's own CPU per delivered frame beside the
server's, so the configuration is the least that serves websockets over TLS: one thread,
no logging, HTTP mode (HAProxy passes the websocket upgrade and then tunnels the
connection), tunnel timeout far past a run. :func:`haproxy_config` is the one place it
is written; it should give way to ``deploy/haproxy``'s renderer once that is merged (the
deployment's configuration is what a measurement of "behind the proxy" should measure).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from chatlab.harness import ServiceProcess, free_port
from chatlab.throwaway_ca import ThrowawayCA

#: connections the proxy accepts (a lab run opens a few thousand), each also one to the
#: server: the file descriptors it asks for are twice this and some
MAX_CONNECTIONS = 8000


def haproxy_config(port: int, backend_port: int, crt_file: Path) -> str:
    """HAProxy's configuration: TLS on ``127.0.0.1:port`` with the PEM bundle ``crt_file``
    (certificate and key), every connection to the plain chat server on ``backend_port``."""
    return f"""\
global
    nbthread 1
    maxconn {MAX_CONNECTIONS}
    ssl-default-bind-options ssl-min-ver TLSv1.2

defaults
    mode http
    maxconn {MAX_CONNECTIONS}
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout tunnel 1h

frontend chat
    bind 127.0.0.1:{port} ssl crt {crt_file} alpn http/1.1
    default_backend chat

backend chat
    server chat 127.0.0.1:{backend_port}
"""


class HaproxyProcess(ServiceProcess):
    """``haproxy`` in the foreground on a free port, terminating TLS with ``ca``'s server
    certificate in front of the plain chat server on ``backend_port``. :meth:`start`
    returns once the server's ``/healthz`` answers through it, verified against ``ca``."""

    def __init__(self, workdir: Path, backend_port: int, ca: ThrowawayCA) -> None:
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not Path(binary).exists():
            raise RuntimeError("no haproxy here: apt-get install haproxy (scripts/setup.sh)")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.backend_port = backend_port
        self.ca_file = str(ca.ca_file)
        crt_file = workdir / "haproxy.pem"
        crt_file.write_bytes(ca.cert_file.read_bytes() + ca.key_file.read_bytes())
        self.config_path = workdir / "haproxy.cfg"
        self.config_path.write_text(haproxy_config(self.port, backend_port, crt_file))
        self.env = dict(os.environ)
        self.log_path = workdir / f"haproxy-{self.port}.log"
        self.proc = None

    @property
    def tls(self) -> bool:
        """Always: the proxy is spoken to over TLS."""
        return True

    def command(self) -> list[str]:
        """HAProxy in the foreground (``-db``) with this configuration."""
        return [self.binary, "-db", "-f", str(self.config_path)]

    @property
    def url(self) -> str:
        """The chat server's websocket URL through the proxy."""
        return f"wss://127.0.0.1:{self.port}/ws"

    def start(self, timeout_s: float = 20) -> HaproxyProcess:
        """Start and wait until the server's /healthz answers through the proxy."""
        self._start(timeout_s)
        return self
