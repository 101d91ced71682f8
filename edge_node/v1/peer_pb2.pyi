from edge_node.v1 import wire_pb2 as _wire_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HelloRequest(_message.Message):
    __slots__ = ("protocol_version", "node_id", "fleet_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    node_id: str
    fleet_id: str
    def __init__(self, protocol_version: _Optional[str] = ..., node_id: _Optional[str] = ..., fleet_id: _Optional[str] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("protocol_version", "node_id", "fleet_id", "arch_id", "round", "density", "capacity_tier", "has_model", "value_type")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    ARCH_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DENSITY_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_TIER_FIELD_NUMBER: _ClassVar[int]
    HAS_MODEL_FIELD_NUMBER: _ClassVar[int]
    VALUE_TYPE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    node_id: str
    fleet_id: str
    arch_id: str
    round: int
    density: float
    capacity_tier: str
    has_model: bool
    value_type: _wire_pb2.ValueType
    def __init__(self, protocol_version: _Optional[str] = ..., node_id: _Optional[str] = ..., fleet_id: _Optional[str] = ..., arch_id: _Optional[str] = ..., round: _Optional[int] = ..., density: _Optional[float] = ..., capacity_tier: _Optional[str] = ..., has_model: _Optional[bool] = ..., value_type: _Optional[_Union[_wire_pb2.ValueType, str]] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("protocol_version", "node_id", "fleet_id", "arch_id", "round", "buffers")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    ARCH_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    node_id: str
    fleet_id: str
    arch_id: str
    round: int
    buffers: bool
    def __init__(self, protocol_version: _Optional[str] = ..., node_id: _Optional[str] = ..., fleet_id: _Optional[str] = ..., arch_id: _Optional[str] = ..., round: _Optional[int] = ..., buffers: _Optional[bool] = ...) -> None: ...
