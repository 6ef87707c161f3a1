"""One supervisor for a process's background work: asyncio tasks and threads alike.

Every piece of work that outlives the call that started it is started here, with a
policy stated where it is started:

- :class:`Restart`: long-lived work (a refresh loop, a lease, a probe) that must keep
  running. When it raises, it starts again after a backoff (``min_s``, doubling to
  ``max_s`` while it keeps failing within ``stable_s`` of its start).
- :class:`Stop`: work without which the process must not go on (the history store's
  writer: no ack could ever come). When it raises, the process stops with
  :data:`EXIT_TASK_FAILED` (70, ``EX_SOFTWARE`` of ``sysexits.h``), after a graceful
  stop the process bounds (see :meth:`Supervisor.on_fatal`).
- :data:`REPORT`: short-lived work (one request's reply, one room's snapshot). When
  it raises, that is logged and counted; nothing is started again.

Whatever the policy, work that returns is done (that is how its owner stops it), and
an end by an exception is logged at ERROR with its traceback
and counted in :attr:`Supervisor.failures` by the work's name, which each service's
metrics expose (``chat_task_failures_total{task}``, ``auth_task_failures_total{task}``).
Cancelling a task (or stopping a thread the way its owner always did) is no failure.

The process has one supervisor, :func:`supervisor`: the services and the shared
parts they build start their work through it without a handle passed down every
constructor; the process's entry point tells it how to stop (:meth:`Supervisor.on_fatal`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, TypeVar

log = logging.getLogger("chatlab.supervision")

T = TypeVar("T")

#: the exit status of a process stopped because work with the Stop policy ended (EX_SOFTWARE)
EXIT_TASK_FAILED: Final = 70


@dataclass(frozen=True)
class Restart:
    """Start the work again after a backoff when it raises."""

    min_s: float = 0.5
    max_s: float = 30.0
    #: work that ran this long before failing restarts after ``min_s`` again
    stable_s: float = 60.0

    def delay_s(self, failures_in_a_row: int) -> float:
        """The backoff before restart number ``failures_in_a_row`` (1 for the first)."""
        return min(self.max_s, self.min_s * 2 ** max(0, failures_in_a_row - 1))


@dataclass(frozen=True)
class Stop:
    """Stop the process with ``status`` when the work raises (returning is its owner's stop)."""

    status: int = EXIT_TASK_FAILED


@dataclass(frozen=True)
class Report:
    """Log and count an exception; never start the work again."""


REPORT: Final = Report()
RESTART: Final = Restart()
STOP: Final = Stop()

Policy = Restart | Stop | Report


class Supervisor:
    """Starts tasks and threads under a :data:`Policy` and reads how each one ends."""

    def __init__(self) -> None:
        #: ends by an exception, by the work's name (counted whatever the policy)
        self.failures: Counter[str] = Counter()
        #: restarts made, by the work's name
        self.restarts: Counter[str] = Counter()
        self._on_fatal: Callable[[int], None] | None = None
        self._fatal_status: int | None = None
        self._lock = threading.Lock()

    # ---- the process ---------------------------------------------------------------------

    def on_fatal(self, callback: Callable[[int], None] | None) -> None:
        """Call ``callback(status)`` (on the thread that failed: make it thread-safe) when
        work with the Stop policy ends; None: nobody listens, the end is only logged."""
        self._on_fatal = callback
        self._fatal_status = None

    @property
    def fatal_status(self) -> int | None:
        """The exit status asked for by the first Stop-policy end, else None."""
        return self._fatal_status

    # ---- tasks ---------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, T], name: str, detail: str = "") -> asyncio.Task[T]:
        """Run ``coro`` once as a task (:data:`REPORT`); an exception is logged and counted.

        ``name`` is the metric's label (one per kind of work, never per room or user);
        ``detail`` (a room) goes only into the task's name and the log.
        """
        task_name = f"{name} {detail}" if detail else name
        task = asyncio.get_running_loop().create_task(coro, name=task_name)
        task.add_done_callback(functools.partial(self._reported, name))
        return task

    def start(
        self, name: str, work: Callable[[], Coroutine[Any, Any, Any]], policy: Policy
    ) -> asyncio.Task[None]:
        """Run ``work()`` as a task named ``name`` under ``policy``; cancel the task to stop it."""
        return asyncio.get_running_loop().create_task(self._run(name, work, policy), name=name)

    async def _run(
        self, name: str, work: Callable[[], Coroutine[Any, Any, Any]], policy: Policy
    ) -> None:
        in_a_row = 0
        while True:
            started = time.monotonic()
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._count(name, exc)
                if isinstance(policy, Restart):
                    in_a_row = 1 if time.monotonic() - started >= policy.stable_s else in_a_row + 1
                    delay_s = policy.delay_s(in_a_row)
                    log.warning("%s: restarting in %.1f s", name, delay_s)
                    await asyncio.sleep(delay_s)
                    self.restarts[name] += 1
                    continue
                if isinstance(policy, Stop):
                    self._fatal(name, policy.status)
                return
            return

    def _reported(self, name: str, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._count(name, task.exception(), task.get_name())

    # ---- threads -------------------------------------------------------------------------

    def thread(
        self,
        target: Callable[..., Any],
        name: str,
        policy: Policy,
        *,
        args: tuple[Any, ...] = (),
        daemon: bool = False,
    ) -> threading.Thread:
        """A thread (not started: call ``start()``) running ``target(*args)`` under ``policy``.

        Restart runs ``target`` again in the same thread after the backoff; Stop asks
        the process to stop (through :meth:`on_fatal`) when it raises. Work that returns
        is done whatever the policy, tasks and threads alike: that is how its owner stops it.
        """

        def run() -> None:
            in_a_row = 0
            while True:
                started = time.monotonic()
                try:
                    target(*args)
                except Exception as exc:
                    self._count(name, exc)
                    if isinstance(policy, Restart):
                        quick = time.monotonic() - started < policy.stable_s
                        in_a_row = in_a_row + 1 if quick else 1
                        delay_s = policy.delay_s(in_a_row)
                        log.warning("%s: restarting in %.1f s", name, delay_s)
                        time.sleep(delay_s)
                        self.restarts[name] += 1
                        continue
                    if isinstance(policy, Stop):
                        self._fatal(name, policy.status)
                return

        return threading.Thread(target=run, name=name, daemon=daemon)

    # ---- ends ----------------------------------------------------------------------------

    def _count(self, name: str, exc: BaseException | None, task_name: str = "") -> None:
        with self._lock:
            self.failures[name] += 1
        log.error("%s failed", task_name or name, exc_info=exc)

    def _fatal(self, name: str, status: int) -> None:
        with self._lock:
            first = self._fatal_status is None
            if first:
                self._fatal_status = status
        if not first:
            return
        callback = self._on_fatal
        if callback is None:
            log.critical("%s ended and nothing can stop this process: it goes on without it", name)
            return
        log.critical("%s ended: stopping this process with exit status %d", name, status)
        callback(status)


_SUPERVISOR = Supervisor()


def supervisor() -> Supervisor:
    """This process's one supervisor."""
    return _SUPERVISOR
