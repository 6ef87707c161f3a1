from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SeedMessage(_message.Message):
    __slots__ = ("name", "age", "random_float", "items")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AGE_FIELD_NUMBER: _ClassVar[int]
    RANDOM_FLOAT_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    age: int
    random_float: float
    items: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., age: _Optional[int] = ..., random_float: _Optional[float] = ..., items: _Optional[_Iterable[str]] = ...) -> None: ...
