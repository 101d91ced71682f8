"""The generated protobuf messages, aliased: the one module that imports ``edge_node.v1``.

Everything else (``wire`` codec, ``net`` server and client) uses these names, so a change of the
generated layout touches one import site. The gRPC method paths are derived from the descriptor
rather than from the generated ``*_pb2_grpc`` stubs, whose import pins an exact grpcio version.
"""

from __future__ import annotations

from google.protobuf.unknown_fields import UnknownFieldSet

from edge_node.v1 import peer_pb2 as _peer_pb2
from edge_node.v1 import wire_pb2 as _wire_pb2
from edge_node.wire.spec import ValueType

ProtoValueType = _wire_pb2.ValueType
ProtoSparseTensor = _wire_pb2.SparseTensor
ProtoStreamHeader = _wire_pb2.StreamHeader
ProtoModelChunk = _wire_pb2.ModelChunk
HelloRequest = _peer_pb2.HelloRequest
HelloReply = _peer_pb2.HelloReply
GetModelRequest = _peer_pb2.GetModelRequest
ListPeersRequest = _peer_pb2.ListPeersRequest
ListPeersReply = _peer_pb2.ListPeersReply
PeerEntry = _peer_pb2.PeerEntry

PEER_SERVICE_NAME: str = _peer_pb2.DESCRIPTOR.services_by_name["Peer"].full_name  # "edge_node.v1.Peer"
HELLO_METHOD = f"/{PEER_SERVICE_NAME}/Hello"
GET_MODEL_METHOD = f"/{PEER_SERVICE_NAME}/GetModel"
LIST_PEERS_METHOD = f"/{PEER_SERVICE_NAME}/ListPeers"

# Matched by name (a value type missing from the proto fails at import); the numbers are the same.
_PROTO_VALUE_TYPES: dict[ValueType, ProtoValueType] = {v: ProtoValueType.Value(v.name) for v in ValueType}


def value_type_to_proto(value_type: ValueType) -> ProtoValueType:
    """The generated enum's member for ``value_type``."""
    return _PROTO_VALUE_TYPES[value_type]


def unknown_field_numbers(message: object) -> list[int]:
    """Numbers of the fields of ``message`` (not of its sub-messages) that its type does not define."""
    return [f.field_number for f in UnknownFieldSet(message)]


__all__ = [
    "GET_MODEL_METHOD",
    "HELLO_METHOD",
    "PEER_SERVICE_NAME",
    "GetModelRequest",
    "HelloReply",
    "HelloRequest",
    "LIST_PEERS_METHOD",
    "ListPeersReply",
    "ListPeersRequest",
    "PeerEntry",
    "ProtoModelChunk",
    "ProtoSparseTensor",
    "ProtoStreamHeader",
    "ProtoValueType",
    "unknown_field_numbers",
    "value_type_to_proto",
]
