"""``WORKERS`` > 1: one supervisor process and ``WORKERS`` server processes on one port.

Like uvicorn's ``supervisors/multiprocess.py``, the supervisor stays apart from
the server: it imports the settings and the standard library (and, with
``METRICS_PORT``, :mod:`chat_server.metrics`), never the service, the codecs or
Redis. It binds ``CHAT_HOST:CHAT_PORT`` (one socket per worker seat, below) and
starts each worker as ``python -m chat_server`` (same settings file, same working
directory) with its seat's listening socket inherited and ``CHATLAB_WORKER`` in its
environment (:class:`WorkerSeat`): the worker accepts on that socket and writes to a
pipe once it serves, so the supervisor knows it is ready. With ``CPU_AFFINITY`` set,
worker ``i`` gets ``CPU_AFFINITY=<core list[i % len]>``.

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
  still running after ``DRAIN_NOTICE_S + DRAIN_GRACE_S + CLOSE_TIMEOUT_S + 30`` s is
  killed).
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

**One SO_REUSEPORT socket per seat, steered to the ready workers.** The supervisor
binds one listening socket per worker seat, all with ``SO_REUSEPORT`` on the same
port, and worker ``i`` accepts on socket ``i`` alone. The kernel picks the socket for
each new connection by running a small classic BPF program the supervisor attaches to
the group (``SO_ATTACH_REUSEPORT_CBPF``, no privilege needed): a random pick among the
seats whose worker is ready, rewritten whenever that set changes. So:

- connections spread evenly over the ready workers however busy each one is: a burst
  of 40 lands about 20/20, 40/0 once in 2^39 (a single shared socket gave each new
  connection to whichever worker called ``accept`` first, and on a loaded machine
  one worker could take a whole burst: ``docs/decisions/0010-workers-reuseport.md``);
- a dead or starting worker gets no new connections: the supervisor learns of a death
  at once (a pidfd per worker in its selector) and steers past that seat. The few
  connections that reached the seat's queue before that (or that the worker had not
  accepted yet) wait there, not reset, since the supervisor holds every socket, and
  its replacement serves them once ready (about a second; longer while it keeps
  crashing, up to ``RESTART_MAX_S``);
- the supervisor holds every socket for its whole life: a restarted worker inherits
  its seat's socket and needs no bind, and the group's order (which the program's
  indices name) never changes;
- a port in use is one error, at start, in one process: the supervisor first binds a
  plain socket to the port, which fails if anything listens there (another
  ``SO_REUSEPORT`` group included), and binds the group's sockets right after;
- another process of the same user can join the group (``SO_REUSEPORT`` allows it)
  but gets no connections: the program only names our seats.

``CHAT_HOST`` must resolve to one address (the first one ``getaddrinfo`` gives is
bound). Connections are never moved: a restarted worker takes new connections once
it is ready, and the clients that reconnected before that stay on the survivors.
"""

from __future__ import annotations

import ctypes
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
#: ``SO_ATTACH_REUSEPORT_CBPF`` from ``<asm-generic/socket.h>`` (Python does not name it)
SO_ATTACH_REUSEPORT_CBPF: Final = 51


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
    """What a worker gets from its supervisor: its index, its seat's listening socket, a
    ready pipe, and the board of ready workers."""

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
    def decode(cls, value: str) -> WorkerSeat | None:
        """The seat ``CHATLAB_WORKER`` names (``Settings.worker_seat``), or None when this
        process is not a worker."""
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
        """This seat's listening socket (the supervisor's), as this process' object."""
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

    __slots__ = (
        "failures",
        "index",
        "pidfd",
        "proc",
        "ready",
        "ready_r",
        "restart_at",
        "started_at",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_r: int | None = None
        #: readable once the process has exited: the supervisor notices a death at once
        self.pidfd: int | None = None
        self.ready = False
        self.started_at = 0.0
        self.failures = 0
        self.restart_at: float | None = None


class Supervisor:
    """Runs ``settings.workers`` server processes, one listening socket each (see the module)."""

    def __init__(self, settings: Settings, env_file: str | None) -> None:
        self.settings = settings
        self.env_file = env_file
        self.workers = [_Worker(i) for i in range(settings.workers)]
        self._stop_signal: int | None = None
        self._selector = selectors.DefaultSelector()
        self._socks: list[socket.socket] = []
        self._metrics: WorkersMetricsServer | None = None
        self._board = ReadyBoard.create(settings.workers)

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; the exit status (see the module docstring)."""
        s = self.settings
        try:
            self._socks = _listen_group(s.host, s.port, len(self.workers))
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
                "supervisor %d: %d workers on %s:%d (one SO_REUSEPORT socket each)",
                os.getpid(),
                len(self.workers),
                s.host,
                self._socks[0].getsockname()[1],
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
            for sock in self._socks:
                sock.close()
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
        listen_fd = self._socks[worker.index].fileno()
        ready_r, ready_w = os.pipe()
        seat = WorkerSeat(worker.index, listen_fd, ready_w, os.getpid(), self._board.fd)
        env = {**os.environ, WORKER_ENV: seat.encode()}
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
        worker.pidfd = os.pidfd_open(worker.proc.pid)
        self._selector.register(worker.pidfd, selectors.EVENT_READ, worker)
        log.debug("worker %d started (pid %d)", worker.index, worker.proc.pid)

    def _poll(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a ready pipe or a worker's exit; mark the workers
        that reported ready (an exit is for :meth:`_look_after_workers`)."""
        if not self._selector.get_map():
            time.sleep(timeout_s)
            return
        for key, _ in self._selector.select(timeout_s):
            worker: _Worker = key.data
            if key.fd == worker.pidfd:
                continue
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
        """Put the count of workers that serve on the board (``/healthz`` reads it), and
        steer new connections to them."""
        ready = [w.index for w in self.workers if w.ready and w.proc is not None]
        self._board.post(len(ready), len(self.workers))
        try:
            steer(self._socks[0], ready, len(self.workers))
        except OSError as exc:  # an old kernel: the group's own hash spreads them
            log.warning("supervisor: cannot steer connections to ready workers: %s", exc)

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
                if worker.pidfd is not None:
                    self._selector.unregister(worker.pidfd)
                    os.close(worker.pidfd)
                    worker.pidfd = None
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
        log.info(
            "supervisor: %s; draining %d workers",
            signal.Signals(self._stop_signal or signal.SIGTERM).name,
            sum(w.proc is not None for w in self.workers),
        )
        # the workers hold their sockets too: each closes when its worker stops accepting
        for sock in self._socks:
            sock.close()
        running = [w for w in self.workers if w.proc is not None]
        for worker in running:
            assert worker.proc is not None
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        s = self.settings
        deadline = time.monotonic() + s.drain_notice_s + s.drain_grace_s + s.close_timeout_s + 30
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


def _listen_group(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets in one ``SO_REUSEPORT`` group on the first address
    ``host`` resolves to; OSError (the port in use, the host not bindable) if any fails.

    A plain socket is bound first, so that a port another process listens on (with or
    without ``SO_REUSEPORT``) is refused rather than joined. The group then takes the
    port it found (``port`` 0: a free one).
    """
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)
        address = probe.getsockname()
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            sock.listen(LISTEN_BACKLOG)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


# classic BPF opcodes (<linux/bpf_common.h>) and the ancillary load of a random number
_LD_W_ABS: Final = 0x20
_ALU_MOD_K: Final = 0x94
_JMP_JEQ_K: Final = 0x15
_RET_K: Final = 0x06
_RET_A: Final = 0x16
_SKF_AD_RANDOM: Final = (-0x1000 + 56) & 0xFFFFFFFF
_INSTRUCTION = struct.Struct("=HBBI")


def steering_program(ready: list[int], seats: int) -> list[tuple[int, int, int, int]]:
    """The classic BPF program that picks a socket of the group for a new connection:
    one of the ``ready`` seats at random, or any seat when none is ready (each queue
    is then served when its worker is). Instructions as ``(code, jt, jf, k)``."""
    choices = ready or list(range(seats))
    program = [(_LD_W_ABS, 0, 0, _SKF_AD_RANDOM), (_ALU_MOD_K, 0, 0, len(choices))]
    if choices == list(range(seats)):
        return [*program, (_RET_A, 0, 0, 0)]  # the random number is the index
    for i, seat in enumerate(choices):
        program += [(_JMP_JEQ_K, 0, 1, i), (_RET_K, 0, 0, seat)]
    return [*program, (_RET_K, 0, 0, choices[0])]  # not reached


def steer(sock: socket.socket, ready: list[int], seats: int) -> None:
    """Attach :func:`steering_program` to ``sock``'s ``SO_REUSEPORT`` group (it replaces
    the group's program; the kernel copies it)."""
    program = steering_program(ready, seats)
    code = ctypes.create_string_buffer(b"".join(_INSTRUCTION.pack(*i) for i in program))
    fprog = struct.pack("HP", len(program), ctypes.addressof(code))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def _describe_status(status: int) -> str:
    """``status 1`` or ``signal SIGKILL``, from a Popen return code."""
    if status < 0:
        try:
            return f"signal {signal.Signals(-status).name}"
        except ValueError:
            return f"signal {-status}"
    return f"status {status}"
