"""Codecs: round trips, the contract's exact JSON, and malformed frames of every kind."""

from __future__ import annotations

import json
import random

import pytest

from chat_server.codecs import CODEC_NAMES, Codec, chat_pb2, get_codec, protobuf_backend
from chat_server.errors import CodecError, ErrorCode
from chat_server.messages import (
    CLIENT_KINDS,
    SERVER_KINDS,
    Ack,
    ClientMessage,
    Error,
    History,
    HistoryRequest,
    Join,
    Joined,
    Leave,
    Message,
    Presence,
    Send,
    ServerMessage,
    Welcome,
)

JSON_CODECS = ("json", "orjson")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UNICODE = 'héllo wörld ✓ 😀 漢字 "quoted" back\\slash \n\t \x00 \u2028 \x7f'

# ---- fixtures and helpers ------------------------------------------------------


@pytest.fixture(params=CODEC_NAMES)
def codec(request: pytest.FixtureRequest) -> Codec:
    return get_codec(request.param)


@pytest.fixture(params=JSON_CODECS)
def json_codec(request: pytest.FixtureRequest) -> Codec:
    return get_codec(request.param)


@pytest.fixture
def protobuf() -> Codec:
    return get_codec("protobuf")


def as_received(codec: Codec, payload: bytes) -> bytes | str:
    """Return ``payload`` as the peer's websocket library hands it over: text or binary."""
    return payload if codec.binary else payload.decode()


def client_round_trip(codec: Codec, message: ClientMessage) -> ClientMessage:
    return codec.decode_client(as_received(codec, codec.encode_client(message)))


def server_round_trip(codec: Codec, message: ServerMessage) -> ServerMessage:
    return codec.decode_server(as_received(codec, codec.encode_server(message)))


def assert_codec_error(call: object, frame: bytes | str, code: ErrorCode) -> CodecError:
    """Assert that ``call(frame)`` raises CodecError with ``code``; return it."""
    with pytest.raises(CodecError) as info:
        call(frame)  # type: ignore[operator]
    assert info.value.code == code, info.value.detail
    assert info.value.detail
    return info.value


def msg(**overrides: object) -> Message:
    fields: dict[str, object] = {
        "room": "lobby",
        "seq": 42,
        "user": "alice",
        "body": "hello",
        "ts": 1732284000123,
    }
    fields.update(overrides)
    return Message(**fields)  # type: ignore[arg-type]


CLIENT_MESSAGES: list[ClientMessage] = [
    Join(room="lobby"),
    Join(room="lobby", since=41),
    Join(room="lobby", since=0),
    Join(room="lobby", since=INT64_MAX),
    Join(room="lobby", since=INT64_MIN),
    Join(room=""),
    Leave(room="lobby"),
    Leave(room=""),
    Send(room="lobby", body="hello"),
    Send(room="lobby", body="hello", ref="c-17"),
    Send(room="lobby", body="hello", ref=""),
    Send(room="", body=""),
    Send(room="lobby", body=UNICODE, ref="é"),
    HistoryRequest(room="lobby"),
    HistoryRequest(room="lobby", before=120, limit=50),
    HistoryRequest(room="lobby", before=0),
    HistoryRequest(room="lobby", limit=0),
    HistoryRequest(room="lobby", before=0, limit=0),
    HistoryRequest(room="lobby", before=INT64_MIN, limit=INT64_MAX),
]

SERVER_MESSAGES: list[ServerMessage] = [
    Welcome(user="alice", codec="orjson"),
    Welcome(user="", codec=""),
    Joined(room="lobby", members=["alice", "bob"], last_seq=41),
    Joined(room="lobby", members=[], last_seq=0),
    Joined(room="lobby", members=["ünïcode"], last_seq=INT64_MAX),
    Presence(room="lobby", user="bob", event="join"),
    Presence(room="lobby", user="bob", event="leave"),
    msg(),
    msg(ref="c-17"),
    msg(ref=""),
    msg(seq=0, ts=0),
    msg(seq=INT64_MAX, ts=INT64_MIN, body=UNICODE),
    Message(room="", seq=0, user="", body="", ts=0),
    Ack(room="lobby", seq=42),
    Ack(room="lobby", seq=42, ref="c-17"),
    Ack(room="", seq=0),
    History(room="lobby", messages=[]),
    History(room="lobby", messages=[msg(seq=1), msg(seq=2, ref="c-1"), msg(seq=3, body=UNICODE)]),
    Error(code="bad_request", detail="..."),
    Error(code="bad_request", detail="...", ref="c-17"),
    Error(code="", detail=""),
]

# The examples of PROTOCOL.md ("Messages"), verbatim, with the Struct each one means.
CONTRACT_CLIENT_EXAMPLES: list[tuple[str, ClientMessage]] = [
    ('{"type":"join","room":"lobby","since":41}', Join(room="lobby", since=41)),
    ('{"type":"leave","room":"lobby"}', Leave(room="lobby")),
    (
        '{"type":"send","room":"lobby","body":"hello","ref":"c-17"}',
        Send(room="lobby", body="hello", ref="c-17"),
    ),
    (
        '{"type":"history","room":"lobby","before":120,"limit":50}',
        HistoryRequest(room="lobby", before=120, limit=50),
    ),
]
CONTRACT_SERVER_EXAMPLES: list[tuple[str, ServerMessage]] = [
    ('{"type":"welcome","user":"alice","codec":"orjson"}', Welcome(user="alice", codec="orjson")),
    (
        '{"type":"joined","room":"lobby","members":["alice","bob"],"last_seq":41}',
        Joined(room="lobby", members=["alice", "bob"], last_seq=41),
    ),
    (
        '{"type":"presence","room":"lobby","user":"bob","event":"join"}',
        Presence(room="lobby", user="bob", event="join"),
    ),
    (
        '{"type":"message","room":"lobby","seq":42,"user":"alice","body":"hello",'
        '"ts":1732284000123,"ref":"c-17"}',
        msg(ref="c-17"),
    ),
    ('{"type":"ack","room":"lobby","seq":42,"ref":"c-17"}', Ack(room="lobby", seq=42, ref="c-17")),
    (
        '{"type":"history","room":"lobby","messages":[{"type":"message","room":"lobby",'
        '"seq":42,"user":"alice","body":"hello","ts":1732284000123,"ref":"c-17"}]}',
        History(room="lobby", messages=[msg(ref="c-17")]),
    ),
    (
        '{"type":"error","code":"bad_request","detail":"...","ref":"c-17"}',
        Error(code="bad_request", detail="...", ref="c-17"),
    ),
]

# The same examples built with the generated protobuf classes, independently of our encoder.
_pb_message = chat_pb2.ChatMessage(
    room="lobby", seq=42, user="alice", body="hello", ts=1732284000123, ref="c-17"
)
CONTRACT_CLIENT_PROTOBUF: list[chat_pb2.ClientMessage] = [
    chat_pb2.ClientMessage(join=chat_pb2.Join(room="lobby", since=41)),
    chat_pb2.ClientMessage(leave=chat_pb2.Leave(room="lobby")),
    chat_pb2.ClientMessage(send=chat_pb2.Send(room="lobby", body="hello", ref="c-17")),
    chat_pb2.ClientMessage(history=chat_pb2.HistoryRequest(room="lobby", before=120, limit=50)),
]
CONTRACT_SERVER_PROTOBUF: list[chat_pb2.ServerMessage] = [
    chat_pb2.ServerMessage(welcome=chat_pb2.Welcome(user="alice", codec="orjson")),
    chat_pb2.ServerMessage(
        joined=chat_pb2.Joined(room="lobby", members=["alice", "bob"], last_seq=41)
    ),
    chat_pb2.ServerMessage(presence=chat_pb2.Presence(room="lobby", user="bob", event="join")),
    chat_pb2.ServerMessage(message=_pb_message),
    chat_pb2.ServerMessage(ack=chat_pb2.Ack(room="lobby", seq=42, ref="c-17")),
    chat_pb2.ServerMessage(history=chat_pb2.History(room="lobby", messages=[_pb_message])),
    chat_pb2.ServerMessage(error=chat_pb2.Error(code="bad_request", detail="...", ref="c-17")),
]


def _ids(items: list[object]) -> list[str]:
    return [repr(item)[:60] for item in items]


# ---- the codecs and their names ---------------------------------------------------


def test_codec_names_are_the_serializer_values() -> None:
    assert CODEC_NAMES == ("json", "orjson", "protobuf")
    for name in CODEC_NAMES:
        assert get_codec(name).name == name


@pytest.mark.parametrize(
    ("name", "subprotocol", "binary"),
    [
        ("json", "chatlab.json", False),
        ("orjson", "chatlab.json", False),
        ("protobuf", "chatlab.protobuf", True),
    ],
)
def test_codec_subprotocol_and_frame_type(name: str, subprotocol: str, binary: bool) -> None:
    codec = get_codec(name)
    assert codec.subprotocol == subprotocol
    assert codec.binary is binary


@pytest.mark.parametrize("name", ["", "JSON", "msgpack", "proto", " json"])
def test_get_codec_rejects_unknown_names(name: str) -> None:
    with pytest.raises(ValueError, match="allowed: json, orjson, protobuf"):
        get_codec(name)


def test_protobuf_backend_is_upb() -> None:
    assert protobuf_backend() == "upb"


# ---- round trips --------------------------------------------------------------------


def test_every_kind_has_a_round_trip_case() -> None:
    assert {type(m) for m in CLIENT_MESSAGES} == set(CLIENT_KINDS.values())
    assert {type(m) for m in SERVER_MESSAGES} == set(SERVER_KINDS.values())


@pytest.mark.parametrize("message", CLIENT_MESSAGES, ids=_ids(CLIENT_MESSAGES))
def test_client_message_round_trips(codec: Codec, message: ClientMessage) -> None:
    decoded = client_round_trip(codec, message)
    assert type(decoded) is type(message)
    assert decoded == message


@pytest.mark.parametrize("message", SERVER_MESSAGES, ids=_ids(SERVER_MESSAGES))
def test_server_message_round_trips(codec: Codec, message: ServerMessage) -> None:
    decoded = server_round_trip(codec, message)
    assert type(decoded) is type(message)
    assert decoded == message


@pytest.mark.parametrize(
    ("absent", "zero"),
    [
        (Join(room="r"), Join(room="r", since=0)),
        (HistoryRequest(room="r"), HistoryRequest(room="r", before=0)),
        (HistoryRequest(room="r"), HistoryRequest(room="r", limit=0)),
        (Send(room="r", body="b"), Send(room="r", body="b", ref="")),
    ],
)
def test_present_but_zero_differs_from_absent(
    codec: Codec, absent: ClientMessage, zero: ClientMessage
) -> None:
    assert codec.encode_client(absent) != codec.encode_client(zero)
    assert client_round_trip(codec, absent) == absent
    assert client_round_trip(codec, zero) == zero


# ---- the JSON form is exactly the contract's ------------------------------------


@pytest.mark.parametrize(("text", "message"), CONTRACT_CLIENT_EXAMPLES)
def test_json_client_frames_are_the_contract_json(
    json_codec: Codec, text: str, message: ClientMessage
) -> None:
    assert json.loads(json_codec.encode_client(message)) == json.loads(text)
    assert json_codec.decode_client(text) == message


@pytest.mark.parametrize(("text", "message"), CONTRACT_SERVER_EXAMPLES)
def test_json_server_frames_are_the_contract_json(
    json_codec: Codec, text: str, message: ServerMessage
) -> None:
    assert json.loads(json_codec.encode_server(message)) == json.loads(text)
    assert json_codec.decode_server(text) == message


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (Join(room="lobby"), {"type": "join", "room": "lobby"}),
        (HistoryRequest(room="lobby"), {"type": "history", "room": "lobby"}),
        (HistoryRequest(room="l", before=0), {"type": "history", "room": "l", "before": 0}),
        (Send(room="lobby", body="hi"), {"type": "send", "room": "lobby", "body": "hi"}),
    ],
)
def test_json_leaves_out_absent_client_options(
    json_codec: Codec, message: ClientMessage, expected: dict[str, object]
) -> None:
    assert json.loads(json_codec.encode_client(message)) == expected


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            msg(),
            {
                "type": "message",
                "room": "lobby",
                "seq": 42,
                "user": "alice",
                "body": "hello",
                "ts": 1732284000123,
            },
        ),
        (Ack(room="lobby", seq=42), {"type": "ack", "room": "lobby", "seq": 42}),
        (Error(code="internal", detail="x"), {"type": "error", "code": "internal", "detail": "x"}),
    ],
)
def test_json_leaves_out_absent_server_options(
    json_codec: Codec, message: ServerMessage, expected: dict[str, object]
) -> None:
    assert json.loads(json_codec.encode_server(message)) == expected


@pytest.mark.parametrize("message", SERVER_MESSAGES, ids=_ids(SERVER_MESSAGES))
def test_json_frames_are_compact_utf8_with_type_first(
    json_codec: Codec, message: ServerMessage
) -> None:
    frame = json_codec.encode_server(message)
    assert isinstance(frame, bytes)
    text = frame.decode()  # strict UTF-8: a text frame
    assert text.startswith('{"type":')
    assert json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False) == text


@pytest.mark.parametrize(
    "message", [*SERVER_MESSAGES, *CLIENT_MESSAGES], ids=_ids([*SERVER_MESSAGES, *CLIENT_MESSAGES])
)
def test_json_and_orjson_frames_are_identical(message: ServerMessage | ClientMessage) -> None:
    stdlib, fast = get_codec("json"), get_codec("orjson")
    if type(message) in CLIENT_KINDS.values():
        assert stdlib.encode_client(message) == fast.encode_client(message)  # type: ignore[arg-type]
    else:
        assert stdlib.encode_server(message) == fast.encode_server(message)  # type: ignore[arg-type]


def test_json_frames_carry_non_ascii_as_utf8(json_codec: Codec) -> None:
    frame = json_codec.encode_server(msg(body="héllo 😀"))
    assert "héllo 😀".encode() in frame


# ---- JSON and protobuf say the same thing ---------------------------------------------


@pytest.mark.parametrize(
    ("example", "pb"), list(zip(CONTRACT_CLIENT_EXAMPLES, CONTRACT_CLIENT_PROTOBUF, strict=True))
)
def test_json_and_protobuf_client_forms_decode_alike(
    example: tuple[str, ClientMessage], pb: chat_pb2.ClientMessage
) -> None:
    text, message = example
    from_protobuf = get_codec("protobuf").decode_client(pb.SerializeToString())
    for name in JSON_CODECS:
        assert get_codec(name).decode_client(text) == from_protobuf == message


@pytest.mark.parametrize(
    ("example", "pb"), list(zip(CONTRACT_SERVER_EXAMPLES, CONTRACT_SERVER_PROTOBUF, strict=True))
)
def test_json_and_protobuf_server_forms_decode_alike(
    example: tuple[str, ServerMessage], pb: chat_pb2.ServerMessage
) -> None:
    text, message = example
    from_protobuf = get_codec("protobuf").decode_server(pb.SerializeToString())
    for name in JSON_CODECS:
        assert get_codec(name).decode_server(text) == from_protobuf == message


@pytest.mark.parametrize("pb", CONTRACT_SERVER_PROTOBUF, ids=_ids(CONTRACT_SERVER_PROTOBUF))
def test_protobuf_encoder_matches_the_generated_classes(
    protobuf: Codec, pb: chat_pb2.ServerMessage
) -> None:
    message = protobuf.decode_server(pb.SerializeToString())
    assert chat_pb2.ServerMessage.FromString(protobuf.encode_server(message)) == pb


def test_protobuf_optional_fields_are_unset_when_none(protobuf: Codec) -> None:
    pb = chat_pb2.ClientMessage.FromString(protobuf.encode_client(HistoryRequest(room="r")))
    assert not pb.history.HasField("before")
    assert not pb.history.HasField("limit")
    pb = chat_pb2.ClientMessage.FromString(protobuf.encode_client(Join(room="r", since=0)))
    assert pb.join.HasField("since")


# ---- malformed frames: a CodecError with the right code, nothing else --------------


def test_binary_frame_to_json_is_unsupported(json_codec: Codec) -> None:
    frame = json_codec.encode_client(Send(room="lobby", body="hi"))
    assert_codec_error(json_codec.decode_client, frame, ErrorCode.UNSUPPORTED)
    assert_codec_error(json_codec.decode_client, bytearray(frame), ErrorCode.UNSUPPORTED)
    server_frame = json_codec.encode_server(msg())
    assert_codec_error(json_codec.decode_server, server_frame, ErrorCode.UNSUPPORTED)


def test_text_frame_to_protobuf_is_unsupported(protobuf: Codec) -> None:
    text = '{"type":"send","room":"lobby","body":"hi"}'
    assert_codec_error(protobuf.decode_client, text, ErrorCode.UNSUPPORTED)
    assert_codec_error(protobuf.decode_client, "", ErrorCode.UNSUPPORTED)
    assert_codec_error(protobuf.decode_server, text, ErrorCode.UNSUPPORTED)


@pytest.mark.parametrize("frame", [None, 42, ["send"]])
def test_a_frame_that_is_neither_text_nor_bytes_is_unsupported(codec: Codec, frame: object) -> None:
    assert_codec_error(codec.decode_client, frame, ErrorCode.UNSUPPORTED)  # type: ignore[arg-type]
    assert_codec_error(codec.decode_server, frame, ErrorCode.UNSUPPORTED)  # type: ignore[arg-type]


def test_protobuf_accepts_any_bytes_like_frame(protobuf: Codec) -> None:
    frame = protobuf.encode_client(Send(room="lobby", body="hi"))
    assert protobuf.decode_client(bytearray(frame)) == Send(room="lobby", body="hi")
    assert protobuf.decode_client(memoryview(frame)) == Send(room="lobby", body="hi")


BAD_JSON_CLIENT_FRAMES: dict[str, str] = {
    "empty frame": "",
    "whitespace": "   ",
    "invalid JSON": '{"type":"send",',
    "trailing garbage": '{"type":"leave","room":"a"} x',
    "single quotes": "{'type':'leave','room':'a'}",
    "array at top level": '[{"type":"leave","room":"a"}]',
    "number at top level": "42",
    "string at top level": '"leave"',
    "null at top level": "null",
    "true at top level": "true",
    "empty object": "{}",
    "missing type": '{"room":"lobby"}',
    "int type": '{"type":1,"room":"lobby"}',
    "null type": '{"type":null,"room":"lobby"}',
    "list type": '{"type":["send"],"room":"lobby"}',
    "object type": '{"type":{"a":1},"room":"lobby"}',
    "unknown type": '{"type":"shout","room":"lobby"}',
    "server kind from client": '{"type":"message","room":"lobby"}',
    "type differs in case": '{"type":"Send","room":"lobby","body":"x"}',
    "missing room": '{"type":"join"}',
    "missing body": '{"type":"send","room":"lobby"}',
    "int room": '{"type":"leave","room":1}',
    "null room": '{"type":"leave","room":null}',
    "str since": '{"type":"join","room":"a","since":"41"}',
    "float since": '{"type":"join","room":"a","since":41.0}',
    "bool limit": '{"type":"history","room":"a","limit":true}',
    "bool before": '{"type":"history","room":"a","before":false}',
    "list body": '{"type":"send","room":"a","body":["hi"]}',
    "object body": '{"type":"send","room":"a","body":{"t":"hi"}}',
    "int ref": '{"type":"send","room":"a","body":"hi","ref":17}',
    "since above int64": '{"type":"join","room":"a","since":9223372036854775808}',
    "since below int64": '{"type":"join","room":"a","since":-9223372036854775809}',
    "since above uint64": '{"type":"join","room":"a","since":18446744073709551616}',
    "since far above int64": '{"type":"join","room":"a","since":' + "9" * 40 + "}",
    "since with 5000 digits": '{"type":"join","room":"a","since":' + "1" * 5000 + "}",
    "NaN since": '{"type":"join","room":"a","since":NaN}',
    "Infinity limit": '{"type":"history","room":"a","limit":Infinity}',
    "huge array nesting": "[" * 100_000,
    "huge object nesting": '{"a":' * 100_000,
    "deep nesting in a field": '{"type":"send","room":"a","body":' + "[" * 900 + "]" * 900 + "}",
    "escaped lone surrogate": '{"type":"send","room":"a","body":"\\ud800"}',
    "escaped lone low surrogate": '{"type":"send","room":"a","body":"x\\udc00y"}',
    "raw lone surrogate": '{"type":"send","room":"a","body":"\ud800"}',
    "lone surrogate in an ignored key": '{"type":"leave","room":"a","\\udfff":1}',
}


@pytest.mark.parametrize(
    "frame", list(BAD_JSON_CLIENT_FRAMES.values()), ids=list(BAD_JSON_CLIENT_FRAMES)
)
def test_malformed_json_is_bad_request(json_codec: Codec, frame: str) -> None:
    assert_codec_error(json_codec.decode_client, frame, ErrorCode.BAD_REQUEST)


@pytest.mark.parametrize(
    ("frame", "detail"),
    [
        ('{"type":"leave","room":1}', "Expected `str`, got `int` - at `$.room`"),
        ('{"type":"send","room":"a"}', "Object missing required field `body`"),
        (
            '{"type":"history","room":"a","limit":true}',
            "Expected `int | null`, got `bool` - at `$.limit`",
        ),
        (
            '{"type":"join","room":"a","since":1.5}',
            "Expected `int | null`, got `float` - at `$.since`",
        ),
        ('{"room":"a"}', "Object missing required field `type`"),
        ('{"type":"shout"}', "unknown type 'shout'"),
        ('{"type":7}', "`type` must be a string, got a number"),
        ("[]", "expected a JSON object, got an array"),
        ("null", "expected a JSON object, got null"),
        ("{", "invalid JSON"),
    ],
)
def test_json_bad_request_detail_names_the_problem(
    json_codec: Codec, frame: str, detail: str
) -> None:
    error = assert_codec_error(json_codec.decode_client, frame, ErrorCode.BAD_REQUEST)
    assert detail in error.detail


def test_json_error_detail_quotes_a_long_type_briefly(json_codec: Codec) -> None:
    error = assert_codec_error(
        json_codec.decode_client, json.dumps({"type": "x" * 10_000}), ErrorCode.BAD_REQUEST
    )
    assert len(error.detail) < 200


@pytest.mark.parametrize(
    "frame",
    [
        '{"type":"send","room":1,"body":"hi","ref":"c-17"}',
        '{"type":"send","room":"a","ref":"c-17"}',
        '{"type":"shout","ref":"c-17"}',
        '{"ref":"c-17"}',
    ],
)
def test_json_bad_request_echoes_the_frame_ref(json_codec: Codec, frame: str) -> None:
    error = assert_codec_error(json_codec.decode_client, frame, ErrorCode.BAD_REQUEST)
    assert error.ref == "c-17"


@pytest.mark.parametrize(
    "frame",
    [
        '{"type":"send","room":1,"body":"hi","ref":17}',
        '{"type":"send","room":1,"body":"hi","ref":"' + "r" * 65 + '"}',
        '{"type":"send","room":1,"body":"hi"}',
    ],
)
def test_json_bad_request_echoes_no_unusable_ref(json_codec: Codec, frame: str) -> None:
    error = assert_codec_error(json_codec.decode_client, frame, ErrorCode.BAD_REQUEST)
    assert error.ref is None


@pytest.mark.parametrize(
    "frame",
    [
        '{"type":"welcome","user":"a"}',
        '{"type":"joined","room":"a","members":"alice","last_seq":1}',
        '{"type":"joined","room":"a","members":[1],"last_seq":1}',
        '{"type":"history","room":"a","messages":[{"type":"ack","room":"a","seq":1}]}',
        '{"type":"history","room":"a","messages":[{"room":"a"}]}',
        '{"type":"message","room":"a","seq":true,"user":"u","body":"b","ts":1}',
        '{"type":"ack","room":"a","seq":1.0}',
        '{"type":"send","room":"a","body":"b"}',
        '{"type":"ack","room":"a","seq":9223372036854775808}',
        "[]",
        "[" * 100_000,
    ],
)
def test_malformed_server_json_is_bad_request(json_codec: Codec, frame: str) -> None:
    assert_codec_error(json_codec.decode_server, frame, ErrorCode.BAD_REQUEST)


def test_json_ignores_unknown_fields(json_codec: Codec) -> None:
    frame = '{"type":"leave","room":"a","extra":[1,{"b":null}]}'
    assert json_codec.decode_client(frame) == Leave(room="a")


def test_json_accepts_escaped_surrogate_pairs(json_codec: Codec) -> None:
    frame = '{"type":"send","room":"a","body":"\\ud83d\\ude00 \\u00e9"}'
    assert json_codec.decode_client(frame) == Send(room="a", body="😀 é")


def _valid_send_frame() -> bytes:
    return chat_pb2.ClientMessage(
        send=chat_pb2.Send(room="lobby", body="hello", ref="c-17")
    ).SerializeToString()


def test_empty_protobuf_has_no_kind_and_is_bad_request(protobuf: Codec) -> None:
    error = assert_codec_error(protobuf.decode_client, b"", ErrorCode.BAD_REQUEST)
    assert "no kind" in error.detail
    assert_codec_error(protobuf.decode_server, b"", ErrorCode.BAD_REQUEST)


def test_protobuf_with_an_unknown_field_only_is_bad_request(protobuf: Codec) -> None:
    unknown_field_9 = b"\x4a\x00"  # field 9, length-delimited, empty
    assert_codec_error(protobuf.decode_client, unknown_field_9, ErrorCode.BAD_REQUEST)


def test_protobuf_invalid_utf8_string_is_bad_request(protobuf: Codec) -> None:
    frame = _valid_send_frame()
    assert b"lobby" in frame
    bad = frame.replace(b"lobby", b"lo\xffby")
    assert_codec_error(protobuf.decode_client, bad, ErrorCode.BAD_REQUEST)
    server_frame = protobuf.encode_server(msg(user="alice"))
    bad_server = server_frame.replace(b"alice", b"al\xc3\x28e")
    assert_codec_error(protobuf.decode_server, bad_server, ErrorCode.BAD_REQUEST)


def test_truncated_protobuf_is_valid_or_bad_request(protobuf: Codec) -> None:
    frame = _valid_send_frame()
    assert_codec_error(protobuf.decode_client, frame[:-1], ErrorCode.BAD_REQUEST)
    for end in range(len(frame)):
        try:
            protobuf.decode_client(frame[:end])
        except CodecError as error:
            assert error.code == ErrorCode.BAD_REQUEST


def test_protobuf_server_frame_on_the_client_side_is_not_a_crash(protobuf: Codec) -> None:
    # A ServerMessage read as a ClientMessage: same wire format, other meaning.
    frame = protobuf.encode_server(msg(ref="c-17"))
    try:
        protobuf.decode_client(frame)
    except CodecError as error:
        assert error.code == ErrorCode.BAD_REQUEST


def test_random_bytes_never_escape_as_another_exception(protobuf: Codec) -> None:
    rng = random.Random(20241122)
    valid = [protobuf.encode_client(m) for m in CLIENT_MESSAGES]
    valid += [protobuf.encode_server(m) for m in SERVER_MESSAGES]
    for i in range(600):
        if i % 2:
            buffer = rng.randbytes(rng.randrange(0, 64))
        else:  # flip a few bytes of a valid frame: deeper into the parser
            mutable = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                if mutable:
                    mutable[rng.randrange(len(mutable))] = rng.randrange(256)
            buffer = bytes(mutable)
        for decode in (protobuf.decode_client, protobuf.decode_server):
            try:
                decoded = decode(buffer)
            except CodecError as error:
                assert error.code == ErrorCode.BAD_REQUEST
            else:
                assert type(decoded) in (*CLIENT_KINDS.values(), *SERVER_KINDS.values())


def test_random_text_never_escapes_as_another_exception(json_codec: Codec) -> None:
    rng = random.Random(20241122)
    valid = [json_codec.encode_client(m).decode() for m in CLIENT_MESSAGES]
    alphabet = '{}[]":,0123456789.-+eEtrufalsn \\u"type"room"body"ref'
    for i in range(400):
        if i % 2:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 48)))
        else:
            chars = list(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                chars[rng.randrange(len(chars))] = rng.choice(alphabet)
            text = "".join(chars)
        for decode in (json_codec.decode_client, json_codec.decode_server):
            try:
                decode(text)
            except CodecError as error:
                assert error.code == ErrorCode.BAD_REQUEST
