"""The history-store interface: durable, ordered, per-room message history.

The store assigns each room's ``seq`` when it commits, so a batch that fails
consumes none and a shared store can number messages for many processes. Writes
are submitted without waiting; the store reports each committed (or failed)
batch back on the event loop to the callback given to :meth:`HistoryStore.report_to`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from chat_server.errors import StoreError
from chat_server.messages import Message

logger = logging.getLogger("chat_server.store")


class BatchResult(NamedTuple):
    """One group commit's outcome, delivered on the event loop.

    ``items`` are the submitted ``(message, context)`` pairs in submission order.
    On success ``error`` is None and every message has its ``seq`` set; on failure
    ``error`` says why and no message got a ``seq`` (it stays 0).
    """

    items: list[tuple[Message, Any]]
    error: StoreError | None


BatchCallback = Callable[[BatchResult], None]


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A snapshot of the writer's work since start.

    ``batch_sizes`` maps a power of two ``k`` to the number of batches whose size
    was in ``[k, 2k)``; ``queue_depth`` counts submissions not yet taken into a batch.
    ``wal_file_bytes`` (the WAL file's size at the checkpointer's last look),
    ``wal_restarts`` (the checkpointer's restarts of the WAL) and the histogram of the
    commits' holds for them (``restart_hold_counts`` per bucket of ``COMMIT_BUCKETS_S``,
    the last above every bound, and ``restart_hold_sum_s``) are the SQLite store's,
    None for a store without a WAL. ``primaries_short_of_replicas`` (Redis only, else
    None) counts the primaries whose last commit was confirmed on fewer replicas than
    ``REDIS_ACK_REPLICAS`` asks: their rooms' sends get ``unavailable`` until they have them;
    ``primaries_unreachable`` (Redis only) the primaries this process takes for unreachable
    (their rooms' sends are refused until a probe finds them back), and ``node_busy_refusals``
    (Redis only) the requests refused because their node had every turn in flight for the
    whole ``REDIS_POOL_WAIT_S``.
    """

    batches_committed: int
    messages_committed: int
    batches_failed: int
    messages_failed: int
    max_batch_size: int
    last_batch_size: int
    queue_depth: int
    batch_sizes: dict[int, int]
    wal_file_bytes: int | None = None
    wal_restarts: int | None = None
    restart_hold_counts: list[int] | None = None
    restart_hold_sum_s: float | None = None
    primaries_short_of_replicas: int | None = None
    primaries_unreachable: int | None = None
    node_busy_refusals: int | None = None
    #: sends refused at ``submit`` (answered ``unavailable``, never stored), by reason
    #: (:data:`REFUSAL_REASONS`)
    refused: dict[str, int] = field(default_factory=dict)


#: why a store refuses a send at ``submit`` (``chat_store_refused_total``'s reasons):
#: ``queue_full`` (``STORE_QUEUE_MAX`` sends wait for their commit), ``wal_full`` (SQLite:
#: the WAL is past ``CHAT_DB_WAL_MAX_BYTES`` behind a blocked checkpoint), Redis: the
#: room's primary ``node_unreachable`` or ``node_short_of_replicas``, or ``no_node`` serves
#: its slot, and ``closed`` (the store is not started or is stopping)
REFUSAL_REASONS: Final = (
    "queue_full",
    "wal_full",
    "node_unreachable",
    "node_short_of_replicas",
    "no_node",
    "closed",
)


class BatchLedger:
    """A store's bookkeeping on the event loop: tickets, batch reports, flushes, counts.

    Every submission takes a ticket from :meth:`submitted` (0, 1, 2, ... in submission
    order); every batch outcome goes through :meth:`report` with its items' tickets, in
    any order (a store with several writers, one per Redis node, reports each node's
    batches as they settle), which calls ``on_batch`` (logging, never raising, if it
    fails) and then wakes the :meth:`flush` calls whose submissions are all reported.

    The table it keeps: ``low``, the lowest ticket not reported yet, and the reported
    tickets above it. "Everything submitted before mark ``m`` is reported" is ``low >=
    m``, whatever order the reports came in.
    """

    def __init__(self, on_batch: BatchCallback | None = None) -> None:
        #: where batch outcomes go: the store's owner, set with :meth:`HistoryStore.report_to`
        self.on_batch: BatchCallback = on_batch or _unreported
        #: the next ticket to give out
        self._next = 0
        #: the lowest ticket not reported yet (every one below it is)
        self._low = 0
        #: tickets above ``_low`` reported already (out of order)
        self._early: set[int] = set()
        self._flush_waiters: collections.deque[tuple[int, asyncio.Future[None]]] = (
            collections.deque()
        )
        self._batches_committed = 0
        self._messages_committed = 0
        self._batches_failed = 0
        self._messages_failed = 0
        self._max_batch_size = 0
        self._last_batch_size = 0
        self._batch_sizes: collections.Counter[int] = collections.Counter()
        self._refused: collections.Counter[str] = collections.Counter()

    def refused(self, reason: str) -> None:
        """Count one send refused at ``submit`` for ``reason`` (one of
        :data:`REFUSAL_REASONS`); it takes no ticket."""
        self._refused[reason] += 1

    def submitted(self) -> int:
        """Count one submission that will be reported later; its ticket."""
        ticket = self._next
        self._next += 1
        return ticket

    def mark(self) -> int:
        """A mark for everything submitted so far (see :meth:`reached`)."""
        return self._next

    def reached(self, mark: int) -> bool:
        """True once every submission counted before ``mark`` was taken is reported."""
        return self._low >= mark

    @property
    def outstanding(self) -> int:
        """Submissions not reported yet."""
        return self._next - self._low - len(self._early)

    def report(
        self,
        items: list[tuple[Message, Any]],
        error: StoreError | None,
        tickets: Sequence[int] | None = None,
    ) -> None:
        """Count one batch's outcome, call ``on_batch``, wake the flushers it completes.

        ``tickets`` are the items' tickets from :meth:`submitted`; None means the oldest
        unreported ones (a store with one writer that reports in submission order).
        """
        size = len(items)
        if error is None:
            self._batches_committed += 1
            self._messages_committed += size
        else:
            self._batches_failed += 1
            self._messages_failed += size
        self._last_batch_size = size
        self._max_batch_size = max(self._max_batch_size, size)
        if size:
            self._batch_sizes[1 << (size.bit_length() - 1)] += 1
        try:
            self.on_batch(BatchResult(items, error))
        except Exception:
            logger.exception("history store: on_batch callback failed for a batch of %d", size)
        self._settle(size if tickets is None else None, tickets)
        while self._flush_waiters and self._flush_waiters[0][0] <= self._low:
            _, waiter = self._flush_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _settle(self, oldest: int | None, tickets: Sequence[int] | None) -> None:
        """Mark ``tickets`` (or the ``oldest`` unreported ones) reported; raise ``low``."""
        early = self._early
        if tickets is None:
            tickets = []
            candidate = self._low
            while len(tickets) < (oldest or 0) and candidate < self._next:
                if candidate not in early:
                    tickets.append(candidate)
                candidate += 1
        for ticket in tickets:
            if not self._low <= ticket < self._next or ticket in early:
                raise ValueError(f"ticket {ticket} was not given out or is reported already")
            early.add(ticket)
        low = self._low
        while low in early:
            early.remove(low)
            low += 1
        self._low = low

    async def flush(self) -> None:
        """Return once every submission counted before the call has been reported."""
        target = self.mark()
        if self.reached(target):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((target, waiter))
        await waiter

    def stats(self, queue_depth: int) -> StoreStats:
        """The counters so far, with the store's current ``queue_depth``."""
        return StoreStats(
            batches_committed=self._batches_committed,
            messages_committed=self._messages_committed,
            batches_failed=self._batches_failed,
            messages_failed=self._messages_failed,
            max_batch_size=self._max_batch_size,
            last_batch_size=self._last_batch_size,
            queue_depth=queue_depth,
            batch_sizes=dict(self._batch_sizes),
            refused=dict(self._refused),
        )


def _unreported(result: BatchResult) -> None:
    raise RuntimeError("a history store reported a batch before report_to() was called")


class HistoryStore(ABC):
    """Durable history. All methods are called from the event loop thread."""

    @abstractmethod
    def report_to(self, on_batch: BatchCallback) -> None:
        """Report each batch's outcome to ``on_batch`` (before :meth:`start`): each room's
        batches in commit order; rooms on different Redis nodes may interleave."""

    @abstractmethod
    async def start(self) -> None:
        """Open the store and learn every room's last ``seq``; raise StoreError if it cannot."""

    @abstractmethod
    def submit(self, message: Message, context: Any) -> None:
        """Queue ``message`` (``seq`` 0) for the next group commit; never blocks.

        Raises ``StoreUnavailable`` when the bounded queue is full or the store is
        closing: then nothing was queued. The outcome arrives later via ``on_batch``.
        """

    @abstractmethod
    def last_seq(self, room: str) -> int:
        """The last ``seq`` this store committed to ``room`` (0 when none): the room's own
        with one process; a shared store (Redis) knows only this process' commits, so a
        shared room's is read from the broker (what this process delivered)."""

    @abstractmethod
    async def history(self, room: str, before: int | None, limit: int) -> list[Message]:
        """The latest ``limit`` messages with ``seq < before`` (all when None), ascending."""

    @abstractmethod
    async def after(self, room: str, after_seq: int, limit: int) -> list[Message]:
        """Up to ``limit`` stored messages with ``seq > after_seq``, ascending (for replay;
        a shared store may return some not durable yet: the caller bounds them by what
        it delivered)."""

    async def recent_sends(self, since_ms: int, limit: int) -> list[Message]:
        """The newest ``limit`` stored messages with a ``ref`` and ``ts >= since_ms``, oldest
        first (read once at start, for idempotent sends). A store that keeps no such index
        returns none."""
        return []

    @abstractmethod
    async def flush(self) -> None:
        """Return once everything submitted so far is committed and reported."""

    @abstractmethod
    def stats(self) -> StoreStats:
        """A snapshot of the batches committed and failed so far and of the queue."""

    @abstractmethod
    async def close(self) -> None:
        """Flush, then release the database; later submits raise ``StoreUnavailable``."""

    def notable(self) -> dict[str, Any]:
        """The store's slow events for /stats' ``tail`` (none unless the store records them)."""
        return {}


class LedgerStore(HistoryStore):
    """Base of the stores that queue submissions and report batches through a BatchLedger."""

    _ledger: BatchLedger
    _queue: Sized

    def report_to(self, on_batch: BatchCallback) -> None:
        """Report each batch's outcome to ``on_batch`` (before :meth:`start`): each room's
        batches in commit order; rooms on different Redis nodes may interleave."""
        self._ledger.on_batch = on_batch

    async def flush(self) -> None:
        """Return once all submitted before the call is committed (or failed) and reported."""
        await self._ledger.flush()

    def stats(self) -> StoreStats:
        """A snapshot of the batches committed and failed so far and of the queue."""
        return self._ledger.stats(queue_depth=len(self._queue))
