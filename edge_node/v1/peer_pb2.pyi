from edge_node.v1 import wire_pb2 as _wire_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
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
    __slots__ = ("protocol_version", "node_id", "fleet_id", "arch_id", "round", "buffers", "tier_mode")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    ARCH_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    TIER_MODE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    node_id: str
    fleet_id: str
    arch_id: str
    round: int
    buffers: bool
    tier_mode: str
    def __init__(self, protocol_version: _Optional[str] = ..., node_id: _Optional[str] = ..., fleet_id: _Optional[str] = ..., arch_id: _Optional[str] = ..., round: _Optional[int] = ..., buffers: _Optional[bool] = ..., tier_mode: _Optional[str] = ...) -> None: ...

class ListPeersRequest(_message.Message):
    __slots__ = ("protocol_version", "node_id", "fleet_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    node_id: str
    fleet_id: str
    def __init__(self, protocol_version: _Optional[str] = ..., node_id: _Optional[str] = ..., fleet_id: _Optional[str] = ...) -> None: ...

class PeerEntry(_message.Message):
    __slots__ = ("node_id", "host", "port", "fingerprint")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    host: str
    port: int
    fingerprint: str
    def __init__(self, node_id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class ListPeersReply(_message.Message):
    __slots__ = ("protocol_version", "peers")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    peers: _containers.RepeatedCompositeFieldContainer[PeerEntry]
    def __init__(self, protocol_version: _Optional[str] = ..., peers: _Optional[_Iterable[_Union[PeerEntry, _Mapping]]] = ...) -> None: ...
