"""The wire format: masked sparse models <-> streams of protobuf messages (bitmap + values).

The only package that touches the generated ``edge_node.v1`` modules (through ``messages``).
"""

from edge_node.wire.codec import ModelDecoder, compile_decoder, decode_model, encode_model, encoded_model_size
from edge_node.wire.spec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    PROTOCOL_MAJOR,
    PROTOCOL_VERSION,
    DecodedModel,
    ModelSpec,
    StreamHeader,
    ValueType,
    WireLimits,
    parse_protocol_version,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "PROTOCOL_MAJOR",
    "PROTOCOL_VERSION",
    "DecodedModel",
    "ModelDecoder",
    "ModelSpec",
    "StreamHeader",
    "ValueType",
    "WireLimits",
    "compile_decoder",
    "decode_model",
    "encode_model",
    "encoded_model_size",
    "parse_protocol_version",
]
