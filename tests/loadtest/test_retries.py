"""The load test's client retries with the same ref: after the server was killed with sends in
flight, the next session resends every unacked send, and the room holds each exactly once."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from chat_server.codecs import get_codec
from loadtest.client import HandshakeFailed, Ledger, Session
from tests.support import KeyPair, ServerProcess, stored_history, wait_until

ROOM = "load-retry"
SENDS = 3000


def _session(server: ServerProcess, keys: KeyPair, ledger: Ledger, prefix: str) -> Session:
    session = Session(get_codec("orjson"), ledger, _ignore, "loader", ROOM, ref_prefix=prefix)
    joined = threading.Event()
    session.on_joined = joined.set
    session.connect(server.url, keys.mint("loader"))
    threading.Thread(target=session.receive_forever, daemon=True).start()
    session.join()
    assert joined.wait(10)
    return session


def _ignore(**_report: Any) -> None:
    return None


async def test_unacked_sends_are_retried_with_their_refs_and_stored_once(
    start_server, keys: KeyPair, tmp_path: Path
):
    limits = {"rate_limit_per_s": 100000, "rate_limit_burst": 100000}
    server = start_server(event_loop="uvloop", **limits)
    ledger = Ledger()
    first = _session(server, keys, ledger, "1.")
    never_sent: list[str] = []

    def send_until_closed() -> None:
        for _ in range(SENDS):
            try:
                first.send_chat()
            except OSError:
                never_sent.append(f"1.{first.sent - 1}")
                return
            time.sleep(0.0005)  # a send's pace, for the kill to land among them

    sender = threading.Thread(target=send_until_closed)
    sender.start()
    await wait_until(lambda: ledger.acked >= 50, 10, "50 acks", interval_s=0.001)
    server.kill()  # sends in flight: some stored and never acked, some never stored
    sender.join(10)
    # the session read what reached it and saw the connection end
    await wait_until(lambda: ledger.unexpected_closes == 1, 10, "the session seeing the kill")
    sent = first.sent
    unacked = first.unacked_sends()
    assert unacked, "everything was acked before the kill: nothing to retry"

    restarted = start_server(
        workdir=server.workdir, event_loop="uvloop", chat_db=server.env["CHAT_DB"], **limits
    )
    second = _session(restarted, keys, ledger, "2.")
    second.carry_over(unacked)
    second.resend_due()
    await wait_until(
        lambda: not second.bodies,
        20,
        lambda: f"{len(second.bodies)} retried sends never acked",
        interval_s=0.01,
    )
    assert ledger.retried == len(unacked) == ledger.acked_after_retry
    stored = await stored_history(restarted, keys.mint("reader"), ROOM)
    counts = collections.Counter(m.ref for m in stored)
    expected = {f"1.{n}" for n in range(sent)} - set(never_sent)
    assert sorted(counts) == sorted(expected)
    assert max(counts.values()) == 1
    second.close()


async def test_a_refused_handshake_carries_its_status_as_data(server: ServerProcess):
    """The load test decides by the refusal's status (a 401 means log in again), not by
    parsing its text."""
    reports: list[dict[str, Any]] = []
    session = Session(get_codec("orjson"), Ledger(), lambda **r: reports.append(r), "x", ROOM)
    with pytest.raises(HandshakeFailed) as refused:
        await asyncio.to_thread(session.connect, server.url, "not-a-token")
    assert refused.value.status == 401, refused.value
    assert reports and reports[-1]["exception"] is refused.value
