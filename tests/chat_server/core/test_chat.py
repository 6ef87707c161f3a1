"""The core without sockets: rooms, presence, delivery order, replay seam, limits."""

from __future__ import annotations

import pytest

from chat_server.codecs import get_codec
from chat_server.core.chat import ChatCore, Session
from chat_server.errors import ErrorCode, ProtocolError
from chat_server.messages import Error, Join, Joined, Leave, Message, Presence, Send, Welcome

CODEC = get_codec("orjson")


class Peer:
    """Records what the core sends to one connection."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.closed: tuple[int, str] | None = None

    def messages(self) -> list[object]:
        return [CODEC.decode_server(f.decode()) for f in self.frames]

    def take(self) -> list[object]:
        out = self.messages()
        self.frames.clear()
        return out

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


class Seam:
    """The core's broker seam, recorded: the rooms opened, the presence written, the
    users held elsewhere and each room's last seq (what the test sets)."""

    def __init__(self, last: dict[str, int] | None = None) -> None:
        self.last = {} if last is None else last
        self.opened: list[str] = []
        self.remote: set[str] = set()
        self.written: list[tuple[str, str]] = []

    def last_seq(self, room: str) -> int:
        return self.last.get(room, 0)

    def subscribe(self, room: str) -> None:
        self.opened.append(room)

    def members(self, room: str) -> set[str]:
        return self.remote

    def presence_changed(self, room: str, user: str) -> None:
        self.written.append((room, user))


class World:
    """A core with a fake clock and a seq counter standing in for the store."""

    def __init__(self, **limits: float) -> None:
        self.last: dict[str, int] = {}
        self.core = ChatCore(
            CODEC,
            Seam(self.last),
            max_body_chars=int(limits.get("max_body_chars", 100)),
            max_protocol_errors=int(limits.get("max_protocol_errors", 3)),
            rate_limit_per_s=limits.get("rate", 10),
            rate_limit_burst=int(limits.get("burst", 5)),
            max_rooms_per_connection=int(limits.get("max_rooms", 128)),
        )

    def connect(self, user: str, now: float = 0.0) -> tuple[Session, Peer]:
        peer = Peer()
        session = self.core.open_session(user, peer.frames.append, peer.close, now)
        assert peer.take() == [Welcome(user=user, codec="orjson")]
        return session, peer

    def commit(self, session: Session, room: str, body: str) -> Message:
        message = self.core.accept_send(session, Send(room=room, body=body), 1)
        self.last[room] = message.seq = self.last.get(room, 0) + 1
        self.core.deliver(message)
        self.core.ack(session, message)
        return message


def test_presence_once_per_user_across_connections():
    world = World()
    a1, pa1 = world.connect("alice")
    a2, pa2 = world.connect("alice")
    b, pb = world.connect("bob")
    world.core.join(a1, Join(room="r"))
    world.core.join(b, Join(room="r"))
    assert pa1.take()[-1] == Presence(room="r", user="bob", event="join")
    assert pb.take() == [Joined(room="r", members=["alice", "bob"], last_seq=0)]
    world.core.join(a2, Join(room="r"))  # alice's second connection: no presence
    assert pb.take() == []
    assert pa2.take() == [Joined(room="r", members=["alice", "bob"], last_seq=0)]
    world.core.close_session(a1)
    assert pb.take() == []  # alice still has a connection in the room
    world.core.leave(a2, Leave(room="r"))
    assert pb.take() == [Presence(room="r", user="alice", event="leave")]


def test_messages_go_to_every_live_member_in_order_encoded_once():
    world = World()
    a, pa = world.connect("alice")
    b, pb = world.connect("bob")
    world.core.join(a, Join(room="r"))
    world.core.join(b, Join(room="r"))
    pa.take(), pb.take()
    world.commit(a, "r", "one")
    world.commit(b, "r", "two")
    assert pa.frames[0] is pb.frames[0]  # the same bytes object went to both
    seqs = [m.seq for m in pb.messages() if isinstance(m, Message)]
    assert seqs == [1, 2]


def test_replaying_member_is_live_only_once_caught_up():
    world = World()
    a, _ = world.connect("alice")
    world.core.join(a, Join(room="r"))
    for body in ("1", "2", "3"):
        world.commit(a, "r", body)
    b, pb = world.connect("bob")
    assert world.core.join(b, Join(room="r", since=1)) is True
    world.commit(a, "r", "4")  # committed during the replay: not sent live to bob
    assert [m for m in pb.take() if isinstance(m, Message)] == []
    assert world.core.replay_caught_up(b, "r", cursor=3) is False  # 4 is stored, not replayed
    assert world.core.replay_caught_up(b, "r", cursor=4) is True
    world.commit(a, "r", "5")
    assert [m.seq for m in pb.take() if isinstance(m, Message)] == [5]


@pytest.mark.parametrize(
    ("send", "code"),
    [
        (Send(room="", body=""), ErrorCode.BAD_REQUEST),
        (Send(room="r", body="x", ref="r" * 65), ErrorCode.BAD_REQUEST),
        (Send(room="bad room", body="x" * 500), ErrorCode.INVALID_ROOM),
        (Send(room="other", body="x" * 500), ErrorCode.TOO_LARGE),
        (Send(room="other", body="x"), ErrorCode.NOT_IN_ROOM),
    ],
)
def test_send_errors_follow_the_contract_precedence(send: Send, code: ErrorCode):
    world = World()
    a, _ = world.connect("alice")
    with pytest.raises(ProtocolError) as error:
        world.core.accept_send(a, send, 1)
    assert error.value.code == code


def test_counted_errors_close_1008_but_unavailable_does_not_count():
    world = World(max_protocol_errors=2)
    a, pa = world.connect("alice")
    world.core.fail(a, ProtocolError(ErrorCode.UNAVAILABLE, "store down"))
    world.core.fail(a, ProtocolError(ErrorCode.BAD_REQUEST, "x"))
    assert pa.closed is None
    world.core.fail(a, ProtocolError(ErrorCode.BAD_REQUEST, "x"))
    assert pa.closed is not None and pa.closed[0] == 1008
    assert [m.code for m in pa.messages() if isinstance(m, Error)] == [
        "unavailable",
        "bad_request",
        "bad_request",
    ]


def test_token_bucket_refills_and_flood_closes():
    world = World(rate=10, burst=5)
    a, pa = world.connect("alice", now=0.0)
    assert all(world.core.allow_frame(a, 0.0) for _ in range(5))
    assert world.core.allow_frame(a, 0.0) is False
    assert world.core.allow_frame(a, 0.1) is True  # 0.1 s at 10/s: one token
    for i in range(5):
        world.core.rate_limited(a, 0.2 + i * 0.01)
    assert pa.closed is not None and "rate_limited" in pa.closed[1]


def test_rate_limited_replies_spread_out_do_not_close():
    world = World(rate=10, burst=5)
    a, pa = world.connect("alice")
    for i in range(20):
        world.core.rate_limited(a, i * 1.0)  # one a second: under BURST per BURST/RATE s
    assert pa.closed is None


def test_a_join_past_the_room_cap_is_refused_uncounted_and_opens_nothing():
    world = World(max_rooms=2, max_protocol_errors=3)
    a, pa = world.connect("alice")
    world.core.join(a, Join(room="r1"))
    world.core.join(a, Join(room="r2"))
    pa.take()
    for _ in range(5):  # more than MAX_PROTOCOL_ERRORS: this error is not counted
        with pytest.raises(ProtocolError) as refused:
            world.core.join(a, Join(room="r3"))
        world.core.fail(a, refused.value)
    assert refused.value.code == ErrorCode.TOO_MANY_ROOMS
    assert pa.take() == [Error(code="too_many_rooms", detail=refused.value.detail)] * 5
    assert pa.closed is None
    assert a.rooms == {"r1", "r2"} and set(world.core.rooms) == {"r1", "r2"}
    # the contract's order: a bad since and a bad name are reported before the cap
    with pytest.raises(ProtocolError) as bad:
        world.core.check_join(a, Join(room="r3", since=-1))
    assert bad.value.code == ErrorCode.BAD_REQUEST
    with pytest.raises(ProtocolError) as bad:
        world.core.check_join(a, Join(room="no room"))
    assert bad.value.code == ErrorCode.INVALID_ROOM
    world.core.join(a, Join(room="r2", since=0))  # a room it is in: joined again
    assert isinstance(pa.take()[0], Joined)
    world.core.leave(a, Leave(room="r1"))  # one left: one more may be joined
    world.core.join(a, Join(room="r3"))
    assert a.rooms == {"r2", "r3"}


def test_rooms_open_through_the_broker_seam_and_closed_ones_are_returned():
    seam = Seam()
    opened = seam.opened
    core = ChatCore(
        CODEC,
        seam,
        max_body_chars=10,
        max_protocol_errors=3,
        rate_limit_per_s=1,
        rate_limit_burst=1,
    )
    a = core.open_session("alice", lambda frame: None, lambda code, reason: None, 0)
    b = core.open_session("bob", lambda frame: None, lambda code, reason: None, 0)
    core.join(a, Join(room="r"))
    core.join(b, Join(room="r"))
    assert opened == ["r"]
    assert core.leave(a, Leave(room="r")) is False  # the room stays open
    assert core.close_session(b) == ["r"]  # returned, for the delivery to tell the broker
    assert opened == ["r"] and "r" not in core.rooms


def test_presence_follows_the_shared_view_of_the_room():
    """With several processes a member sees the shared set plus the local users, once each."""
    seam = Seam()
    remote, written = seam.remote, seam.written
    remote.add("dave")  # dave is connected to another process
    core = ChatCore(
        CODEC,
        seam,
        max_body_chars=100,
        max_protocol_errors=3,
        rate_limit_per_s=10,
        rate_limit_burst=5,
    )
    peers = {}
    sessions = {}
    for user in ("alice", "dave"):
        peers[user] = Peer()
        sessions[user] = core.open_session(user, peers[user].frames.append, peers[user].close, 0)
        peers[user].take()
    core.join(sessions["alice"], Join(room="r"))
    assert peers["alice"].take() == [Joined(room="r", members=["dave", "alice"], last_seq=0)]
    remote.add("alice")  # the broker heard alice's own presence back: nobody is told
    core.remote_presence("r", "alice", True)
    core.join(sessions["dave"], Join(room="r"))  # dave here too: he was in the view already
    assert peers["alice"].take() == []
    core.remote_presence("r", "erin", True)  # erin joined elsewhere
    assert peers["alice"].take() == [Presence(room="r", user="erin", event="join")]
    core.leave(sessions["dave"], Leave(room="r"))  # dave is still connected elsewhere
    assert peers["alice"].take() == []
    remote.discard("dave")
    core.remote_presence("r", "dave", False)
    assert peers["alice"].take() == [Presence(room="r", user="dave", event="leave")]
    assert written == [("r", "alice"), ("r", "dave"), ("r", "dave")]
