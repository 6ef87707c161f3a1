"""The schema, the generated module and the typed messages say the same thing."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import msgspec
import pytest
from google.protobuf import descriptor_pb2, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from chat_server import messages
from chat_server.codecs import chat_pb2

PROTO_DIR = Path(__file__).resolve().parents[3] / "proto"

_Proto = TypeVar("_Proto", bound=Message)

INT64 = msgspec.inspect.IntType(ge=-(2**63), le=2**63 - 1)
STRING = msgspec.inspect.StrType()


def _default_json_name(name: str) -> str:
    """protoc's default ``json_name``: lowerCamelCase of the field name."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _compiled_schema(tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    """Compile proto/chat.proto now, as ``make proto`` does, and return its descriptor."""
    from grpc_tools import protoc

    out = tmp_path / "chat.pb"
    status = protoc.main(
        ["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", str(PROTO_DIR / "chat.proto")]
    )
    assert status == 0, "protoc failed on proto/chat.proto"
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    assert [f.name for f in files] == ["chat.proto"]
    compiled = files[0]
    # The descriptor set spells out every default json_name; the generated module
    # leaves them out. Only a json_name set on purpose in the schema is compared.
    for message in compiled.message_type:
        for field in message.field:
            if field.json_name == _default_json_name(field.name):
                field.ClearField("json_name")
    return compiled


def _one_line(message: object) -> str:
    return text_format.MessageToString(message, as_one_line=True) or "<absent>"  # type: ignore[arg-type]


def _both(what: str, compiled: object, generated: object) -> str:
    """Say how ``what`` reads in the schema and in the generated module."""
    return (
        f"{what}: proto/chat.proto has {{{_one_line(compiled)}}}, "
        f"chat_pb2.py has {{{_one_line(generated)}}}"
    )


def _without(message: _Proto, field: str) -> _Proto:
    """Return a copy of ``message`` with ``field`` cleared."""
    copy = type(message)()
    copy.CopyFrom(message)
    copy.ClearField(field)
    return copy


def _message_differences(
    name: str, want: descriptor_pb2.DescriptorProto, have: descriptor_pb2.DescriptorProto
) -> list[str]:
    """Name each field (by number) or other part of message ``name`` that differs."""
    found: list[str] = []
    want_fields = {f.number: f for f in want.field}
    have_fields = {f.number: f for f in have.field}
    for number in sorted(want_fields.keys() | have_fields.keys()):
        w, h = want_fields.get(number), have_fields.get(number)
        if w != h:
            found.append(_both(f"{name} field #{number}", w, h))
    rest_want, rest_have = _without(want, "field"), _without(have, "field")
    if rest_want != rest_have:
        found.append(_both(name, rest_want, rest_have))
    return found


def _differences(
    compiled: descriptor_pb2.FileDescriptorProto, generated: descriptor_pb2.FileDescriptorProto
) -> list[str]:
    """Name each message field or file-level part that differs, with both versions."""
    found: list[str] = []
    compiled_types = {m.name: m for m in compiled.message_type}
    generated_types = {m.name: m for m in generated.message_type}
    for name in sorted(compiled_types.keys() | generated_types.keys()):
        want, have = compiled_types.get(name), generated_types.get(name)
        if want is None or have is None:
            where = "chat_pb2.py" if want is None else "proto/chat.proto"
            found.append(f"message {name} is only in {where}")
        elif want != have:
            found.extend(_message_differences(name, want, have))
    compiled_order = [m.name for m in compiled.message_type]
    generated_order = [m.name for m in generated.message_type]
    if compiled_order != generated_order and set(compiled_order) == set(generated_order):
        found.append(f"message order: {compiled_order} != {generated_order}")
    rest_compiled = _without(compiled, "message_type")
    rest_generated = _without(generated, "message_type")
    if rest_compiled != rest_generated:
        found.append(_both("file", rest_compiled, rest_generated))
    return found


def test_generated_module_matches_the_schema(tmp_path: Path) -> None:
    compiled = _compiled_schema(tmp_path)
    generated = descriptor_pb2.FileDescriptorProto()
    chat_pb2.DESCRIPTOR.CopyToProto(generated)
    differences = _differences(compiled, generated)
    assert not differences, "chat_pb2.py is stale, run `make proto`:\n" + "\n".join(differences)
    assert compiled == generated


# ---- the schema and the typed layer cannot drift -----------------------------------


def _oneof_kinds(container: Descriptor) -> dict[str, Descriptor]:
    """Map each field of the ``kind`` oneof to its message type."""
    return {f.name: f.message_type for f in container.oneofs_by_name["kind"].fields}


def _expected_type(field: FieldDescriptor) -> object:
    """Return the msgspec type a Struct field must have for this protobuf field."""
    if field.type == FieldDescriptor.TYPE_STRING:
        item: object = STRING
    elif field.type == FieldDescriptor.TYPE_INT64:
        item = INT64
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        item = field.message_type.full_name  # compared by name below
    else:
        pytest.fail(f"{field.full_name}: type {field.type} has no typed counterpart")
    if field.is_repeated:
        return msgspec.inspect.ListType(item)  # type: ignore[arg-type]
    if field.has_presence and field.containing_oneof is not None:  # proto3 optional
        return msgspec.inspect.UnionType((item, msgspec.inspect.NoneType()))  # type: ignore[arg-type]
    return item


def _schema_problems(descriptor: Descriptor, struct: type[msgspec.Struct]) -> list[str]:
    """List how ``struct``'s fields differ from the protobuf message ``descriptor``."""
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    typed = {f.name: f for f in info.fields}
    problems: list[str] = []
    proto_names = [f.name for f in descriptor.fields]
    if set(proto_names) != set(typed):
        problems.append(
            f"{descriptor.full_name} fields {proto_names} != {struct.__name__} fields {list(typed)}"
        )
    for field in descriptor.fields:
        if field.name not in typed:
            continue
        struct_field = typed[field.name]
        where = f"{descriptor.full_name}.{field.name} vs {struct.__name__}.{field.name}"
        expected = _expected_type(field)
        actual = struct_field.type
        if isinstance(expected, msgspec.inspect.ListType) and isinstance(expected.item_type, str):
            ok = (
                isinstance(actual, msgspec.inspect.ListType)
                and isinstance(actual.item_type, msgspec.inspect.StructType)
                and actual.item_type.cls is messages.SERVER_KINDS["message"]
            )
            if not ok:
                problems.append(f"{where}: expected a list of Message, got {actual}")
        elif actual != expected:
            problems.append(f"{where}: expected {expected}, got {actual}")
        optional = isinstance(expected, msgspec.inspect.UnionType)
        if optional and (struct_field.required or struct_field.default is not None):
            problems.append(f"{where}: proto3 optional must default to None in the Struct")
        if not optional and not struct_field.required:
            problems.append(f"{where}: only proto3 optional fields may have a default")
    return problems


@pytest.mark.parametrize(
    ("container", "kinds"),
    [
        (chat_pb2.ClientMessage.DESCRIPTOR, messages.CLIENT_KINDS),
        (chat_pb2.ServerMessage.DESCRIPTOR, messages.SERVER_KINDS),
    ],
    ids=["ClientMessage", "ServerMessage"],
)
def test_oneof_kinds_are_the_typed_kinds(container: Descriptor, kinds: dict[str, type]) -> None:
    oneof = _oneof_kinds(container)
    assert list(container.oneofs_by_name) == ["kind"]
    assert sorted(oneof) == sorted(kinds), (
        f"{container.name} oneof kinds {sorted(oneof)} != typed kinds {sorted(kinds)}"
    )
    for kind, struct in kinds.items():
        assert struct.__struct_config__.tag == kind, f"{struct.__name__} is tagged for {kind!r}"


@pytest.mark.parametrize(
    ("kind", "container", "struct"),
    [(k, chat_pb2.ClientMessage.DESCRIPTOR, s) for k, s in messages.CLIENT_KINDS.items()]
    + [(k, chat_pb2.ServerMessage.DESCRIPTOR, s) for k, s in messages.SERVER_KINDS.items()],
    ids=[f"client-{k}" for k in messages.CLIENT_KINDS]
    + [f"server-{k}" for k in messages.SERVER_KINDS],
)
def test_inner_fields_match_the_struct(
    kind: str, container: Descriptor, struct: type[msgspec.Struct]
) -> None:
    descriptor = _oneof_kinds(container)[kind]
    problems = _schema_problems(descriptor, struct)
    assert not problems, "\n".join(problems)


def test_schema_checker_names_the_differing_field() -> None:
    class Drifted(msgspec.Struct, tag="send", tag_field="type", kw_only=True):
        room: str
        text: str
        ref: int | None = None

    problems = _schema_problems(chat_pb2.Send.DESCRIPTOR, Drifted)
    assert any("fields ['room', 'body', 'ref']" in p and "'text'" in p for p in problems)
    assert any("chatlab.Send.ref" in p for p in problems)
