"""The SQLite history's numbering across reopens and trims, over random programs.

Schema 2 numbers a room from its newest message (its ``rooms`` row is written once, with
its first): whatever the sends, rooms, trims (``HISTORY_MAX``) and reopens, every room's
seqs are 1, 2, 3, ... in submission order with no gap or repeat, the newest
``HISTORY_MAX`` are what is kept, and a reopened store knows each room's last seq.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat_server.messages import Message
from chat_server.store.sqlite import SqliteHistoryStore

ROOMS = ("lobby", "side", "third")
FILES = itertools.count()

#: a program: sessions of the store (a reopen between two), each a list of batches (a
#: flush after each), each batch the rooms its sends go to
PROGRAMS = st.lists(
    st.lists(st.lists(st.sampled_from(ROOMS), min_size=1, max_size=8), min_size=1, max_size=4),
    min_size=1,
    max_size=4,
)


class _Sink:
    def __call__(self, result: object) -> None:
        pass


async def _run(path: Path, program: list[list[list[str]]], history_max: int, on: str) -> None:
    assigned: dict[str, list[int]] = {room: [] for room in ROOMS}
    first_commit: dict[str, int] = {}  # each room's last seq in the first batch it was in
    for session in program:
        store = SqliteHistoryStore(
            path=path, on_batch=_Sink(), history_max=history_max, commit_on=on
        )
        await store.start()
        try:
            for room in ROOMS:  # what a reopened store knows: each room's last seq
                assert store.last_seq(room) == len(assigned[room])
            for batch in session:
                messages = [
                    Message(room=room, seq=0, user="u", body=f"{room}{i}", ts=1, ref=None)
                    for i, room in enumerate(batch)
                ]
                for message in messages:
                    store.submit(message, None)
                await store.flush()
                for message in messages:
                    assigned[message.room].append(message.seq)
                for room in batch:
                    first_commit.setdefault(room, len(assigned[room]))
        finally:
            await store.close()

    with sqlite3.connect(path) as conn:
        for room in ROOMS:
            seqs = assigned[room]
            assert seqs == list(range(1, len(seqs) + 1))  # gapless, in submission order
            kept = [
                s
                for (s,) in conn.execute(
                    "SELECT seq FROM messages WHERE room = ? ORDER BY seq", (room,)
                )
            ]
            assert kept == (seqs[-history_max:] if history_max else seqs)
        rows = dict(conn.execute("SELECT room, last_seq FROM rooms"))
        # one row per room that had a message, written once: by the first commit that
        # held its messages, with that commit's last seq (a floor, never rewritten)
        assert rows == first_commit
    conn.close()


@pytest.mark.parametrize("commit_on", ["loop", "thread"])
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=PROGRAMS, history_max=st.sampled_from([0, 1, 2, 5]))
def test_numbering_continues_gapless_across_reopens_and_trims(
    tmp_path: Path, commit_on: str, program: list[list[list[str]]], history_max: int
) -> None:
    path = tmp_path / f"history-{next(FILES)}.sqlite3"
    asyncio.run(_run(path, program, history_max, commit_on))
