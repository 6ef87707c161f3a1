"""``WORKERS`` > 1: one supervisor process and ``WORKERS`` server processes on one port.

Like uvicorn's ``supervisors/multiprocess.py``, the supervisor stays apart from
the server: it imports the settings and the standard library (and, with
``METRICS_PORT``, :mod:`chat_server.metrics`), never the service, the codecs or
Redis. It binds ``CHAT_HOST:CHAT_PORT`` once and starts each worker as ``python
-m chat_server`` (same settings file, same working directory) with the listening
socket inherited and ``CHATLAB_WORKER`` in its environment (:class:`WorkerSeat`):
the worker accepts on that socket and writes to a pipe once it serves, so the
supervisor knows it is ready. With ``CPU_AFFINITY`` set, worker ``i`` gets
``CPU_AFFINITY=<core list[i % len]>``.

Guarantees:

- Worker 0 starts alone first; if it exits before it is ready (a bad key, Redis
  unreachable: it printed the one line saying why), the supervisor exits with
  its status (2 for a setting) before starting any other.
- A worker that dies afterwards, for any reason, is started again after a
  backoff (0.5 s, doubling to 10 s while it keeps dying within 10 s of its
  start), each time logged with its exit status.
- SIGTERM or SIGINT is forwarded as SIGTERM to every worker, which drains as one
  server does (stop accepting, commit, deliver, close with 1001); the supervisor
  exits 0 when every worker exited 0 (or was still starting), else 1 (a worker
  still running after ``DRAIN_GRACE_S + CLOSE_TIMEOUT_S + 30`` s is killed).
- A worker whose supervisor disappears (``kill -9``) stops itself gracefully
  within about a second (:func:`chat_server.runtime.watch_parent`).
- SIGUSR1 (a profile snapshot, ``PROFILE=cprofile``) is forwarded to every worker
  that reported ready.
- ``/healthz`` answers 200 only while every worker serves: the supervisor keeps the
  count of ready workers on a small shared board (:class:`ReadyBoard`, a memfd every
  worker maps), and a worker answers 503 "k of N workers ready" otherwise, so a load
  balancer or a test that waits for 200 waits for all of them.
- With ``METRICS_PORT`` set, the supervisor serves it (the workers do not): the sum
  of every worker's metrics, published through a private directory it creates at
  start and removes at exit (:class:`chat_server.metrics.WorkersMetricsServer`); a
  port it cannot bind stops it at start, exit 1. A worker that exits leaves the
  gauges at once; its counters stay in the sums.

**One inherited socket rather than SO_REUSEPORT.** With ``SO_REUSEPORT`` each
worker binds its own socket and the kernel spreads connections over them by a
hash. We bind once and share the socket instead, because:

- the socket outlives every worker: connections that arrive while a worker is
  dead or restarting wait in the one accept queue for the workers that are up,
  whereas the kernel resets the connections queued on a ``SO_REUSEPORT`` socket
  whose process died, and until it closes keeps hashing new ones to it;
- a port in use (or a host that cannot be bound) is one error, at start, in one
  process, not a race between workers;
- no other process of the same user can join the port's group and take a share
  of the connections, which ``SO_REUSEPORT`` allows;
- a restarted worker needs no bind.

The cost: every idle worker is woken for a new connection and the first to call
``accept`` gets it, so connections go to whichever worker is free rather than
being spread evenly by hash; on a loaded machine that favours the less busy
worker, which is the balance wanted. ``CHAT_HOST`` must resolve to one address
(the first one ``getaddrinfo`` gives is bound).

**How connections spread.** An event loop woken for the listening socket accepts
every connection waiting in the queue before it yields (uvloop: libuv accepts until
the queue is empty; asyncio: up to 100 per wakeup), so a burst that queues while one
worker is busy can land on the other one alone. Workers run with
``UV_TCP_SINGLE_ACCEPT=1`` (libuv's own switch for processes sharing a socket: a
uvloop worker accepts one connection, then yields for a moment so the others take
their turn; asyncio loops and picows' own accept loop do not read it). Measured here,
40 connections opened at once from one test process spread over both workers with
and without it (13/27 and 30/10 with, 21/19 and 17/23 without): its effect on the
reported case (200 of 200 on one worker) is not shown. A restarted worker accepts as
soon as it is ready; the clients that reconnected before that are on the survivors,
and stay there: connections are not moved.
"""

from __future__ import annotations

import logging
import mmap
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Final

from chat_server.settings import Settings

if TYPE_CHECKING:
    from chat_server.metrics import WorkersMetricsServer

log = logging.getLogger("chat_server.supervisor")

#: the environment variable that makes ``python -m chat_server`` a worker
WORKER_ENV: Final = "CHATLAB_WORKER"
RESTART_MIN_S: Final = 0.5
RESTART_MAX_S: Final = 10.0
#: a worker that lived this long restarts after the shortest backoff again
STABLE_S: Final = 10.0
#: how often the supervisor looks at its workers when nothing else wakes it
POLL_S: Final = 0.2
LISTEN_BACKLOG: Final = 1024


#: the board's layout: workers ready, workers wanted (two unsigned 32-bit integers)
_BOARD = struct.Struct("=II")


class ReadyBoard:
    """How many workers serve, of how many: written by the supervisor, read by every worker.

    A memfd of 8 bytes the workers inherit and map read-only; reading it is a memory
    read (no system call), cheap enough for every ``/healthz``.
    """

    def __init__(self, fd: int, writable: bool) -> None:
        self.fd = fd
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self._map = mmap.mmap(fd, _BOARD.size, access=access)

    @classmethod
    def create(cls, workers: int) -> ReadyBoard:
        """A new board (the supervisor's): no worker ready yet."""
        fd = os.memfd_create("chatlab-ready", 0)
        os.ftruncate(fd, _BOARD.size)
        board = cls(fd, writable=True)
        board.post(0, workers)
        return board

    def post(self, ready: int, workers: int) -> None:
        """Say that ``ready`` of ``workers`` serve."""
        _BOARD.pack_into(self._map, 0, ready, workers)

    def unready(self) -> str | None:
        """None when every worker serves, else what ``/healthz`` says instead of ok."""
        ready, workers = _BOARD.unpack_from(self._map, 0)
        return None if ready >= workers else f"{ready} of {workers} workers ready"


@dataclass(frozen=True)
class WorkerSeat:
    """What a worker gets from its supervisor: its index, the listening socket, a ready
    pipe, and the board of ready workers."""

    index: int
    listen_fd: int
    ready_fd: int
    supervisor_pid: int
    board_fd: int

    def encode(self) -> str:
        """The value of ``CHATLAB_WORKER`` for this seat."""
        return (
            f"{self.index}:{self.listen_fd}:{self.ready_fd}:{self.supervisor_pid}:{self.board_fd}"
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WorkerSeat | None:
        """The seat in ``CHATLAB_WORKER``, or None when this process is not a worker."""
        value = environ.get(WORKER_ENV)
        if not value:
            return None
        index, listen_fd, ready_fd, supervisor_pid, board_fd = (
            int(part) for part in value.split(":")
        )
        return cls(index, listen_fd, ready_fd, supervisor_pid, board_fd)

    def ready_board(self) -> ReadyBoard:
        """The supervisor's board of ready workers, read-only."""
        return ReadyBoard(self.board_fd, writable=False)

    def listening_socket(self) -> socket.socket:
        """The supervisor's listening socket, as this process' object."""
        return socket.socket(fileno=self.listen_fd)

    def report_ready(self) -> None:
        """Tell the supervisor this worker serves (once)."""
        try:
            os.write(self.ready_fd, b"r")
            os.close(self.ready_fd)
        except OSError as exc:
            log.warning("could not tell the supervisor this worker is ready: %s", exc)


class _Worker:
    """One seat: the process in it (if any), its ready pipe and its restart backoff."""

    __slots__ = ("failures", "index", "proc", "ready", "ready_r", "restart_at", "started_at")

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_r: int | None = None
        self.ready = False
        self.started_at = 0.0
        self.failures = 0
        self.restart_at: float | None = None


class Supervisor:
    """Runs ``settings.workers`` server processes on one inherited socket (see the module)."""

    def __init__(self, settings: Settings, env_file: str | None) -> None:
        self.settings = settings
        self.env_file = env_file
        self.workers = [_Worker(i) for i in range(settings.workers)]
        self._stop_signal: int | None = None
        self._selector = selectors.DefaultSelector()
        self._sock: socket.socket | None = None
        self._metrics: WorkersMetricsServer | None = None
        self._board = ReadyBoard.create(settings.workers)

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; the exit status (see the module docstring)."""
        s = self.settings
        try:
            self._sock = _listen(s.host, s.port)
        except OSError as exc:
            print(
                f"chat_server: cannot listen on {s.host}:{s.port}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 1
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGUSR1, self._forward_signal)
        try:
            if s.metrics_port and not self._start_metrics():
                return 1
            status = self._start_first()
            if status is not None:
                return status
            log.info(
                "supervisor %d: %d workers on %s:%d (one shared listening socket)",
                os.getpid(),
                len(self.workers),
                s.host,
                self._sock.getsockname()[1],
            )
            for worker in self.workers[1:]:
                self._spawn(worker)
            while self._stop_signal is None:
                self._poll(POLL_S)
                self._look_after_workers()
            return self._stop()
        finally:
            for worker in self.workers:
                if worker.proc is not None and worker.proc.poll() is None:
                    worker.proc.kill()
                    worker.proc.wait()
            self._sock.close()
            if self._metrics is not None:
                self._metrics.close()

    def _start_metrics(self) -> bool:
        """Serve ``METRICS_PORT`` for all workers; False (said why) if it cannot be bound."""
        from chat_server.metrics import WorkersMetricsServer  # noqa: PLC0415

        s = self.settings
        self._metrics = WorkersMetricsServer(s.host, s.metrics_port)
        try:
            self._metrics.start()
        except OSError as exc:
            print(
                f"chat_server: cannot listen on {s.host}:{s.metrics_port} (METRICS_PORT): "
                f"{exc.strerror or exc}",
                file=sys.stderr,
            )
            return False
        log.info(
            "supervisor: metrics of all workers on %s:%d/metrics (files in %s)",
            s.host,
            s.metrics_port,
            self._metrics.directory,
        )
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_signal is None:
            self._stop_signal = signum

    def _forward_signal(self, signum: int, frame: FrameType | None) -> None:
        """Pass ``signum`` on to the workers that are ready (a starting one may not handle it)."""
        for worker in self.workers:
            if worker.ready and worker.proc is not None:
                worker.proc.send_signal(signum)  # nothing if it has exited

    def _start_first(self) -> int | None:
        """Start worker 0 and wait until it is ready; its exit status if it died first."""
        first = self.workers[0]
        self._spawn(first)
        assert first.proc is not None
        while not first.ready:
            if self._stop_signal is not None:
                return self._stop()
            status = first.proc.poll()
            if status is not None:
                self._close_ready_pipe(first)
                return 2 if status == 2 else 1
            self._poll(POLL_S)
        return None

    def _spawn(self, worker: _Worker) -> None:
        """Start a worker process in ``worker``'s seat."""
        assert self._sock is not None
        ready_r, ready_w = os.pipe()
        seat = WorkerSeat(worker.index, self._sock.fileno(), ready_w, os.getpid(), self._board.fd)
        # libuv accepts one connection per wakeup and yields: a burst spreads over workers
        env = {**os.environ, WORKER_ENV: seat.encode(), "UV_TCP_SINGLE_ACCEPT": "1"}
        cores = self.settings.cpu_affinity
        if cores is not None:
            env["CPU_AFFINITY"] = str(cores[worker.index % len(cores)])
        if self._metrics is not None:
            env.update(self._metrics.worker_environ())
        command = [sys.executable, "-m", "chat_server"]
        if self.env_file is not None:
            command += ["--env-file", self.env_file]
        try:
            worker.proc = subprocess.Popen(
                command, env=env, pass_fds=(seat.listen_fd, ready_w, self._board.fd)
            )
        finally:
            os.close(ready_w)
        worker.ready_r = ready_r
        worker.ready = False
        worker.started_at = time.monotonic()
        worker.restart_at = None
        self._selector.register(ready_r, selectors.EVENT_READ, worker)
        log.debug("worker %d started (pid %d)", worker.index, worker.proc.pid)

    def _poll(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a ready pipe; mark the workers that reported ready."""
        if not self._selector.get_map():
            time.sleep(timeout_s)
            return
        for key, _ in self._selector.select(timeout_s):
            worker: _Worker = key.data
            try:
                data = os.read(key.fd, 1)
            except OSError:
                data = b""
            if data == b"r":
                worker.ready = True
                assert worker.proc is not None
                log.info("worker %d ready (pid %d)", worker.index, worker.proc.pid)
                self._post_ready()
            self._close_ready_pipe(worker)

    def _post_ready(self) -> None:
        """Put the count of workers that serve on the board (``/healthz`` reads it)."""
        ready = sum(w.ready and w.proc is not None for w in self.workers)
        self._board.post(ready, len(self.workers))

    def _close_ready_pipe(self, worker: _Worker) -> None:
        if worker.ready_r is not None:
            self._selector.unregister(worker.ready_r)
            os.close(worker.ready_r)
            worker.ready_r = None

    def _look_after_workers(self) -> None:
        """Notice workers that died and start them again once their backoff has passed."""
        now = time.monotonic()
        for worker in self.workers:
            proc = worker.proc
            if proc is not None:
                status = proc.poll()
                if status is None:
                    continue
                self._close_ready_pipe(worker)
                self._exited(proc.pid)
                worker.proc = None
                worker.ready = False
                self._post_ready()
                lived_s = now - worker.started_at
                worker.failures = 1 if lived_s >= STABLE_S else worker.failures + 1
                delay = min(RESTART_MAX_S, RESTART_MIN_S * 2 ** (worker.failures - 1))
                worker.restart_at = now + delay
                log.warning(
                    "worker %d (pid %d) exited with %s after %.1f s; restarting in %.1f s",
                    worker.index,
                    proc.pid,
                    _describe_status(status),
                    lived_s,
                    delay,
                )
            elif worker.restart_at is not None and now >= worker.restart_at:
                self._spawn(worker)

    def _exited(self, pid: int) -> None:
        """A worker process ended: its live gauges leave the metrics."""
        if self._metrics is not None:
            self._metrics.process_exited(pid)

    def _stop(self) -> int:
        """Forward SIGTERM to every worker, wait for them; 0 if all exited 0."""
        assert self._sock is not None
        log.info(
            "supervisor: %s; draining %d workers",
            signal.Signals(self._stop_signal or signal.SIGTERM).name,
            sum(w.proc is not None for w in self.workers),
        )
        # the workers hold the socket too: it closes when the last one stops accepting
        self._sock.close()
        running = [w for w in self.workers if w.proc is not None]
        for worker in running:
            assert worker.proc is not None
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        s = self.settings
        deadline = time.monotonic() + s.drain_grace_s + s.close_timeout_s + 30
        ok = True
        for worker in running:
            assert worker.proc is not None
            try:
                status = worker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %d did not stop in time; killing it", worker.index)
                worker.proc.kill()
                status = worker.proc.wait()
            self._exited(worker.proc.pid)
            if status == -signal.SIGTERM and not worker.ready:
                # stopped while starting, before it handled signals: it never served
                log.info("worker %d stopped while starting", worker.index)
            elif status != 0:
                log.error("worker %d exited with %s", worker.index, _describe_status(status))
                ok = False
        log.info("supervisor: all workers stopped")
        return 0 if ok else 1


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on the first address ``host`` resolves to."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _describe_status(status: int) -> str:
    """``status 1`` or ``signal SIGKILL``, from a Popen return code."""
    if status < 0:
        try:
            return f"signal {signal.Signals(-status).name}"
        except ValueError:
            return f"signal {-status}"
    return f"status {status}"
