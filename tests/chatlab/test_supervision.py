"""chatlab.supervision: each policy on real tasks and threads; their ends logged and counted."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from chatlab.supervision import EXIT_TASK_FAILED, Restart, Stop, Supervisor

QUICK = Restart(min_s=0.01, max_s=0.05)


class Flaky:
    """Work that raises its first ``failures`` runs, then runs until told to stop."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.runs = 0
        self.running = threading.Event()
        self.stop = threading.Event()

    async def run_async(self) -> None:
        self.runs += 1
        if self.runs <= self.failures:
            raise RuntimeError(f"run {self.runs} fails")
        self.running.set()
        while not self.stop.is_set():
            await asyncio.sleep(0.01)

    def run_thread(self) -> None:
        self.runs += 1
        if self.runs <= self.failures:
            raise RuntimeError(f"run {self.runs} fails")
        self.running.set()
        self.stop.wait(10)


async def test_a_task_that_raised_is_restarted_logged_and_counted(caplog: pytest.LogCaptureFixture):
    supervisor, work = Supervisor(), Flaky(failures=2)
    with caplog.at_level(logging.ERROR, "chatlab.supervision"):
        task = supervisor.start("refresh", work.run_async, QUICK)
        await asyncio.wait_for(asyncio.to_thread(work.running.wait, 10), 15)
    assert work.runs == 3
    assert supervisor.failures["refresh"] == 2
    assert supervisor.restarts["refresh"] == 2
    assert [r.exc_info[1].args[0] for r in caplog.records if r.exc_info] == [
        "run 1 fails",
        "run 2 fails",
    ]
    task.cancel()  # cancelling is the owner's stop: no failure
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert supervisor.failures["refresh"] == 2


async def test_a_task_with_the_stop_policy_asks_the_process_to_stop():
    supervisor, statuses = Supervisor(), []
    supervisor.on_fatal(statuses.append)
    task = supervisor.start("writer", Flaky(failures=1).run_async, Stop())
    await asyncio.wait_for(task, 10)
    assert statuses == [EXIT_TASK_FAILED]
    assert supervisor.fatal_status == EXIT_TASK_FAILED
    assert supervisor.failures["writer"] == 1


async def test_work_that_returns_is_done_whatever_the_policy():
    supervisor, statuses = Supervisor(), []
    supervisor.on_fatal(statuses.append)

    async def done() -> None:
        return None

    for policy in (QUICK, Stop()):
        await asyncio.wait_for(supervisor.start("loop", done, policy), 10)
    assert statuses == []
    assert not supervisor.failures


async def test_a_request_task_that_raised_is_counted_once_and_not_restarted():
    supervisor, work = Supervisor(), Flaky(failures=1)
    task = supervisor.spawn(work.run_async(), "chat-history", "lobby")
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(task, 10)
    assert task.get_name() == "chat-history lobby"
    assert supervisor.failures == {"chat-history": 1}  # the label names the kind, not the room
    assert work.runs == 1


def test_a_thread_that_raised_is_restarted_in_place():
    supervisor, work = Supervisor(), Flaky(failures=2)
    thread = supervisor.thread(work.run_thread, "checkpointer", QUICK)
    thread.start()
    assert work.running.wait(15)
    assert thread.name == "checkpointer"
    assert work.runs == 3
    assert supervisor.failures["checkpointer"] == 2
    work.stop.set()
    thread.join(10)
    assert not thread.is_alive()


def test_a_thread_with_the_stop_policy_asks_the_process_to_stop():
    supervisor, statuses = Supervisor(), []
    supervisor.on_fatal(statuses.append)
    thread = supervisor.thread(Flaky(failures=1).run_thread, "writer", Stop(status=3))
    thread.start()
    thread.join(10)
    assert statuses == [3]
