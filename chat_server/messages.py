"""The typed messages of the chat protocol, shared by codecs, core and store.

Each kind of ``proto/chat.proto`` (``ClientMessage`` and ``ServerMessage``) is a
msgspec ``Struct`` here, tagged by the JSON ``type`` key. Codecs turn frames into
these and back; the core only ever sees these. Optional fields are ``None`` when
absent, so that absent and zero differ, as in the schema's proto3 ``optional``.
Structural checks (field present, of the right type, 64-bit integers) belong to
the codecs; the protocol's own rules (room names, body length, ``limit`` range)
are checked by :mod:`chat_server.core.validation`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _Msg(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    """Base: every message carries its kind in ``type`` and omits absent options."""


# ---- client to server -------------------------------------------------------


class Join(_Msg, tag="join"):
    room: str
    since: Int64 | None = None


class Leave(_Msg, tag="leave"):
    room: str


class Send(_Msg, tag="send"):
    room: str
    body: str
    ref: str | None = None


class HistoryRequest(_Msg, tag="history"):
    room: str
    before: Int64 | None = None
    limit: Int64 | None = None


ClientMessage = Join | Leave | Send | HistoryRequest
CLIENT_KINDS: dict[str, type[ClientMessage]] = {
    "join": Join,
    "leave": Leave,
    "send": Send,
    "history": HistoryRequest,
}

# ---- server to client -------------------------------------------------------


class Welcome(_Msg, tag="welcome"):
    user: str
    codec: str


class Joined(_Msg, tag="joined"):
    room: str
    members: list[str]
    last_seq: Int64


class Presence(_Msg, tag="presence"):
    room: str
    user: str
    event: str  # "join" | "leave"


class Message(_Msg, tag="message"):
    """A stored chat message; ``seq`` is 0 until the history store commits it."""

    room: str
    seq: Int64
    user: str
    body: str
    ts: Int64
    ref: str | None = None


class Ack(_Msg, tag="ack"):
    room: str
    seq: Int64
    ref: str | None = None


class History(_Msg, tag="history"):
    room: str
    messages: list[Message]


class Error(_Msg, tag="error"):
    code: str
    detail: str
    ref: str | None = None


ServerMessage = Welcome | Joined | Presence | Message | Ack | History | Error
SERVER_KINDS: dict[str, type[ServerMessage]] = {
    "welcome": Welcome,
    "joined": Joined,
    "presence": Presence,
    "message": Message,
    "ack": Ack,
    "history": History,
    "error": Error,
}
