"""The chat service in-process: real SQLite history in a temp dir, no sockets.

The service is built by :func:`chat_server.wiring.build_service` exactly as
``python -m chat_server`` builds it; each connection is a list its frames land in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from chat_server.codecs import get_codec
from chat_server.core.chat import ChatCore, EncodingPerRecipientCore
from chat_server.messages import (
    Ack,
    Error,
    History,
    HistoryRequest,
    Join,
    Joined,
    Message,
    Send,
    Welcome,
)
from chat_server.service import ChatService
from chat_server.settings import Settings
from chat_server.wiring import build_service
from tests.support import InProcessConnection, settled, wait_until

CODEC = get_codec("orjson")


def _settings(tmp_path: Path, **values: str) -> Settings:
    return Settings.from_mapping({"CHAT_DB": str(tmp_path / "chat.db"), **values})


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ChatService]:
    built = build_service(_settings(tmp_path), CODEC)
    await built.start()
    yield built
    await built.drain()
    await built.close()


async def test_a_send_is_stored_delivered_to_every_member_then_acked(service: ChatService):
    alice, bob = InProcessConnection(service, "alice"), InProcessConnection(service, "bob")
    assert alice.of(Welcome) == [Welcome(user="alice", codec="orjson")]
    alice.send(Join(room="lobby"))
    bob.send(Join(room="lobby"))
    await settled(service)
    alice.send(Send(room="lobby", body="hi", ref="r1"))
    await settled(service)
    delivered = Message(room="lobby", seq=1, user="alice", body="hi", ts=0, ref="r1")
    for member in (alice, bob):
        (message,) = member.of(Message)
        assert (message.room, message.seq, message.user, message.body) == (
            delivered.room,
            delivered.seq,
            delivered.user,
            delivered.body,
        )
    assert alice.of(Ack) == [Ack(room="lobby", seq=1, ref="r1")]
    assert bob.of(Ack) == []
    # the sender sees its message before its ack
    assert alice.frames.index(alice.of(Message)[0]) < alice.frames.index(alice.of(Ack)[0])
    assert service.store_stats().messages_committed == 1
    assert service.room_count == 1


async def test_history_and_a_repeated_ref_read_what_was_committed(service: ChatService):
    alice = InProcessConnection(service, "alice")
    alice.send(Join(room="lobby"))
    for n in range(3):
        alice.send(Send(room="lobby", body=f"m{n}", ref=f"r{n}"))
    await settled(service)
    alice.send(Send(room="lobby", body="m1", ref="r1"))  # a retry: answered, not stored
    alice.send(HistoryRequest(room="lobby"))
    await settled(service)
    # the history read runs on the store's reader thread
    await wait_until(lambda: alice.of(History), 10, "the history page")
    (history,) = alice.of(History)
    assert [m.body for m in history.messages] == ["m0", "m1", "m2"]
    assert alice.of(Ack)[-1] == Ack(room="lobby", seq=2, ref="r1")
    assert service.store_stats().messages_committed == 3


async def test_a_send_outside_a_room_is_a_typed_error_and_others_are_served(
    service: ChatService,
):
    alice, bob = InProcessConnection(service, "alice"), InProcessConnection(service, "bob")
    bob.send(Join(room="lobby"))
    alice.send(Send(room="lobby", body="hi", ref="x"))
    bob.send(Send(room="lobby", body="still here"))
    await settled(service)
    assert [(e.code, e.ref) for e in alice.of(Error)] == [("not_in_room", "x")]
    assert [m.body for m in bob.of(Message)] == ["still here"]
    assert service.errors_sent() == {"not_in_room": 1}


async def test_a_session_joining_with_since_gets_what_it_missed(service: ChatService):
    alice = InProcessConnection(service, "alice")
    alice.send(Join(room="lobby"))
    for n in range(4):
        alice.send(Send(room="lobby", body=f"m{n}"))
    await settled(service)
    late = InProcessConnection(service, "carol")
    late.send(Join(room="lobby", since=2))
    await settled(service)
    # the replay is read on the store's reader thread
    await wait_until(lambda: len(late.of(Message)) >= 2, 10, "the replay of seq 3 and 4")
    assert late.of(Joined)[0].last_seq == 4
    assert [m.seq for m in late.of(Message)] == [3, 4]


@pytest.mark.parametrize(
    ("regression", "core_class"),
    [("off", ChatCore), ("encode_per_recipient", EncodingPerRecipientCore)],
)
async def test_the_wiring_chooses_the_core_by_regression_and_both_deliver(
    tmp_path: Path, regression: str, core_class: type
):
    built = build_service(_settings(tmp_path, REGRESSION=regression), CODEC)
    assert type(built.core) is core_class
    await built.start()
    try:
        alice, bob = InProcessConnection(built, "alice"), InProcessConnection(built, "bob")
        alice.send(Join(room="r"))
        bob.send(Join(room="r"))
        alice.send(Send(room="r", body="one"))
        await settled(built)
        assert [m.body for m in bob.of(Message)] == ["one"]
    finally:
        await built.close()
