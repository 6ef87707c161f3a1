"""The history's commit, outside the server: what one message costs in a transaction, by layout.

Backs docs/decisions/0023-the-commit-per-message.md. Each variant writes batches of
messages to random rooms through one SQLite write connection opened as the server's
(WAL, ``synchronous=NORMAL``, no automatic checkpoint), into a file that already holds
``--warm`` messages per room, and times ``BEGIN IMMEDIATE`` … ``COMMIT`` with the
thread's CPU clock (``time.thread_time``: the kernel's share of the WAL writes counts,
another process's time does not). A ``wal_checkpoint(RESTART)`` every 50 commits keeps
the WAL as short as the server's checkpointer does; it is not timed.

Variants:

``schema-1``
    the version-1 commit: the rows, then an upsert of every touched room's ``last_seq``
``current``
    the server's statements (:mod:`chat_server.store.sqlite_schema`): the rows, and a
    room's row only with its first message
``sorted``
    ``current`` with the batch's rows sorted by ``(room, seq)``
``multi-row``
    ``current`` with one ``INSERT … VALUES (…), (…)`` for the batch
``page-1024``
    ``current`` in a file of 1,024-byte pages (4,096 otherwise)
``log-1000``, ``log-10000``
    an insertion-ordered table with no per-room key (consecutive messages share a
    page), copied into the per-room table every 1,000 or 10,000 messages and once more
    at the end (every message is copied once); the copy's time is reported apart
    (``copy``) and in the total

Each variant runs ``--repeat`` times on a fresh file, the variants interleaved; the best
(lowest) run is kept.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from chat_server.store.sqlite_schema import INSERT_MESSAGE, INSERT_ROOM

__all__ = ["VARIANTS", "Result", "Shape", "main", "run"]

_MESSAGES = (
    "CREATE TABLE messages (room TEXT NOT NULL, seq INTEGER NOT NULL, user TEXT NOT NULL,"
    " body TEXT NOT NULL, ts INTEGER NOT NULL, ref TEXT, PRIMARY KEY (room, seq)) WITHOUT ROWID"
)
_ROOMS = "CREATE TABLE rooms (room TEXT PRIMARY KEY, last_seq INTEGER NOT NULL)"
_LOG = (
    "CREATE TABLE log (room TEXT NOT NULL, seq INTEGER NOT NULL, user TEXT NOT NULL,"
    " body TEXT NOT NULL, ts INTEGER NOT NULL, ref TEXT)"
)
_INSERT_LOG = "INSERT INTO log (room, seq, user, body, ts, ref) VALUES (?, ?, ?, ?, ?, ?)"
_COPY_LOG = "INSERT INTO messages SELECT room, seq, user, body, ts, ref FROM log ORDER BY room, seq"
#: the version-1 commit's statement (chat_server.store.sqlite_schema before schema 2)
_UPSERT_ROOM = (
    "INSERT INTO rooms (room, last_seq) VALUES (?, ?)"
    " ON CONFLICT (room) DO UPDATE SET last_seq = excluded.last_seq"
)
_BODY = "hello from the load driver, forty bytes"
_USER = "user-00001"
_TS = 1_732_284_000_123
_RESTART_EVERY = 50

VARIANTS = ("schema-1", "current", "sorted", "multi-row", "page-1024", "log-1000", "log-10000")

Row = tuple[str, int, str, str, int, str]


@dataclass
class Result:
    """One variant at one batch size: best µs per message (total and the log's copy)."""

    variant: str
    batch: int
    messages: int
    us_per_message: float
    copy_us_per_message: float


def _open(path: Path, page_size: int, log: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA page_size = {page_size}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(_MESSAGES)
    conn.execute(_ROOMS)
    if log:
        conn.execute(_LOG)
    return conn


def _warm(conn: sqlite3.Connection, rooms: list[str], per_room: int) -> dict[str, int]:
    conn.execute("BEGIN")
    for room in rooms:
        conn.executemany(
            INSERT_MESSAGE, [(room, seq, _USER, _BODY, _TS, None) for seq in range(1, per_room + 1)]
        )
        conn.execute(INSERT_ROOM, (room, per_room))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return dict.fromkeys(rooms, per_room)


def _writer(variant: str, conn: sqlite3.Connection) -> Callable[[list[Row]], None]:
    """The statements of one transaction's body for ``variant`` (every room has its row
    already, as in a server past its rooms' first messages)."""
    multi: dict[int, str] = {}

    def current(rows: list[Row]) -> None:
        if variant == "sorted":
            rows.sort()
        if variant == "multi-row":
            sql = multi.get(len(rows))
            if sql is None:
                values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(rows))
                sql = multi[len(rows)] = f"INSERT INTO messages VALUES {values}"
            conn.execute(sql, [field for row in rows for field in row])
        else:
            conn.executemany(INSERT_MESSAGE, rows)

    def schema_1(rows: list[Row]) -> None:
        conn.executemany(INSERT_MESSAGE, rows)
        last: dict[str, int] = {}
        for room, seq, *_ in rows:
            last[room] = seq
        conn.executemany(_UPSERT_ROOM, last.items())

    def log(rows: list[Row]) -> None:
        conn.executemany(_INSERT_LOG, rows)

    if variant == "schema-1":
        return schema_1
    if variant.startswith("log-"):
        return log
    return current


def _copy_log(conn: sqlite3.Connection) -> float:
    """Move the log into the per-room table in one transaction; its CPU seconds."""
    started = time.thread_time()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(_COPY_LOG)
    conn.execute("DELETE FROM log")
    conn.execute("COMMIT")
    return time.thread_time() - started


@dataclass(frozen=True)
class Shape:
    """What every run writes: ``messages`` to ``rooms`` rooms holding ``warm`` each."""

    messages: int = 12_000
    rooms: int = 200
    warm: int = 200


def run_one(variant: str, batch: int, shape: Shape, seed: int) -> tuple[float, float]:
    """One run on a fresh file: (total, copy) CPU seconds for ``messages`` messages."""
    with tempfile.TemporaryDirectory(prefix="commit-layout-") as tmp:
        is_log = variant.startswith("log-")
        conn = _open(Path(tmp) / "history.db", 1024 if variant == "page-1024" else 4096, is_log)
        names = [f"room-{index:04d}" for index in range(shape.rooms)]
        seqs = _warm(conn, names, shape.warm)
        write = _writer(variant, conn)
        copy_every = int(variant.split("-")[1]) if is_log else 0
        pick = random.Random(seed).choice
        total = copied = 0.0
        uncopied = 0
        try:
            for commit in range(shape.messages // batch):
                rows: list[Row] = []
                for index in range(batch):
                    room = pick(names)
                    seqs[room] += 1
                    rows.append((room, seqs[room], _USER, _BODY, _TS, f"r-{commit}-{index}"))
                started = time.thread_time()
                conn.execute("BEGIN IMMEDIATE")
                write(rows)
                conn.execute("COMMIT")
                total += time.thread_time() - started
                uncopied += batch
                if copy_every and uncopied >= copy_every:
                    copied += _copy_log(conn)
                    uncopied = 0
                if commit % _RESTART_EVERY == 0:
                    conn.execute("PRAGMA wal_checkpoint(RESTART)")
            if uncopied and is_log:  # every message is copied once, the last ones too
                copied += _copy_log(conn)
            stored = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        finally:
            conn.close()
        expected = shape.rooms * shape.warm + (shape.messages // batch) * batch
        if stored != expected:
            raise RuntimeError(f"{variant}: {stored} messages stored, {expected} written")
        return total + copied, copied


def run(
    variants: tuple[str, ...],
    batches: tuple[int, ...],
    shape: Shape,
    repeat: int,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Result]:
    """Every variant at every batch size, ``repeat`` runs interleaved, best kept."""
    best: dict[tuple[str, int], tuple[float, float]] = {}
    for round_ in range(repeat):
        for batch in batches:
            for variant in variants:
                total, copy = run_one(variant, batch, shape, seed=round_)
                key = (variant, batch)
                if key not in best or total < best[key][0]:
                    best[key] = (total, copy)
                progress(f"round {round_ + 1}/{repeat}: {variant}, batches of {batch}")
    results = []
    for batch in batches:
        written = (shape.messages // batch) * batch
        for variant in variants:
            total, copy = best[(variant, batch)]
            results.append(
                Result(variant, batch, written, total / written * 1e6, copy / written * 1e6)
            )
    return results


def format_table(results: list[Result]) -> str:
    """µs per message, one row per variant, one column per batch size."""
    batches = sorted({r.batch for r in results})
    by = {(r.variant, r.batch): r for r in results}
    head = "variant".ljust(12) + "".join(f"{f'batches of {b}':>24}" for b in batches)
    lines = [head, "-" * len(head)]
    for variant in dict.fromkeys(r.variant for r in results):
        cells = []
        for batch in batches:
            r = by[(variant, batch)]
            copy = f" (copy {r.copy_us_per_message:.1f})" if r.copy_us_per_message else ""
            cells.append(f"{r.us_per_message:.1f}{copy}".rjust(24))
        lines.append(variant.ljust(12) + "".join(cells))
    lines.append("µs of CPU per message in the transaction (best run); copy: the log's share")
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def main(argv: list[str] | None = None) -> int:
    """Run the variants, print the table, optionally write it as JSON; return 0."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.commit_layout",
        description="Time the history's commit per message under several table layouts "
        "and statement shapes (docs/decisions/0023-the-commit-per-message.md).",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: all)",
    )
    parser.add_argument("--batches", default="1,30", help="messages per commit (default: 1,30)")
    parser.add_argument(
        "--messages", type=int, default=12_000, help="messages per run (default: 12000)"
    )
    parser.add_argument("--rooms", type=int, default=200, help="rooms written to (default: 200)")
    parser.add_argument(
        "--warm", type=int, default=200, help="messages per room before timing (default: 200)"
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs per variant (default: 2)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    variants = tuple(args.variants.split(","))
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants: {', '.join(unknown)}")
    batches = _ints(args.batches)
    if min(batches) < 1 or args.messages < max(batches) or args.rooms < 1 or args.repeat < 1:
        parser.error("batches, rooms and repeat must be at least 1, messages at least a batch")

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    started = time.monotonic()
    shape = Shape(args.messages, args.rooms, max(args.warm, 0))
    results = run(variants, batches, shape, args.repeat, progress)
    print(format_table(results))
    took = time.monotonic() - started
    print(f"{len(results)} figures in {took:.0f} s, SQLite {sqlite3.sqlite_version}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
