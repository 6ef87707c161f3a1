"""The history file's layout: its tables, every SQL statement on them, and how it is opened.

The file holds two tables: ``messages`` (one row per committed message, keyed by
``(room, seq)``) and ``rooms`` (one row per room that ever had a message, written once,
by the first commit that held one). A room's last ``seq`` is its newest message's:
trimming (``HISTORY_MAX``) always keeps the newest, so numbering continues from it after
a reopen. Version 1 files also rewrote ``rooms.last_seq`` in every commit, one more
B-tree page per transaction (docs/decisions/0023-the-commit-per-message.md); their
``last_seq`` is still read, as a floor. ``PRAGMA user_version`` records the layout
(:data:`SCHEMA_VERSION`); a file with a newer one is refused, so a version-1 server
never numbers from a stale ``last_seq``. Every ``SELECT`` on ``messages`` returns
``(seq, user, body, ts, ref)`` rows, which :func:`rows_to_messages` turns into messages.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

from chat_server.errors import StoreError
from chat_server.messages import Message

__all__ = [
    "INSERT_MESSAGE",
    "INSERT_ROOM",
    "LAST_SEQS",
    "SCHEMA_VERSION",
    "SELECT_AFTER",
    "SELECT_BEFORE",
    "SELECT_LATEST",
    "SELECT_ROOMS",
    "SELECT_ROOM_NEWEST_FIRST",
    "SYNCHRONOUS",
    "TRIM_ROOM",
    "open_writer",
    "rows_to_messages",
]

SCHEMA_VERSION: Final = 2
"""The ``PRAGMA user_version`` this module writes and understands."""

_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS messages (
        room TEXT NOT NULL,
        seq INTEGER NOT NULL,
        user TEXT NOT NULL,
        body TEXT NOT NULL,
        ts INTEGER NOT NULL,
        ref TEXT,
        PRIMARY KEY (room, seq)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS rooms (
        room TEXT PRIMARY KEY,
        last_seq INTEGER NOT NULL
    )""",
)
INSERT_MESSAGE: Final = (
    "INSERT INTO messages (room, seq, user, body, ts, ref) VALUES (?, ?, ?, ?, ?, ?)"
)
#: a room's row, written by the first commit holding its messages, with that commit's last
#: seq (only a floor: see above), never rewritten
INSERT_ROOM: Final = "INSERT OR IGNORE INTO rooms (room, last_seq) VALUES (?, ?)"
#: every room's last seq: its newest message's, or (a version-1 file) the last one recorded
LAST_SEQS: Final = (
    "SELECT room, max(last_seq, coalesce((SELECT max(seq) FROM messages"
    " WHERE messages.room = rooms.room), 0)) FROM rooms"
)
TRIM_ROOM: Final = "DELETE FROM messages WHERE room = ? AND seq <= ?"
SELECT_LATEST: Final = (
    "SELECT seq, user, body, ts, ref FROM messages WHERE room = ? ORDER BY seq DESC LIMIT ?"
)
SELECT_BEFORE: Final = (
    "SELECT seq, user, body, ts, ref FROM messages"
    " WHERE room = ? AND seq < ? ORDER BY seq DESC LIMIT ?"
)
SELECT_AFTER: Final = (
    "SELECT seq, user, body, ts, ref FROM messages"
    " WHERE room = ? AND seq > ? ORDER BY seq ASC LIMIT ?"
)
SELECT_ROOMS: Final = "SELECT room FROM rooms"
SELECT_ROOM_NEWEST_FIRST: Final = (
    "SELECT seq, user, body, ts, ref FROM messages WHERE room = ? ORDER BY seq DESC"
)

#: the store's ``synchronous`` setting -> SQLite's ``PRAGMA synchronous`` value
SYNCHRONOUS: Final = {"normal": "NORMAL", "full": "FULL"}


def open_writer(
    path: Path, *, synchronous: str, open_timeout_s: float, busy_timeout_s: float
) -> tuple[sqlite3.Connection, dict[str, int]]:
    """Open the write connection: create the file and schema if missing, apply the pragmas.

    Returns the connection and every room's last ``seq``. Opening and creating the
    schema may wait ``open_timeout_s`` for another process; afterwards the connection
    waits ``busy_timeout_s`` on a lock. It never checkpoints (``synchronous`` is the
    ``PRAGMA synchronous`` value, see :data:`SYNCHRONOUS`) and never cuts the WAL file
    back. Raises ``StoreError`` naming the path when the file cannot be opened, cannot
    use WAL mode or has a newer schema.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=open_timeout_s, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open history store {str(path)!r}: {exc}") from exc
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"history store {str(path)!r} cannot use WAL mode ({mode})")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"history store {str(path)!r} has schema version {version};"
                    f" this chatlab knows up to {SCHEMA_VERSION}"
                )
            if version < SCHEMA_VERSION:
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            room_seqs = dict(conn.execute(LAST_SEQS))
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        # This connection never cuts the WAL file back: the cut is an ftruncate in the
        # commit that restarts it, on the loop with CHAT_DB_COMMIT=loop, where it stalled
        # every connection (docs/decisions/0004-checkpoints-off-the-commit.md). The
        # checkpointer's restarts cut it instead (see chat_server.store.sqlite_wal).
        conn.execute("PRAGMA journal_size_limit = -1")
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    except sqlite3.Error as exc:
        conn.close()
        raise StoreError(f"cannot open history store {str(path)!r}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn, room_seqs


def rows_to_messages(room: str, rows: list[tuple[int, str, str, int, str | None]]) -> list[Message]:
    """Turn ``(seq, user, body, ts, ref)`` rows into messages of ``room``."""
    return [
        Message(room=room, seq=seq, user=user, body=body, ts=ts, ref=ref)
        for seq, user, body, ts, ref in rows
    ]
