"""The lab's view of the server's tail: events on the run's clock, a stall's likely cause,
and a real server read while it serves."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from bench.lab.scrape import scrape_metrics
from bench.lab.tailwatch import TailWatch, likely_cause, tail_events
from chat_server.messages import Ack, Message, Send, Welcome
from chatlab.harness import KeyPair, ServerProcess, free_port
from tests.support import Client, wait_until

UNIX_T0 = 1_800_000_000.0
TAIL = {
    "gc": {
        "notable": [{"at": UNIX_T0 + 11.845, "generation": 2, "pause_s": 0.145, "collected": 9}]
    },
    "loop_lag": {"notable": [{"at": UNIX_T0 + 20.03, "lag_s": 0.03}]},
    "slow_commits": [{"at": UNIX_T0 + 5.08, "took_s": 0.08, "size": 40}],
    "slow_checkpoints": [{"at": UNIX_T0 + 30.5, "took_s": 0.5, "size": 1000}],
}


def test_tail_events_are_on_the_runs_clock_and_start_when_they_began():
    events = tail_events(TAIL, UNIX_T0)
    assert [(e["kind"], e["t_s"], e["ms"]) for e in events] == [
        ("commit", 5.0, 80.0),
        ("gc", 11.7, 145.0),
        ("loop_lag", 20.0, 30.0),
        ("checkpoint", 30.0, 500.0),
    ]
    assert events[1]["generation"] == 2


def test_a_stall_is_named_by_what_overlapped_it():
    events = tail_events(TAIL, UNIX_T0)
    assert likely_cause(events, 11.0, 12.0) == "gen2 GC of 145 ms at 11.7 s"
    assert likely_cause(events, 4.5, 5.5) == "commit of 80 ms at 5.0 s"
    assert likely_cause(events, 30.2, 31.0) == "WAL checkpoint of 500 ms at 30.0 s"
    assert likely_cause(events, 19.5, 20.5).startswith("the event loop was held 30 ms at 20.0 s")
    assert likely_cause(events, 40.0, 41.0).startswith("nothing the server saw")


async def test_a_watch_reads_a_real_server_s_metrics_and_events(
    start_server: Callable[..., ServerProcess], keys: KeyPair
):
    metrics_port = free_port()
    # which notable events a quiet server keeps is its own affair: the series are checked
    server = start_server(
        metrics_port=metrics_port,
        gc_policy="default",
        rate_limit_per_s=10000,
        rate_limit_burst=10000,
    )
    t0 = time.monotonic()
    ours = os.sched_getaffinity(0)
    core = max(ours)  # the generator's, in the lab
    watch = TailWatch(
        scrape_metrics, metrics_port, f"http://127.0.0.1:{server.port}/stats", t0, [core]
    ).start()
    alice = await Client.connect(server, keys.mint("alice"))
    await alice.expect(Welcome)
    await alice.join("tail")
    for i in range(200):
        await alice.send(Send(room="tail", body=f"m{i}"))
    for _ in range(200):
        await alice.expect(Ack, skip=(Message,))
    # the watch's points until the last counts 100 ticks of the server's 10 ms ticker
    await wait_until(
        lambda: (
            len(watch.series) >= 2 and watch.series[-1].get("chat_loop_lag_seconds_count", 0) >= 100
        ),
        30,
        lambda: watch.series[-2:],
    )
    # its thread, and only it, runs on that core
    assert os.sched_getaffinity(watch._thread.native_id or 0) == {core}
    assert os.sched_getaffinity(0) == ours
    series, events = watch.stop()
    await alice.close()
    assert len(series) >= 2
    assert all(0 < p["t_s"] < time.monotonic() - t0 + 1 for p in series)
    last = series[-1]
    assert last["chat_loop_lag_seconds_count"] >= 100  # a 10 ms ticker, over 2.5 s and more
    assert last["chat_commit_seconds_count"] >= 1
    assert "process_cpu_seconds_total" in last
    assert not any(k.startswith("chat_frames") for k in last)  # only the tail's series
    assert all(e["kind"] in ("gc", "loop_lag", "commit", "checkpoint") for e in events)
