"""Where every chunk goes and how many bytes it takes: shared by the encoder and the size count.

The layout of a stream depends only on the spec, each tensor's number of active values, the value
type and the message budget, never on where the active values are; so ``encoded_model_size`` can
count the exact serialized bytes from a mask's counts, and ``encode_model`` fills in this layout.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from edge_node.wire.spec import MIN_MAX_MESSAGE_BYTES, ModelSpec, ValueType


def _ceil_div(a: int, b: int) -> int:
    return -(a // -b)


def varint_size(value: int) -> int:
    """Bytes of a protobuf varint: a negative int64 or enum takes ten (two's complement, 64 bits)."""
    return 10 if value < 0 else max(1, (value.bit_length() + 6) // 7)


def _len_field(length: int) -> int:
    """A length-delimited field (tag < 16) of ``length`` bytes; proto3 omits it when empty."""
    return 0 if length == 0 else 1 + varint_size(length) + length


def _varint_field(value: int) -> int:
    """A varint field (tag < 16); proto3 omits it when zero."""
    return 0 if value == 0 else 1 + varint_size(value)


def packed_size(values: Sequence[int]) -> int:
    """Bytes of a packed repeated int64 field's payload (proto3 packs ``SparseTensor.shape``)."""
    return sum(varint_size(v) for v in values)


def tensor_entry_bytes(
    name_len: int,
    shape_len: int,
    value_type: int,
    bitmap_len: int,
    values_len: int,
    nnz: int,
    dense: bool,
    start: int,
    count: int,
    value_start: int,
    buffer: bool = False,
) -> int:
    """A SparseTensor's canonical bytes inside its ModelChunk (tag + length + message).

    The one formula for both sides: the encoder's layout, and the decoder's check that a message
    received is exactly its fields' canonical encoding (cheaper than protobuf's ``ByteSize``, which
    serializes the whole message again). ``shape_len``: the shape's ``packed_size``.
    """
    size = (
        _len_field(name_len)
        + _len_field(shape_len)
        + _varint_field(value_type)
        + _len_field(bitmap_len)
        + _len_field(values_len)
        + _varint_field(nnz)
        + (2 if dense else 0)
        + _varint_field(start)
        + _varint_field(count)
        + _varint_field(value_start)  # field 10: still a one-byte tag
        + (2 if buffer else 0)  # field 11 (1.3): a one-byte tag too
    )
    return 1 + varint_size(size) + size


@dataclass(frozen=True)
class ChunkPlan:
    """One SparseTensor chunk: an element range of the bitmap and a value-index range."""

    name: str
    start: int  # first element (flattened index) of the bitmap range
    count: int  # elements in the bitmap range
    value_start: int  # index of the first value among the tensor's active values
    nnz: int  # values in this chunk
    dense: bool
    entry_bytes: int  # the chunk's bytes inside its ModelChunk (tag + length + message)
    buffer: bool = False  # a running statistic (1.3), dense float32


@dataclass(frozen=True)
class StreamPlan:
    messages: tuple[tuple[ChunkPlan, ...], ...]

    @property
    def chunk_count(self) -> int:
        return sum(len(m) for m in self.messages)

    @property
    def payload_bytes(self) -> int:
        """Serialized bytes of all tensor-bearing messages (the header message excluded)."""
        return sum(c.entry_bytes for m in self.messages for c in m)


def _tensor_chunks(
    name: str, shape: tuple[int, ...], nnz: int, value_type: ValueType, budget: int, buffer: bool = False
) -> list[ChunkPlan]:
    """Chunks of one tensor: one if it fits in an (empty) message, else the fewest equal ranges that fit."""
    numel = math.prod(shape)
    dense = nnz == numel
    name_len, shape_len, itemsize = len(name.encode()), packed_size(shape), value_type.itemsize

    def entry_bytes(start: int, count: int, value_start: int, values: int) -> int:
        bitmap_len = 0 if dense else (count + 7) // 8
        return tensor_entry_bytes(
            name_len, shape_len, value_type, bitmap_len, values * itemsize, values, dense, start, count, value_start,
            buffer,
        )  # fmt: skip

    whole = entry_bytes(0, numel, 0, nnz)
    if whole <= budget:
        return [ChunkPlan(name, 0, numel, 0, nnz, dense, whole, buffer)]
    payload = (0 if dense else (numel + 7) // 8) + nnz * value_type.itemsize
    pieces = max(2, _ceil_div(payload, budget))
    while True:
        span = _ceil_div(_ceil_div(numel, pieces), 8) * 8  # ceil(numel / pieces), up to a multiple of 8
        n_chunks = _ceil_div(numel, span)
        per_chunk = span if dense else _ceil_div(nnz, n_chunks)
        chunks = []
        for k in range(n_chunks):
            start = k * span
            count = min(span, numel - start)
            value_start = min(k * per_chunk, nnz)
            values = min(per_chunk, nnz - value_start)
            size = entry_bytes(start, count, value_start, values)
            chunks.append(ChunkPlan(name, start, count, value_start, values, dense, size, buffer))
        if max(c.entry_bytes for c in chunks) <= budget:
            return chunks
        if span == 8:
            raise ValueError(f"max_message_bytes={budget} is too small to carry tensor {name!r}")
        pieces = max(pieces + 1, pieces * 9 // 8)


def plan_stream(
    spec: ModelSpec, nnz_per_tensor: Mapping[str, int], value_type: ValueType, max_message_bytes: int
) -> StreamPlan:
    """Chunks of every tensor in spec order, packed greedily into messages of at most the budget."""
    chunks = (
        chunk
        for name, shape in spec.shapes.items()
        for chunk in _tensor_chunks(name, shape, nnz_per_tensor[name], value_type, max_message_bytes)
    )
    return _packed(chunks, max_message_bytes)


def plan_buffers(spec: ModelSpec, max_message_bytes: int) -> StreamPlan:
    """The messages of ``spec.buffers`` (1.3), after the parameters' and never shared with them: every buffer
    dense float32, flagged, packed greedily like :func:`plan_stream`'s (none for a spec without buffers)."""
    chunks = (
        chunk
        for name, shape in spec.buffers.items()
        for chunk in _tensor_chunks(name, shape, math.prod(shape), ValueType.FLOAT32, max_message_bytes, True)
    )
    return _packed(chunks, max_message_bytes)


def _packed(chunks: Iterable[ChunkPlan], max_message_bytes: int) -> StreamPlan:
    """``chunks`` in order, packed greedily into messages of at most ``max_message_bytes`` of entries."""
    messages: list[tuple[ChunkPlan, ...]] = []
    current: list[ChunkPlan] = []
    used = 0
    for chunk in chunks:
        if current and used + chunk.entry_bytes > max_message_bytes:
            messages.append(tuple(current))
            current, used = [], 0
        current.append(chunk)
        used += chunk.entry_bytes
    if current:
        messages.append(tuple(current))
    return StreamPlan(tuple(messages))


def _max_header_bytes(arch_id: str, message_count: int, chunk_count: int) -> int:
    """Serialized bytes of the largest valid header message (longest ids, largest round)."""
    from edge_node.protocol import MAX_ROUND

    size = (
        _len_field(len("99999.99999"))  # protocol_version
        + _len_field(63)  # node_id: one DNS label
        + _len_field(63)  # fleet_id (protocol.FLEET_ID_PATTERN: one DNS label)
        + _len_field(len(arch_id.encode()))
        + _varint_field(MAX_ROUND)
        + 1 + 8  # density: a double
        + _len_field(32)  # payload_digest: SHA-256 in 1.0 and 1.1 streams, the longer one
        + _varint_field(message_count)
        + _varint_field(chunk_count)
    )  # fmt: skip
    header_entry = 1 + varint_size(size) + size  # the StreamHeader inside its ModelChunk
    return header_entry


@functools.lru_cache(maxsize=16)
def largest_stream(spec: ModelSpec, max_message_bytes: int = MIN_MAX_MESSAGE_BYTES) -> tuple[int, int]:
    """Bytes and chunk count of the largest stream ``encode_model`` can produce for ``spec``.

    Every tensor at its worst active count in fp32 (all but one element: a whole bitmap and almost
    dense values; or dense, whichever takes more), split at ``max_message_bytes`` (by default the
    smallest budget a sender may choose, where chunks carry the most overhead), with the longest header;
    and the spec's buffers, if it has any.
    """
    payload = chunks = 0
    for name, shape in spec.shapes.items():
        numel = math.prod(shape)
        candidates = [numel, numel - 1] if numel > 0 else [0]
        plans = [_tensor_chunks(name, shape, nnz, ValueType.FLOAT32, max_message_bytes) for nnz in candidates]
        payload += max(sum(c.entry_bytes for c in plan) for plan in plans)
        chunks += max(len(plan) for plan in plans)
    buffers = plan_buffers(spec, max_message_bytes)  # a spec's buffers (1.3), when it has any: dense float32
    payload += buffers.payload_bytes
    chunks += buffers.chunk_count
    return _max_header_bytes(spec.arch_id, chunks, chunks) + payload, chunks
