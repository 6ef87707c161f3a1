"""A private PostgreSQL from Debian's packages, for the tests and the lab: ``initdb``, ``pg_ctl``.

:class:`PostgresProcess` makes a cluster in a fresh directory under the system's
temporary directory, listening on 127.0.0.1 on a free port, its Unix socket inside
that directory, and a superuser with a password (so URLs carry one, as in production).
``initdb`` refuses to run as root: as root (CI), the directory is given to the
``postgres`` user that Debian's package creates and every command runs as that user
through ``runuser``; otherwise they run as ourselves. The directory is not pytest's
``tmp_path``, whose parents are mode 0700 and closed to that user.

The cluster trades durability for speed (``fsync=off``): it is for tests, and a test
that stops it does so with a fast shutdown, which writes everything out.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import psycopg

from chatlab.harness import free_port

#: where Debian's packages put the server's programs (one directory per major version)
PG_ROOT = Path("/usr/lib/postgresql")
SUPERUSER = "chatlab"


def pg_bin() -> Path | None:
    """The newest installed ``/usr/lib/postgresql/<version>/bin`` with initdb, or None."""
    found = [path / "bin" for path in PG_ROOT.glob("*") if (path / "bin" / "initdb").exists()]
    return max(found, key=lambda path: int(path.parent.name)) if found else None


class PostgresProcess:
    """One PostgreSQL cluster on 127.0.0.1:``port``; :meth:`start`, :meth:`stop`, :meth:`remove`."""

    def __init__(self, port: int | None = None) -> None:
        binaries = pg_bin()
        if binaries is None:
            raise RuntimeError(
                f"no PostgreSQL under {PG_ROOT}: install Debian's postgresql package "
                "(scripts/setup.sh does)"
            )
        self.bin = binaries
        self.port = port or free_port()
        self.password = secrets.token_urlsafe(12)
        self.as_postgres = os.geteuid() == 0
        self.dir = Path(tempfile.mkdtemp(prefix="chatlab-pg-"))
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        if self.as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.as_postgres:
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        pwfile.unlink()

    def url(self, database: str = "postgres") -> str:
        """A ``postgresql://`` URL of ``database`` over TCP, with the superuser's password."""
        password = quote(self.password, safe="")
        return f"postgresql://{SUPERUSER}:{password}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresProcess:
        """Start the server and wait until it accepts connections."""
        options = " ".join(
            (
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.dir}",
                "-c fsync=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
                "-c shared_buffers=32MB",
            )
        )
        self._run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            "60",
            "-D",
            str(self.data),
            "-l",
            str(self.log_path),
            "-o",
            options,
        )
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: clients are disconnected; ``immediate``: as a crash)."""
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-D", str(self.data), "-m", mode, check=False)

    def create_database(self, name: str) -> str:
        """Create an empty database; its URL."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log(self) -> str:
        """The server's log."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def remove(self) -> None:
        """Stop the server and delete its directory."""
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self, program: str, *args: str, check: bool = True) -> None:
        command = [str(self.bin / program), *args]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, check=False, cwd=self.dir
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{program} failed ({done.returncode}):\n{done.stdout}{done.stderr}\n{self.log()}"
            )
