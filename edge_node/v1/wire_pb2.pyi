from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ValueType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALUE_TYPE_UNSPECIFIED: _ClassVar[ValueType]
    FLOAT32: _ClassVar[ValueType]
    FLOAT16: _ClassVar[ValueType]
    BFLOAT16: _ClassVar[ValueType]
VALUE_TYPE_UNSPECIFIED: ValueType
FLOAT32: ValueType
FLOAT16: ValueType
BFLOAT16: ValueType

class SparseTensor(_message.Message):
    __slots__ = ("name", "shape", "value_type", "bitmap", "values", "nnz", "dense", "start", "count", "value_start", "buffer")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_TYPE_FIELD_NUMBER: _ClassVar[int]
    BITMAP_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NNZ_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    VALUE_START_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    value_type: ValueType
    bitmap: bytes
    values: bytes
    nnz: int
    dense: bool
    start: int
    count: int
    value_start: int
    buffer: bool
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., value_type: _Optional[_Union[ValueType, str]] = ..., bitmap: _Optional[bytes] = ..., values: _Optional[bytes] = ..., nnz: _Optional[int] = ..., dense: _Optional[bool] = ..., start: _Optional[int] = ..., count: _Optional[int] = ..., value_start: _Optional[int] = ..., buffer: _Optional[bool] = ...) -> None: ...

class StreamHeader(_message.Message):
    __slots__ = ("protocol_version", "node_id", "fleet_id", "arch_id", "round", "density", "payload_digest", "message_count", "chunk_count", "tier_mode", "tier")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    ARCH_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DENSITY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIER_MODE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    node_id: str
    fleet_id: str
    arch_id: str
    round: int
    density: float
    payload_digest: bytes
    message_count: int
    chunk_count: int
    tier_mode: str
    tier: str
    def __init__(self, protocol_version: _Optional[str] = ..., node_id: _Optional[str] = ..., fleet_id: _Optional[str] = ..., arch_id: _Optional[str] = ..., round: _Optional[int] = ..., density: _Optional[float] = ..., payload_digest: _Optional[bytes] = ..., message_count: _Optional[int] = ..., chunk_count: _Optional[int] = ..., tier_mode: _Optional[str] = ..., tier: _Optional[str] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("header", "tensors")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    header: StreamHeader
    tensors: _containers.RepeatedCompositeFieldContainer[SparseTensor]
    def __init__(self, header: _Optional[_Union[StreamHeader, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[SparseTensor, _Mapping]]] = ...) -> None: ...
