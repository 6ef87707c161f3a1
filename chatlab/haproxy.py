"""Debian's haproxy as a front door for the tests and the lab: the configuration
:mod:`chatlab.front_door` renders, run as the current user in the foreground.

:class:`HAProxyProcess` listens on 127.0.0.1 on a free port with TLS (a certificate and
key given as two PEM files, joined into the one HAProxy reads), logs to its standard
output, which goes to a file with everything else it prints, and answers its runtime
API on a Unix socket in its working directory (:meth:`HAProxyProcess.server_states`).
"""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

from chatlab.front_door import FrontDoor, render
from chatlab.harness import ServiceProcess, free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


class HAProxyProcess(ServiceProcess):
    """``haproxy -db -f haproxy.cfg`` in ``workdir`` on a free port, in front of
    ``chat_servers`` and ``auth_servers`` (``host:port`` each).

    ``cert_file``/``key_file`` are its certificate, ``ca_file`` what clients verify it
    with; ``options`` are any other :class:`~chatlab.front_door.FrontDoor` fields.
    """

    def __init__(
        self,
        workdir: Path,
        chat_servers: list[str],
        auth_servers: list[str],
        *,
        cert_file: Path,
        key_file: Path,
        ca_file: Path,
        **options: Any,
    ) -> None:
        self.workdir = workdir
        self.ca_file = str(ca_file)
        self.port = free_port()
        self.env = dict(os.environ)
        self.log_path = workdir / "haproxy.log"
        self.config_path = workdir / "haproxy.cfg"
        self.stats_socket = workdir / "haproxy.sock"
        site = workdir / "site.pem"
        site.write_bytes(cert_file.read_bytes() + key_file.read_bytes())
        site.chmod(0o600)
        self.front = FrontDoor(
            chat_servers=tuple(chat_servers),
            auth_servers=tuple(auth_servers),
            cert_file=str(site),
            bind=f"127.0.0.1:{self.port}",
            log_target="stdout",
            drop_privileges=False,
            stats_socket=str(self.stats_socket),
            # within an unprivileged open-files limit (HAProxy needs two per connection)
            max_connections=2000,
        )
        self.front = replace(self.front, **options)

    @property
    def tls(self) -> bool:
        """Always: the front door terminates TLS."""
        return True

    @property
    def url(self) -> str:
        """The chat's websocket URL through the front door."""
        return f"wss://127.0.0.1:{self.port}/ws"

    def command(self) -> list[str]:
        """haproxy in the foreground (``-db``) on the rendered configuration."""
        return [HAPROXY, "-db", "-f", str(self.config_path)]

    def start(self, timeout_s: float = 20) -> HAProxyProcess:
        """Write the configuration, start, and wait until its ``/healthz`` answers 200
        (a server of each backend is up)."""
        self.config_path.write_text(render(self.front))
        self._start(timeout_s)
        return self

    def server_states(self) -> dict[str, str]:
        """Each server's state as the proxy sees it (``"chat/chat1": "UP"``, ``"DOWN"``...),
        from ``show stat`` on the runtime API."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats_socket))
            sock.sendall(b"show stat\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        rows = b"".join(chunks).decode().splitlines()
        header = rows[0].lstrip("# ").split(",")
        name, server, status = (header.index(f) for f in ("pxname", "svname", "status"))
        states = {}
        for row in rows[1:]:
            fields = row.split(",")
            if len(fields) > status and fields[server] not in ("FRONTEND", "BACKEND"):
                states[f"{fields[name]}/{fields[server]}"] = fields[status]
        return states
