"""Reads of the SQLite history on their own thread and connection.

:class:`SqliteReader` runs every query on one reader thread with a connection of
its own (``PRAGMA query_only``), so a read never blocks the event loop and never
takes the write connection: in WAL mode it sees the last committed state while
commits go on. SQLite errors come back as the store's errors: a locked or
unreadable file as ``StoreUnavailable``, anything else as ``StoreError``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from chat_server.errors import StoreError, StoreUnavailable
from chat_server.messages import Message
from chat_server.store.sqlite_schema import (
    SELECT_AFTER,
    SELECT_BEFORE,
    SELECT_LATEST,
    SELECT_ROOM_NEWEST_FIRST,
    SELECT_ROOMS,
    rows_to_messages,
)

__all__ = ["SqliteReader"]

_T = TypeVar("_T")


class SqliteReader:
    """The history store's read side: one reader thread, one query-only connection.

    :meth:`open`, :meth:`close` and the queries are called from the event loop that
    called :meth:`open`; the connection is owned by the reader thread. A query before
    :meth:`open` or once ``closed`` is set raises ``StoreUnavailable``.
    """

    def __init__(self, path: Path, busy_timeout_s: float) -> None:
        """Configure the reader; nothing is opened until :meth:`open`."""
        self._path = path
        self._busy_timeout_s = busy_timeout_s
        #: set by the store when it closes (or fails to start): queries are refused
        self.closed = False

        # Owned by the event loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None

        # Owned by the reader thread.
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        """Start the reader thread and open its connection there.

        Raises ``StoreError`` naming the path when the file cannot be opened; call
        :meth:`close` afterwards all the same.
        """
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chat-history-reader")
        await self._loop.run_in_executor(self._executor, self._open_conn)

    async def close(self) -> None:
        """Close the connection on the reader thread, then stop the thread; idempotent."""
        if self._executor is not None:
            executor, self._executor = self._executor, None
            assert self._loop is not None
            await self._loop.run_in_executor(executor, self._close_conn)
            executor.shutdown(wait=True)

    def _open_conn(self) -> None:
        """Reader thread: open the read-only-by-pragma connection."""
        try:
            conn = sqlite3.connect(self._path, timeout=self._busy_timeout_s, isolation_level=None)
            conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open history store {str(self._path)!r}: {exc}") from exc
        self._conn = conn

    def _close_conn(self) -> None:
        """Reader thread: close the read connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _read(self, query: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``query`` on the reader thread; map SQLite errors to ``StoreError``."""
        if self._executor is None or self.closed:
            reason = "closed" if self.closed else "not started"
            raise StoreUnavailable(f"history store {reason}")
        assert self._loop is not None
        return await self._loop.run_in_executor(self._executor, self._run_query, query)

    def _run_query(self, query: Callable[[sqlite3.Connection], _T]) -> _T:
        """Reader thread: run ``query`` on the connection."""
        conn = self._conn
        if conn is None:
            raise StoreUnavailable("history store closed")
        try:
            return query(conn)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"history store unavailable: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"history store failed: {exc}") from exc

    async def history(self, room: str, before: int | None, limit: int) -> list[Message]:
        """The latest ``limit`` messages with ``seq < before`` (no bound when None), ascending."""
        if limit <= 0:
            return []

        def query(conn: sqlite3.Connection) -> list[Message]:
            if before is None:
                rows = conn.execute(SELECT_LATEST, (room, limit)).fetchall()
            else:
                rows = conn.execute(SELECT_BEFORE, (room, before, limit)).fetchall()
            rows.reverse()
            return rows_to_messages(room, rows)

        return await self._read(query)

    async def recent_sends(self, since_ms: int, limit: int) -> list[Message]:
        """The newest ``limit`` messages with a ``ref`` and ``ts >= since_ms``, oldest first."""
        return await self._read(lambda conn: _recent_sends(conn, since_ms, limit))

    async def after(self, room: str, after_seq: int, limit: int) -> list[Message]:
        """Up to ``limit`` committed messages with ``seq > after_seq``, ascending."""
        if limit <= 0:
            return []

        def query(conn: sqlite3.Connection) -> list[Message]:
            rows = conn.execute(SELECT_AFTER, (room, after_seq, limit)).fetchall()
            return rows_to_messages(room, rows)

        return await self._read(query)


def _recent_sends(conn: sqlite3.Connection, since_ms: int, limit: int) -> list[Message]:
    """The newest ``limit`` messages with a ``ref`` and ``ts >= since_ms``, oldest first.

    Each room's tail is read backwards by its primary key and stops at the first
    message older than the window (``ts`` rises with ``seq`` within a room), so the
    cost is the window's messages, not the table.
    """
    found: list[Message] = []
    rooms = [room for (room,) in conn.execute(SELECT_ROOMS)]
    for room in rooms:
        rows = conn.execute(SELECT_ROOM_NEWEST_FIRST, (room,))
        for seq, user, body, ts, ref in rows:
            if ts < since_ms:
                break
            if ref is not None:
                found.append(Message(room=room, seq=seq, user=user, body=body, ts=ts, ref=ref))
    found.sort(key=lambda message: message.ts)
    return found[-limit:]
