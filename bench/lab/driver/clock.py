"""Waking the scheduler at a ``perf_counter_ns`` time, to a few microseconds (a timerfd)."""

from __future__ import annotations

import asyncio
import ctypes
import os
from time import perf_counter_ns

_CLOCK_MONOTONIC = 1  # perf_counter_ns's clock on Linux
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class WakeTimer:
    """Wakes a coroutine at a ``perf_counter_ns`` time, to a few microseconds (a timerfd).

    uvloop's timers round to whole milliseconds (a 0.4 ms sleep returns at once, a
    0.6 ms one after 1.1 ms), so sleeping to each scheduled send either spins or
    sends late; a timerfd in the loop's poll wakes it when due, spinning never.
    """

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._spec = _Itimerspec()
        self._loop.add_reader(self._fd, self._fired)

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return  # re-armed before this callback ran: not expired yet
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def sleep_until(self, when_ns: int) -> None:
        """Return at ``when_ns`` (``perf_counter_ns`` clock) or just after; at once if past."""
        if when_ns <= perf_counter_ns():
            await asyncio.sleep(0)
            return
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(when_ns, 1_000_000_000)
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None):
            raise OSError(ctypes.get_errno(), "timerfd_settime")
        self._waiter = self._loop.create_future()
        await self._waiter

    def close(self) -> None:
        """Stop watching the timer and close it."""
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
