"""PROFILE=cprofile: snapshot windows of the loop and history writer threads, on disk.

Real servers (and one real store) throughout; the checks are on files and call
counts, never on times.
"""

from __future__ import annotations

import os
import pstats
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from chat_server.messages import Ack, Message, Welcome
from chat_server.profiling import ThreadProfile, run_name, write_snapshot
from chat_server.settings import SPECS, Settings
from chat_server.store.sqlite import SqliteHistoryStore
from tests.support import ROOT, Client, KeyPair, RedisProcess, ServerProcess, free_port, wait_until

Func = tuple[str, int, str]

EXECUTEMANY = "<method 'executemany' of 'sqlite3.Connection' objects>"
SQLITE_CLOSE = "<method 'close' of 'sqlite3.Connection' objects>"
SENDS = 60  # under RATE_LIMIT_BURST with the join


def load(path: Path) -> dict[Func, tuple[int, int, float, float, dict]]:
    """A snapshot's pstats table."""
    return pstats.Stats(str(path)).stats  # type: ignore[attr-defined]


#: where the history writer's group commit is (SqliteWriter.commit)
WRITER = "chat_server/store/sqlite_commits.py"


def calls(table: dict[Func, tuple], name: str, file_part: str = "") -> int:
    """Calls of the functions called ``name`` whose file contains ``file_part``."""
    return sum(
        value[1]
        for (filename, _, function), value in table.items()
        if function == name and file_part in filename
    )


def calls_in(table: dict[Func, tuple], file_part: str) -> int:
    """Calls of every function defined in a file whose path contains ``file_part``."""
    return sum(value[1] for (filename, _, _), value in table.items() if file_part in filename)


async def wait_for_file(path: Path, timeout_s: float = 15) -> Path:
    """``path`` once it exists (a bound, not a timing check)."""
    await wait_until(path.exists, timeout_s, f"{path} appearing")
    return path


async def send_and_await_acks(server: ServerProcess, keys: KeyPair, count: int) -> None:
    """One client joins ``lobby`` and sends ``count`` messages, each acked."""
    client = await Client.connect(server, keys.mint("alice"))
    await client.expect(Welcome)
    await client.join("lobby")
    for i in range(count):
        await client.say("lobby", f"hello {i}", ref=f"r{i}")
    acked = 0
    while acked < count:
        acked += isinstance(await client.recv(), Ack)
    await client.close()


async def test_snapshots_hold_both_threads_each_in_its_own_window(
    start_server: Callable[..., ServerProcess], keys: KeyPair, tmp_path: Path
):
    server = start_server(
        event_loop="asyncio",
        profile="cprofile",
        profile_interval_s=3600,
        profile_dir="profiles",
        profile_run="busy",
    )
    run_dir = tmp_path / "profiles" / "busy"
    assert re.search(rf"WARNING .*PROFILE=cprofile is ON.*{re.escape(str(run_dir))}", server.log())

    await send_and_await_acks(server, keys, SENDS)
    server.signal(signal.SIGUSR1)
    busy = load(await wait_for_file(run_dir / "1.prof"))
    server.signal(signal.SIGUSR1)  # nothing sent since
    idle = load(await wait_for_file(run_dir / "2.prof"))
    assert server.stop() == 0
    last = load(run_dir / "3.prof")

    # the event loop thread: the codec decoded every send
    assert calls(busy, "_decode_send", "chat_server/codecs/") == SENDS
    # the history writer thread: group commits
    assert calls(busy, "commit", WRITER) >= 1
    assert calls(busy, EXECUTEMANY) >= 2
    # a window taken idle holds none of the message path
    assert calls(idle, "_decode_send") == 0
    assert calls_in(idle, "chat_server/codecs/") < calls_in(busy, "chat_server/codecs/") / 10
    assert calls(idle, "commit", WRITER) == 0
    assert calls(idle, EXECUTEMANY) == 0
    # the last snapshot, at shutdown, has the writer's last window: it closed its connection
    assert calls(last, SQLITE_CLOSE) == 1
    assert sorted(p.name for p in run_dir.iterdir()) == ["1.prof", "2.prof", "3.prof"]


async def test_snapshots_come_every_interval_into_a_run_named_by_time_and_pid(
    start_server: Callable[..., ServerProcess], tmp_path: Path
):
    server = start_server(
        event_loop="asyncio", profile="cprofile", profile_interval_s=0.2, profile_dir="profiles"
    )
    assert server.proc is not None
    runs = list((tmp_path / "profiles").iterdir())
    assert len(runs) == 1
    assert re.fullmatch(rf"\d{{8}}-\d{{6}}-{server.proc.pid}", runs[0].name)
    await wait_for_file(runs[0] / "3.prof")
    server.kill()
    snapshots = sorted(runs[0].glob("*.prof"), key=lambda p: int(p.stem))
    assert [p.stem for p in snapshots] == [str(n) for n in range(1, len(snapshots) + 1)]
    for path in snapshots:
        assert load(path)


async def test_profile_off_writes_nothing_and_sigusr1_does_not_stop_the_server(
    start_server: Callable[..., ServerProcess], keys: KeyPair, tmp_path: Path
):
    server = start_server(event_loop="asyncio", profile="off", profile_dir="profiles")
    await send_and_await_acks(server, keys, 5)
    server.signal(signal.SIGUSR1)
    await send_and_await_acks(server, keys, 5)  # still serving
    assert server.stop() == 0
    assert not (tmp_path / "profiles").exists()
    assert "SIGUSR1: no profile snapshot, PROFILE is off" in server.log()


def run_profiled_server(
    tmp_path: Path, keys: KeyPair, run: str, port: int
) -> subprocess.CompletedProcess[str]:
    """``python -m chat_server`` with ``PROFILE=cprofile`` into ``profiles/<run>``, run to
    its end (these servers fail at start)."""
    clean = {k: v for k, v in os.environ.items() if k not in {s.env for s in SPECS}}
    return subprocess.run(
        [sys.executable, "-m", "chat_server"],
        env={
            **clean,
            "PYTHONPATH": str(ROOT),
            "JWT_PUBLIC_KEY": str(keys.public_path),
            "CHAT_DB": str(tmp_path / "chat.sqlite3"),
            "CHAT_HOST": "127.0.0.1",
            "CHAT_PORT": str(port),
            "PROFILE": "cprofile",
            "PROFILE_DIR": "profiles",
            "PROFILE_RUN": run,
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_run_that_already_holds_snapshots_exits_2_naming_profile_run(
    tmp_path: Path, keys: KeyPair
):
    taken = tmp_path / "profiles" / "taken"
    taken.mkdir(parents=True)
    (taken / "1.prof").write_bytes(b"")
    result = run_profiled_server(tmp_path, keys, "taken", free_port())
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "PROFILE_RUN" in lines[0] and "taken" in lines[0], lines


def test_a_start_that_cannot_listen_still_writes_the_profiles_last_snapshot(
    tmp_path: Path, keys: KeyPair
):
    """Every resource start-up acquired is released on a failed start: the profiler,
    started before the server listens, writes its last snapshot and the exit is 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_profiled_server(tmp_path, keys, "refused", port)
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr, result.stderr
    snapshots = sorted((tmp_path / "profiles" / "refused").glob("*.prof"))
    assert snapshots, result.stderr
    # the store closed before the last snapshot: its close is in it
    assert calls(load(snapshots[-1]), "close", "chat_server/store/sqlite.py") >= 1


async def test_each_worker_writes_its_own_run_and_sigusr1_reaches_them(
    start_server: Callable[..., ServerProcess], redis_server: RedisProcess, tmp_path: Path
):
    server = start_server(
        event_loop="asyncio",
        workers=2,
        broker="redis",
        redis_url=redis_server.url,
        profile="cprofile",
        profile_interval_s=3600,
        profile_dir="profiles",
        profile_run="lab",
    )
    profiles = tmp_path / "profiles"

    def both_answered() -> bool:  # a worker not ready yet is not sent it: ask again
        if len(list(profiles.glob("*/1.prof"))) == 2:
            return True
        server.signal(signal.SIGUSR1)
        return False

    await wait_until(both_answered, 20, lambda: sorted(profiles.rglob("*")), interval_s=0.5)
    runs = [re.fullmatch(r"lab-w(\d+)-(\d+)", p.name) for p in profiles.iterdir()]
    assert all(runs) and len(runs) == 2, runs
    assert sorted(int(m[1]) for m in runs if m) == [0, 1]
    assert {int(m[2]) for m in runs if m} == set(server.worker_pids())
    for path in profiles.glob("*/1.prof"):
        assert calls(load(path), "_run_once", "asyncio/base_events.py") > 0


def test_a_workers_run_name_holds_its_index_and_pid():
    named = Settings.from_mapping({"PROFILE_RUN": "lab"})
    unnamed = Settings.from_mapping({})
    started_s = time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1))
    assert run_name(named, None, 42, started_s) == "lab"
    assert run_name(named, 1, 42, started_s) == "lab-w1-42"
    assert run_name(unnamed, None, 42, started_s) == "20260102-030405-42"
    assert run_name(unnamed, 0, 42, started_s) == "20260102-030405-w0-42"


async def test_the_writer_thread_closes_its_window_when_asked_idle_or_busy(tmp_path: Path):
    hook = ThreadProfile("history writer")
    store = SqliteHistoryStore(
        path=tmp_path / "chat.sqlite3",
        on_batch=lambda result: None,
        writer_hook=hook,
        commit_on="thread",
    )
    await store.start()
    for i in range(20):
        store.submit(Message(room="lobby", seq=0, user="alice", body=f"m{i}", ts=1), None)
    await store.flush()
    busy = await hook.collect(timeout_s=60)
    idle = await hook.collect(timeout_s=60)
    await store.close()
    last = await hook.collect(timeout_s=60)  # the thread is gone: its last window, at once
    assert await hook.collect(timeout_s=60) == []
    assert (len(busy), len(idle), len(last)) == (1, 1, 1)

    def table(profilers: list, name: str) -> dict:
        path = tmp_path / f"{name}.prof"
        write_snapshot(profilers, path)
        return load(path)

    assert calls(table(busy, "busy"), "commit", WRITER) >= 1
    assert calls(table(idle, "idle"), "commit", WRITER) == 0
    assert calls(table(last, "last"), SQLITE_CLOSE) == 1
    assert store.stats().messages_committed == 20
