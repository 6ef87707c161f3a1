from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Join(_message.Message):
    __slots__ = ("room", "since")
    ROOM_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    room: str
    since: int
    def __init__(self, room: _Optional[str] = ..., since: _Optional[int] = ...) -> None: ...

class Leave(_message.Message):
    __slots__ = ("room",)
    ROOM_FIELD_NUMBER: _ClassVar[int]
    room: str
    def __init__(self, room: _Optional[str] = ...) -> None: ...

class Send(_message.Message):
    __slots__ = ("room", "body", "ref")
    ROOM_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    room: str
    body: str
    ref: str
    def __init__(self, room: _Optional[str] = ..., body: _Optional[str] = ..., ref: _Optional[str] = ...) -> None: ...

class HistoryRequest(_message.Message):
    __slots__ = ("room", "before", "limit")
    ROOM_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    room: str
    before: int
    limit: int
    def __init__(self, room: _Optional[str] = ..., before: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ClientMessage(_message.Message):
    __slots__ = ("join", "leave", "send", "history")
    JOIN_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    join: Join
    leave: Leave
    send: Send
    history: HistoryRequest
    def __init__(self, join: _Optional[_Union[Join, _Mapping]] = ..., leave: _Optional[_Union[Leave, _Mapping]] = ..., send: _Optional[_Union[Send, _Mapping]] = ..., history: _Optional[_Union[HistoryRequest, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("user", "codec")
    USER_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    user: str
    codec: str
    def __init__(self, user: _Optional[str] = ..., codec: _Optional[str] = ...) -> None: ...

class Joined(_message.Message):
    __slots__ = ("room", "members", "last_seq")
    ROOM_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    room: str
    members: _containers.RepeatedScalarFieldContainer[str]
    last_seq: int
    def __init__(self, room: _Optional[str] = ..., members: _Optional[_Iterable[str]] = ..., last_seq: _Optional[int] = ...) -> None: ...

class Presence(_message.Message):
    __slots__ = ("room", "user", "event")
    ROOM_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    room: str
    user: str
    event: str
    def __init__(self, room: _Optional[str] = ..., user: _Optional[str] = ..., event: _Optional[str] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("room", "seq", "user", "body", "ts", "ref")
    ROOM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    room: str
    seq: int
    user: str
    body: str
    ts: int
    ref: str
    def __init__(self, room: _Optional[str] = ..., seq: _Optional[int] = ..., user: _Optional[str] = ..., body: _Optional[str] = ..., ts: _Optional[int] = ..., ref: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("room", "seq", "ref")
    ROOM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    room: str
    seq: int
    ref: str
    def __init__(self, room: _Optional[str] = ..., seq: _Optional[int] = ..., ref: _Optional[str] = ...) -> None: ...

class History(_message.Message):
    __slots__ = ("room", "messages")
    ROOM_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    room: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, room: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "detail", "ref")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    code: str
    detail: str
    ref: str
    def __init__(self, code: _Optional[str] = ..., detail: _Optional[str] = ..., ref: _Optional[str] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("welcome", "joined", "presence", "message", "ack", "history", "error")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    joined: Joined
    presence: Presence
    message: ChatMessage
    ack: Ack
    history: History
    error: Error
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., joined: _Optional[_Union[Joined, _Mapping]] = ..., presence: _Optional[_Union[Presence, _Mapping]] = ..., message: _Optional[_Union[ChatMessage, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., history: _Optional[_Union[History, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...
