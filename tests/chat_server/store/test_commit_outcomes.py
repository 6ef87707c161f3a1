"""The Redis commit path's decisions, driven with plain values: what a script's reply and
its node's ``WAIT`` count mean, and the KEYS/ARGV each script is called with."""

from __future__ import annotations

import msgspec
import pytest
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
)

from chat_server.messages import Message
from chat_server.store.redis_scripts import (
    COMMIT_SCRIPT,
    HISTORY_SCRIPT,
    PUBLISH_SCRIPT,
    CommitCalls,
    Outcome,
    body_digest,
    commit_outcome,
    history_call,
    parse_answer,
    publish_call,
    publish_outcome,
    wait_count,
)


@pytest.mark.parametrize(
    ("reply", "replicas", "asked", "outcome"),
    [
        # the script ran: durable as asked, or on the primary only
        (b"17", 0, 0, Outcome.SETTLED),
        (b"17 1:12", 1, 1, Outcome.SETTLED),
        (b"17", 2, 1, Outcome.SETTLED),
        (b"17", 0, 1, Outcome.IN_DOUBT),
        (17, 1, 2, Outcome.IN_DOUBT),
        # not run there: another node serves the slot, or its keys are moving
        (MovedError("3999 127.0.0.1:7001"), 1, 1, Outcome.IN_DOUBT),
        (AskError("3999 127.0.0.1:7001"), 0, 0, Outcome.IN_DOUBT),
        (TryAgainError("multiple keys"), 0, 0, Outcome.IN_DOUBT),
        (ClusterDownError("the cluster is down"), 0, 0, Outcome.IN_DOUBT),
        # Redis said it did not run it
        (BusyLoadingError("Redis is loading"), 1, 1, Outcome.REFUSED),
        (ReadOnlyError("You can't write against a read only replica."), 0, 0, Outcome.REFUSED),
        (
            OutOfMemoryError("used memory > 'maxmemory'"),
            0,
            0,
            Outcome.REFUSED,
        ),
        # redis-py's MasterDownError is a ClusterDownError: read the slots again
        (MasterDownError("Link with MASTER is down"), 0, 0, Outcome.IN_DOUBT),
        (ResponseError("BUSY Redis is busy running a script."), 0, 0, Outcome.REFUSED),
        # it ran and failed
        (ResponseError("STALE batch 3 arrived after batch 4"), 1, 1, Outcome.FAILED),
        (ResponseError("ERR Error running script"), 0, 0, Outcome.FAILED),
    ],
)
def test_a_commit_reply_has_one_outcome(reply, replicas, asked, outcome):
    assert commit_outcome(reply, replicas, asked) is outcome


def test_a_publish_that_failed_stays_in_doubt():
    assert publish_outcome(b"3") is Outcome.SETTLED
    assert publish_outcome(None) is Outcome.SETTLED  # published by the commit script
    assert publish_outcome(RedisConnectionError("gone")) is Outcome.IN_DOUBT
    assert publish_outcome(MovedError("1 127.0.0.1:7002")) is Outcome.IN_DOUBT


def test_a_failed_wait_counts_no_replica():
    assert wait_count(2) == 2
    assert wait_count(0) == 0
    assert wait_count(ResponseError("UNBLOCKED force unblock from blocking operation")) == 0


def test_parse_answer_gives_the_first_seq_and_the_repeats():
    assert parse_answer(b"17") == (17, {})
    assert parse_answer("17 0:3 2:9") == (17, {0: 3, 2: 9})
    assert parse_answer(5) == (5, {})


def _message(body: str, ref: str | None = None) -> Message:
    return Message(room="lobby", seq=0, user="ada", body=body, ts=1000, ref=ref)


def test_commit_call_lays_out_keys_and_argv_as_the_script_reads_them():
    calls = CommitCalls(writer="w1", history_max=50, send_ref_window_s=30, ack_replicas=1)
    with_ref, plain = _message("hi", ref="r1"), _message("yo")
    script, keys, args = calls.call("lobby", [with_ref, plain], "7")
    assert script is COMMIT_SCRIPT
    digest = body_digest(with_ref)
    # KEYS: seq, stream, this writer's marker, durable, then two ref keys per digest
    assert len(keys) == 6
    assert keys[2].endswith("w1") and "r1" in keys[4] and digest in keys[4] and "r1" in keys[5]
    # ARGV: channel, batch, HISTORY_MAX, window, "0" (WAIT follows), entries, digests
    assert args[1:5] == ["7", "50", "30", "0"]
    assert [msgspec.json.decode(entry)[1] for entry in args[5:7]] == ["hi", "yo"]
    assert args[7:] == [digest, ""]
    # the script's own arithmetic: n = (#ARGV - 5) / 2
    assert (len(args) - 5) / 2 == 2


def test_commit_call_without_replicas_or_window_publishes_in_the_script():
    calls = CommitCalls(writer="w1", history_max=0, send_ref_window_s=0, ack_replicas=0)
    _, keys, args = calls.call("lobby", [_message("hi", ref="r1")], "1")
    assert len(keys) == 4  # no ref keys with the window off
    assert args[3:5] == ["0", "1"]
    assert args[6:] == [""]


def test_publish_call_publishes_the_new_messages_and_raises_durable_over_repeats():
    messages = [_message("a"), _message("b", ref="r"), _message("c")]
    script, keys, args = publish_call("lobby", messages, (10, {1: 4}))
    assert script is PUBLISH_SCRIPT and len(keys) == 1
    assert args[1] == "11"  # 10 and 11 are new; the repeat was 4
    assert args[2].startswith(b"M10 [") and b'"b"' not in args[2]
    # only repeats: nothing to publish, durable raised to the highest repeat
    assert publish_call("lobby", messages[:1], (10, {0: 12}))[2][1:] == ["12", b""]


def test_history_call_bounds_by_before():
    assert history_call("lobby", None, 20)[0] is HISTORY_SCRIPT
    assert history_call("lobby", None, 20)[2] == ["+", "20"]
    assert history_call("lobby", 8, 5)[2] == ["7", "5"]
