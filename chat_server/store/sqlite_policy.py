"""The SQLite history's decisions, apart from its threads and timers.

When a loop iteration's sends are handed over to be committed
(:func:`hand_over_wait_s`), where commits run (:func:`commit_place`), and the
defaults that the store and the chat server's settings share. Pure functions and
constants: no clock, no file, no thread, so tests drive them with plain numbers.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "COMMIT_NOW_SIZE",
    "COMMIT_PLACES",
    "DEFAULT_BATCH_MAX",
    "DEFAULT_CHECKPOINT_PAGES",
    "DEFAULT_COMMIT_INTERVAL_MS",
    "DEFAULT_QUEUE_MAX",
    "DEFAULT_SYNCHRONOUS",
    "DEFAULT_WAL_MAX_BYTES",
    "commit_place",
    "hand_over_wait_s",
]

#: a hand-over of this many sends is committed at once, whatever the commit interval.
#: Near saturation the loop's iterations are long and their lists big, and holding those
#: for the interval cost capacity at 2,000 connections; with this rule the knee moved no
#: more than the machine's spread (docs/decisions/0002-commit-interval.md)
COMMIT_NOW_SIZE: Final = 32

#: ``CHAT_DB_COMMIT_INTERVAL_MS``: the least time between two hand-overs (ms). A commit per
#: loop iteration took a quarter of the server's core under load; 2 and 4 ms saved a
#: little more CPU and cost more latency than they saved
#: (docs/decisions/0002-commit-interval.md)
DEFAULT_COMMIT_INTERVAL_MS: Final = 1
#: ``CHAT_DB_SYNCHRONOUS``: a committed batch survives ``kill -9``, without an fsync per commit
DEFAULT_SYNCHRONOUS: Final = "normal"
#: ``STORE_QUEUE_MAX``: sends waiting for their commit; past it a send gets ``unavailable``
DEFAULT_QUEUE_MAX: Final = 10000
#: ``STORE_BATCH_MAX``: the most sends in one transaction
DEFAULT_BATCH_MAX: Final = 1000
#: ``CHAT_DB_CHECKPOINT_PAGES``: WAL pages that start a PASSIVE checkpoint
DEFAULT_CHECKPOINT_PAGES: Final = 1000
#: ``CHAT_DB_WAL_MAX_BYTES``: WAL not checkpointed past which sends get ``unavailable``
DEFAULT_WAL_MAX_BYTES: Final = 256 << 20

#: ``CHAT_DB_COMMIT``'s values: ``auto`` is ``loop`` with ``normal``, ``thread`` with ``full``
COMMIT_PLACES: Final = ("auto", "loop", "thread")


def commit_place(requested: str, synchronous: str) -> str:
    """Where group commits run, ``loop`` or ``thread``, for ``CHAT_DB_COMMIT=requested``.

    ``auto`` commits on the loop with ``synchronous=normal`` (a WAL append without
    fsync costs less than the hand-off to a thread) and on the writer thread with
    ``full``. Raises ``ValueError`` for a place not in :data:`COMMIT_PLACES`, and for
    ``loop`` with ``full`` (an fsync per commit never runs on the event loop).
    """
    if requested not in COMMIT_PLACES:
        raise ValueError(f"commit_on must be 'auto', 'loop' or 'thread', not {requested!r}")
    if requested == "auto":
        return "thread" if synchronous == "full" else "loop"
    if requested == "loop" and synchronous == "full":
        raise ValueError("synchronous='full' fsyncs each commit: commit_on must be 'thread'")
    return requested


def hand_over_wait_s(
    *,
    pending: int,
    now_s: float,
    last_hand_over_s: float,
    interval_s: float,
    batch_max: int,
    closed: bool,
) -> float:
    """How long ``pending`` (at least one) sends wait before they are handed over; 0.0: now.

    Hand-overs are at least ``interval_s`` apart (the last ended at
    ``last_hand_over_s``, on the clock of ``now_s``), so one that comes sooner waits
    for the rest of the interval and takes later iterations' sends along: under load
    that makes a few large commits of many small ones; at light load sends come
    further apart than the interval and none waits. No wait when the interval is 0,
    the store is closed (it is flushing), or ``COMMIT_NOW_SIZE`` sends (``batch_max``
    if smaller) are pending; and a wait of half the interval or less is not worth a
    timer (uvloop's timers have 1 ms steps), so those go now too.
    """
    if not interval_s or closed or pending >= min(COMMIT_NOW_SIZE, batch_max):
        return 0.0
    wait_s = last_hand_over_s + interval_s - now_s
    return wait_s if wait_s > interval_s / 2 else 0.0
