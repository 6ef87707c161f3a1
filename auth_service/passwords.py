"""Argon2id hashing and verifying in a process pool, with bounded admission.

:class:`PasswordPool` runs argon2-cffi's :class:`~argon2.PasswordHasher` (with the
settings' parameters) in a :class:`~concurrent.futures.ProcessPoolExecutor` of
``HASH_POOL_SIZE`` worker processes, never on the event loop. At most
``HASH_QUEUE_MAX`` jobs are waiting or running at once; a job past that is refused
at once with :class:`~auth_service.errors.Unavailable` (503 + ``Retry-After``)
instead of queueing, so a login flood costs the service a bounded amount of memory
and latency. The count is released when the worker is done with the job, not when
the request that asked for it gives up.

Verifying a login for an unknown username runs against a dummy hash made at start
with the same parameters, so it costs the same time as a wrong password.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import secrets
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import argon2
from argon2.exceptions import InvalidHashError, VerificationError

from auth_service.errors import Unavailable

log = logging.getLogger("auth_service.passwords")

#: seconds a client refused for saturation is told to wait
SATURATED_RETRY_AFTER_S = 1
#: how often a worker checks that the service that started it is still there
WORKER_PARENT_CHECK_S = 1.0


@dataclass(frozen=True)
class Argon2Params:
    """argon2id cost parameters (memory in KiB)."""

    time_cost: int
    memory_cost_kib: int
    parallelism: int

    @classmethod
    def from_settings(cls, settings: Any) -> Argon2Params:
        """The ``ARGON2_*`` settings of the auth service."""
        return cls(
            settings.argon2_time_cost, settings.argon2_memory_cost_kib, settings.argon2_parallelism
        )

    def hasher(self) -> argon2.PasswordHasher:
        """A PasswordHasher with these parameters (argon2-cffi's defaults for the rest)."""
        return argon2.PasswordHasher(
            time_cost=self.time_cost,
            memory_cost=self.memory_cost_kib,
            parallelism=self.parallelism,
        )


@dataclass(frozen=True)
class Verdict:
    """The outcome of a verification: does it match, and should the hash be redone."""

    ok: bool
    needs_rehash: bool


# ---- in the worker processes ---------------------------------------------------------

_hasher: argon2.PasswordHasher | None = None


def _init_worker(params: Argon2Params, service_pid: int) -> None:
    global _hasher
    # Ctrl-C reaches the whole process group: the parent decides when the pool stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(service_pid,), daemon=True).start()
    _hasher = params.hasher()


def _exit_with(service_pid: int) -> None:
    """End this worker once the service is gone (killed with SIGKILL, it cannot say so)."""
    while os.getppid() == service_pid:
        time.sleep(WORKER_PARENT_CHECK_S)
    os._exit(0)


def _hash(password: str) -> str:
    assert _hasher is not None
    return _hasher.hash(password)


def _verify(password_hash: str, password: str) -> tuple[bool, bool]:
    assert _hasher is not None
    return verify_with(_hasher, password_hash, password)


def verify_with(
    hasher: argon2.PasswordHasher, password_hash: str, password: str
) -> tuple[bool, bool]:
    """(matches, needs rehash) for ``password`` against ``password_hash``; never raises."""
    try:
        hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False, False
    return True, hasher.check_needs_rehash(password_hash)


# ---- on the event loop ---------------------------------------------------------------


class PasswordPool:
    """Hash and verify passwords in worker processes; start it with :meth:`start`."""

    def __init__(self, params: Argon2Params, pool_size: int, queue_max: int) -> None:
        self.params = params
        self.pool_size = pool_size
        self.queue_max = queue_max
        self._in_flight = 0
        self._executor = self._new_executor()
        self._dummy_hash = ""

    @property
    def in_flight(self) -> int:
        """Jobs admitted and not finished by their worker (waiting or running)."""
        return self._in_flight

    async def start(self) -> None:
        """Start every worker and make the dummy hash (outside admission)."""
        loop = asyncio.get_running_loop()
        # one job per worker: the executor starts a worker per job while it has fewer
        jobs = [
            loop.run_in_executor(self._executor, _hash, secrets.token_urlsafe(16))
            for _ in range(self.pool_size)
        ]
        hashes = await asyncio.gather(*jobs)
        self._dummy_hash = hashes[0]

    async def hash(self, password: str) -> str:
        """The argon2id hash of ``password``; :class:`Unavailable` when the pool is full."""
        result: str = await self._run(_hash, password)
        return result

    async def verify(self, password_hash: str | None, password: str) -> Verdict:
        """Check ``password`` against ``password_hash`` (None: the dummy hash, never ok)."""
        if password_hash is None:
            await self._run(_verify, self._dummy_hash, password)
            return Verdict(ok=False, needs_rehash=False)
        ok, needs_rehash = await self._run(_verify, password_hash, password)
        return Verdict(ok, needs_rehash)

    async def close(self) -> None:
        """Stop the workers: queued jobs are cancelled, running ones finish first."""
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)

    async def _run(self, fn: Any, *args: str) -> Any:
        if self._in_flight >= self.queue_max:
            raise Unavailable(
                f"password hashing is saturated ({self.queue_max} jobs in flight)",
                SATURATED_RETRY_AFTER_S,
            )
        loop = asyncio.get_running_loop()
        executor = self._executor
        try:
            job: Future[Any] = executor.submit(fn, *args)
        except BrokenProcessPool:
            self._replace_broken(executor)
            raise Unavailable("password hashing restarted", SATURATED_RETRY_AFTER_S) from None
        self._in_flight += 1
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release))
        try:
            return await asyncio.wrap_future(job)
        except BrokenProcessPool:
            self._replace_broken(executor)
            raise Unavailable("password hashing restarted", SATURATED_RETRY_AFTER_S) from None

    def _release(self) -> None:
        self._in_flight -= 1

    def _replace_broken(self, executor: ProcessPoolExecutor) -> None:
        if executor is self._executor:  # replaced once, however many jobs saw it broken
            log.error("a password hashing worker died; starting a new pool")
            executor.shutdown(wait=False, cancel_futures=True)
            self._executor = self._new_executor()

    def _new_executor(self) -> ProcessPoolExecutor:
        # spawn: the workers do not inherit the event loop, its threads or the sockets
        return ProcessPoolExecutor(
            max_workers=self.pool_size,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self.params, os.getpid()),
        )


class InlinePasswords:
    """REGRESSION=auth_inline only: argon2 on the calling thread, which is the event loop.

    The same interface as :class:`PasswordPool`, and the mistake the pool exists to
    avoid: every hash or verification stops every other coroutine of the process
    (chat traffic included) for its whole duration. No admission bound either.
    """

    def __init__(self, params: Argon2Params) -> None:
        self.params = params
        self._hasher = params.hasher()
        self._dummy_hash = ""

    @property
    def in_flight(self) -> int:
        """Nothing is ever in flight: each job runs to completion when called."""
        return 0

    async def start(self) -> None:
        """Make the dummy hash."""
        self._dummy_hash = self._hasher.hash(secrets.token_urlsafe(16))

    async def hash(self, password: str) -> str:
        """The argon2id hash of ``password``, computed on the event loop."""
        return self._hasher.hash(password)

    async def verify(self, password_hash: str | None, password: str) -> Verdict:
        """Check ``password`` on the event loop (None: the dummy hash, never ok)."""
        if password_hash is None:
            verify_with(self._hasher, self._dummy_hash, password)
            return Verdict(ok=False, needs_rehash=False)
        return Verdict(*verify_with(self._hasher, password_hash, password))

    async def close(self) -> None:
        """Nothing to stop."""
