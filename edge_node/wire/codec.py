"""Masked model <-> stream of protobuf messages (bitmap + values), and the exact size of that stream.

Encoding is vectorised (``numpy.packbits(..., bitorder="little")``, boolean indexing); decoding
validates every chunk as it arrives and the whole model at the end, so a bad stream raises
``WireDecodeError`` (or ``WireLimitError`` / ``HeaderMismatch``) naming the tensor and the problem,
having touched nothing of the caller's. A stream's first message (its header) is read by protobuf;
every later one by ``_parse``'s compiled walk, which accepts only the canonical encoding and says
where each chunk's bitmap and values lie, so they are read in the message as it arrived, never
copied. Each chunk, once checked against the stream, goes on to its
tensor's build (``_build``: values put in their places by the compiled loop of ``_expand``) on
builder threads while the next messages arrive; the model is handed over only when every check of
the whole stream has passed.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import torch
from google.protobuf.message import DecodeError

from edge_node.errors import HeaderMismatch, PeerIdentityMismatch, TierMismatch, WireDecodeError, WireLimitError
from edge_node.protocol import (
    NodeIdentity,
    check_fleet_id,
    check_node_id,
    check_round,
    parse_tier_mode,
    protocol_major,
)
from edge_node.wire import _parse
from edge_node.wire._build import Built, TensorBuild
from edge_node.wire._layout import ChunkPlan, StreamPlan, plan_buffers, plan_stream, varint_size
from edge_node.wire.messages import (
    ProtoModelChunk,
    ProtoSparseTensor,
    ProtoStreamHeader,
    unknown_field_numbers,
    value_type_to_proto,
)
from edge_node.wire.spec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MIN_MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    DecodedModel,
    ModelSpec,
    PayloadHasher,
    StreamHeader,
    ValueType,
    WireLimits,
    numpy_value_dtype,
    payload_hasher,
)


def _check_header_args(node_id: str, fleet_id: str, round: int, density: float, max_message_bytes: int) -> float:
    """The header's values by their one rule (``NodeIdentity.check``); returns the density as a float."""
    identity = NodeIdentity(node_id=node_id, fleet_id=fleet_id, round=round, density=density).check()
    if identity.node_id is None or identity.fleet_id is None or identity.round is None or identity.density is None:
        raise ValueError(f"a stream header needs a node id, fleet id, round and density, got {identity}")
    if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int):
        raise TypeError(f"max_message_bytes={max_message_bytes!r} must be an integer")
    if max_message_bytes < MIN_MAX_MESSAGE_BYTES:
        raise ValueError(f"max_message_bytes={max_message_bytes} must be at least {MIN_MAX_MESSAGE_BYTES}")
    return identity.density


def _header_proto(
    spec: ModelSpec, tier: str | None, node_id: str, fleet_id: str, round: int, density: float, digest: bytes,
    plan: StreamPlan,
) -> ProtoStreamHeader:  # fmt: skip
    header = ProtoStreamHeader(
        protocol_version=PROTOCOL_VERSION,
        node_id=node_id,
        fleet_id=fleet_id,
        arch_id=spec.arch_id,
        round=round,
        density=density,
        payload_digest=digest,
        message_count=len(plan.messages),
        chunk_count=plan.chunk_count,
    )
    if spec.tier_mode != "mask":  # 1.5, width tiers: the mode and tier say the tensors' shapes (mask: unset, as 1.4)
        assert tier is not None  # spec.shapes_of(tier) accepted it
        header.tier_mode, header.tier = spec.tier_mode, tier
    return header


def _planned(spec: ModelSpec, tier: str | None) -> ModelSpec:
    """The spec a stream of ``tier`` is laid out by: ``spec`` itself, or under width tiers one of the tier's narrow
    shapes (its id is not sent: the header carries ``spec``'s)."""
    shapes = spec.shapes_of(tier)
    return spec if shapes is spec.shapes else ModelSpec(spec.arch_name, spec.num_classes, shapes)


def _header_message_bytes(header: ProtoStreamHeader) -> int:
    size = header.ByteSize()
    return 1 + varint_size(size) + size


def encoded_model_size(
    spec: ModelSpec,
    nnz_per_tensor: Mapping[str, int],
    value_type: ValueType = ValueType.FLOAT32,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    dense_tensors: set[str] | None = None,
    *,
    node_id: str = "node",
    fleet_id: str = "fleet",
    round: int = 0,
    density: float = 1.0,
    buffers: bool = False,
    tier: str | None = None,
) -> int:
    """Exact serialized bytes of the stream ``encode_model`` produces, without encoding anything.

    Args:
        nnz_per_tensor: active elements of every tensor (``int(mask.sum())``); a tensor whose count
            equals its numel is sent dense, as ``encode_model`` does.
        dense_tensors: tensors sent without a mask (no entry needed in ``nnz_per_tensor``).
        node_id, fleet_id, round, density: the header's fields; they change its size by a few bytes,
            so pass the ones ``encode_model`` gets for an exact count.
        buffers: the stream carries ``spec.buffers`` too (``encode_model`` given them: 1.3, ``norm_stats average``).
        tier: under width tiers (``spec.tier_mode`` width or both), the sender's tier: its tensors' narrow shapes
            (``spec.shapes_of``), whose element counts bound ``nnz_per_tensor``.

    Returns:
        The sum over all messages (header included) of their serialized size, i.e. of
        ``len(msg.SerializeToString())``: the gRPC payload bytes, not counting gRPC/HTTP2 framing.
    """
    value_type = ValueType.parse(value_type)
    density = _check_header_args(node_id, fleet_id, round, density, max_message_bytes)
    dense_tensors = set(dense_tensors or ())
    unknown = (set(nnz_per_tensor) | dense_tensors) - set(spec.shapes)
    if unknown:
        raise ValueError(f"tensors {sorted(unknown)} are not in the model spec {spec.arch_id}")
    planned = _planned(spec, tier)
    counts: dict[str, int] = {}
    for name in spec.shapes:
        numel = planned.numel(name)
        if name in dense_tensors:
            counts[name] = numel
            continue
        if name not in nnz_per_tensor:
            raise ValueError(f"nnz_per_tensor has no count for tensor {name!r} (and it is not in dense_tensors)")
        nnz = int(nnz_per_tensor[name])
        if not 0 <= nnz <= numel:
            raise ValueError(f"nnz_per_tensor[{name!r}]={nnz} must be in [0, {numel}]")
        counts[name] = nnz
    plan = plan_stream(planned, counts, value_type, max_message_bytes)
    if buffers:
        plan = StreamPlan(plan.messages + plan_buffers(spec, max_message_bytes).messages)
    digest_size = payload_hasher(PROTOCOL_VERSION).digest_size
    header = _header_proto(spec, tier, node_id, fleet_id, round, density, bytes(digest_size), plan)
    return _header_message_bytes(header) + plan.payload_bytes


@dataclass
class _EncodedTensor:
    bitmap: bytes  # whole tensor, empty when dense
    values: bytes  # whole tensor's active values, little-endian


def _encode_tensor(name: str, weight: torch.Tensor, mask: torch.Tensor | None, value_type: ValueType) -> _EncodedTensor:
    flat = weight.detach().to(device="cpu", dtype=torch.float32).reshape(-1).numpy()
    bitmap = b""
    if mask is not None:
        flat_mask = mask.detach().to("cpu").reshape(-1).numpy()
        if not flat_mask.all():
            bitmap = np.packbits(flat_mask, bitorder="little").tobytes()
            flat = flat[flat_mask]
    if value_type is ValueType.BFLOAT16:
        cast = torch.from_numpy(flat).to(torch.bfloat16)
        finite = bool(torch.isfinite(cast).all())
        raw = cast.view(torch.int16).numpy().astype("<u2", copy=False)
    else:
        with np.errstate(over="ignore"):  # float16 overflow becomes inf, refused just below
            raw = flat.astype(numpy_value_dtype(value_type), copy=False)
        finite = bool(np.isfinite(raw).all())
    if not finite:
        raise ValueError(
            f"tensor {name!r}: active values are NaN or Inf (or overflow {value_type.name.lower()});"
            " a model with non-finite weights is never sent"
        )
    return _EncodedTensor(bitmap, raw.tobytes())


def _check_model_args(spec: ModelSpec, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> None:
    missing = [n for n in spec.shapes if n not in weights]
    extra = [n for n in weights if n not in spec.shapes]
    if missing or extra:
        raise ValueError(f"weights do not match spec {spec.arch_id}: missing {missing}, unknown {extra}")
    unknown_masks = [n for n in masks if n not in spec.shapes]
    if unknown_masks:
        raise ValueError(f"masks name tensors that are not in spec {spec.arch_id}: {unknown_masks}")
    for name, shape in spec.shapes.items():
        weight = weights[name]
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
            raise TypeError(f"weights[{name!r}] must be a floating-point tensor, got {type(weight).__name__}")
        if tuple(weight.shape) != shape:
            raise ValueError(f"weights[{name!r}] has shape {tuple(weight.shape)}, spec says {shape}")
        if name in masks:
            mask = masks[name]
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                raise TypeError(f"masks[{name!r}] must be a bool tensor, got {getattr(mask, 'dtype', type(mask))}")
            if tuple(mask.shape) != shape:
                raise ValueError(f"masks[{name!r}] has shape {tuple(mask.shape)}, spec says {shape}")


def sparse_to_proto(
    name: str, shape: tuple[int, ...], value_type: ValueType, chunk: ChunkPlan, encoded: _EncodedTensor
) -> ProtoSparseTensor:
    """One chunk of an encoded tensor as a ``SparseTensor`` message (the layout says which bytes)."""
    message = ProtoSparseTensor(name=name, shape=shape, value_type=value_type_to_proto(value_type), dense=chunk.dense)
    if chunk.buffer:
        message.buffer = True
    message.start, message.count = chunk.start, chunk.count
    message.value_start, message.nnz = chunk.value_start, chunk.nnz
    if not chunk.dense:
        first = chunk.start // 8
        message.bitmap = encoded.bitmap[first : first + (chunk.count + 7) // 8]
    size = value_type.itemsize
    message.values = encoded.values[chunk.value_start * size : (chunk.value_start + chunk.nnz) * size]
    return message


def encode_model(
    spec: ModelSpec,
    weights: Mapping[str, torch.Tensor],
    masks: Mapping[str, torch.Tensor],
    *,
    node_id: str,
    fleet_id: str,
    round: int,
    density: float,
    value_type: ValueType = ValueType.FLOAT32,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    buffers: Mapping[str, torch.Tensor] | None = None,
    tier: str | None = None,
) -> list[ProtoModelChunk]:
    """Encode a masked model as the messages of one stream: the header, then the tensors in spec order.

    Only active elements travel (``weights[name][masks[name]]``); a tensor without a mask, or whose
    mask is all true, is sent dense without a bitmap. No message serializes to more than
    ``max_message_bytes``. Nothing of the caller's is modified. ``buffers`` (1.3, ``norm_stats average``;
    exactly ``spec.buffers``' names and shapes, or empty: none yet): the running statistics, after the
    parameters in messages of their own, dense float32 whatever ``value_type`` (``num_batches_tracked``
    as its float32 value); :func:`without_buffers` makes the stream of a caller that did not ask for them.
    ``tier`` (width tiers, ``spec.tier_mode`` width or both): the sender's tier; ``weights`` and ``masks`` keep
    the full shapes, and only the tier's prefix travels (``spec.shapes_of(tier)``), so nothing may be active
    outside it. ``density`` is, in every mode, the fraction of the full model's weights the masks keep.

    Raises:
        ValueError / TypeError: names, shapes or dtypes disagree with ``spec``, a header field is
            invalid, ``density`` is not the masks' (within ``spec.density_tolerance``), or an active
            value is NaN/Inf (or overflows the chosen value type).
    """
    value_type = ValueType.parse(value_type)
    density = _check_header_args(node_id, fleet_id, round, density, max_message_bytes)
    _check_model_args(spec, weights, masks)
    planned = _planned(spec, tier)
    if planned is not spec:
        weights, masks = _prefixes(planned, weights, masks)
    encoded = {name: _encode_tensor(name, weights[name], masks.get(name), value_type) for name in spec.shapes}
    if buffers:
        _check_buffer_args(spec, buffers)
        for name in spec.buffers:
            encoded[name] = _encode_tensor(name, buffers[name].to(torch.float32), None, ValueType.FLOAT32)
    nnz = {
        name: (planned.numel(name) if not enc.bitmap else len(enc.values) // value_type.itemsize)
        for name, enc in encoded.items()
        if name in spec.shapes
    }
    total = spec.total_numel
    kept = sum(nnz.values()) / total if total else 0.0
    if total and abs(density - kept) > spec.density_tolerance:
        raise ValueError(
            f"density={density!r} but the masks keep {kept:.6f} of the weights: the header's density is the"
            f" masks' (within {spec.density_tolerance:.2g}, ERK's rounding), receivers refuse any other"
        )
    plan = plan_stream(planned, nnz, value_type, max_message_bytes)
    if buffers:
        plan = StreamPlan(plan.messages + plan_buffers(spec, max_message_bytes).messages)
    digest = payload_hasher(PROTOCOL_VERSION)
    messages: list[ProtoModelChunk] = []
    for in_message in plan.messages:
        tensors = []
        for chunk in in_message:
            shape, kind = (spec.buffers, ValueType.FLOAT32) if chunk.buffer else (planned.shapes, value_type)
            tensor = sparse_to_proto(chunk.name, shape[chunk.name], kind, chunk, encoded[chunk.name])
            digest.update(tensor.bitmap)
            digest.update(tensor.values)
            tensors.append(tensor)
        messages.append(ProtoModelChunk(tensors=tensors))
    header = _header_proto(spec, tier, node_id, fleet_id, round, density, digest.digest(), plan)
    return [ProtoModelChunk(header=header), *messages]


def _prefixes(
    planned: ModelSpec, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The tier's prefix of every tensor (width tiers); ValueError when anything active lies outside it, which
    the stream could not carry."""
    narrow_weights, narrow_masks = {}, {}
    for name, shape in planned.shapes.items():
        index = tuple(slice(0, n) for n in shape)
        weight, mask = weights[name], masks.get(name)
        held = mask if mask is not None else weight != 0
        outside = int(held.sum()) - int(held[index].sum())
        if outside:
            raise ValueError(f"tensor {name!r}: {outside} active weights lie outside the tier's prefix {shape}")
        narrow_weights[name] = weight[index]
        if mask is not None:
            narrow_masks[name] = mask[index]
    return narrow_weights, narrow_masks


def _check_buffer_args(spec: ModelSpec, buffers: Mapping[str, torch.Tensor]) -> None:
    if list(buffers) != list(spec.buffers):
        raise ValueError(f"buffers {list(buffers)[:8]} are not spec {spec.arch_id}'s {list(spec.buffers)[:8]}")
    for name, shape in spec.buffers.items():
        buffer = buffers[name]
        if not isinstance(buffer, torch.Tensor) or tuple(buffer.shape) != shape:
            raise ValueError(f"buffers[{name!r}] has shape {tuple(getattr(buffer, 'shape', ()))}, spec says {shape}")


def without_buffers(messages: Sequence[ProtoModelChunk]) -> list[ProtoModelChunk]:
    """``encode_model``'s stream ``messages`` without its buffers' messages (for a caller that did not ask for
    them, or of 1.2), its header's counts and digest (in the header's version) made for what is left."""
    kept = [m for m in messages[1:] if not (m.tensors and m.tensors[0].buffer)]
    if len(kept) == len(messages) - 1:
        return list(messages)
    header = ProtoModelChunk()
    header.CopyFrom(messages[0])
    digest = payload_hasher(header.header.protocol_version)
    for message in kept:
        for tensor in message.tensors:
            digest.update(tensor.bitmap)
            digest.update(tensor.values)
    header.header.payload_digest = digest.digest()
    header.header.message_count = len(kept)
    header.header.chunk_count = sum(len(m.tensors) for m in kept)
    return [header, *kept]


def header_for_version(messages: list[ProtoModelChunk], protocol_version: str) -> ProtoModelChunk:
    """The header of ``encode_model``'s stream ``messages`` as a caller of ``protocol_version`` expects it.

    Servers answer in the caller's version: a 1.0 or 1.1 caller checks a SHA-256 payload digest, so it
    gets the header with that version and digest; the tensor messages are the same in every version.
    """
    header = ProtoModelChunk()
    header.CopyFrom(messages[0])
    digest = payload_hasher(protocol_version)
    for message in messages[1:]:
        for tensor in message.tensors:
            digest.update(tensor.bitmap)
            digest.update(tensor.values)
    header.header.protocol_version = protocol_version
    header.header.payload_digest = digest.digest()
    return header


@dataclass
class _TensorState:
    """What has arrived of one tensor so far; its chunks go on to its build as they arrive."""

    build: TensorBuild
    next_element: int = 0
    next_value: int = 0

    @property
    def numel(self) -> int:
        return self.build.numel

    @property
    def dense(self) -> bool:
        return self.build.dense

    @property
    def complete(self) -> bool:
        return self.next_element == self.numel


def _check_known_fields(index: int, chunk: ProtoModelChunk) -> None:
    """Refuse fields this protocol version does not define in a header message (padding)."""
    found = unknown_field_numbers(chunk)
    where = f"message {index}"
    if not found and chunk.HasField("header"):
        found, where = unknown_field_numbers(chunk.header), f"message {index}, header"
    if found:
        raise WireDecodeError(f"{where}: unknown field number(s) {found[:8]} (not in protocol {PROTOCOL_VERSION})")


def _quoted_name(raw: bytes, row: Sequence[int]) -> str:
    """A chunk's name as it arrived, for an error (undecodable bytes replaced)."""
    at, length = row[_parse.NAME_AT], row[_parse.NAME_LEN]
    return repr(raw[at : at + min(length, 300)].decode("utf-8", "replace"))


class ModelDecoder:
    """Validates a model stream message by message, then builds the model in ``finish``.

    ``feed`` refuses a message as soon as it breaks a rule or a limit (by default
    ``WireLimits.for_spec(spec)``: about the largest valid stream of the model), so a caller reading
    from the network can stop (and cancel the call) without receiving the rest; ``complete`` says when
    every message the header announced has arrived, so the caller need not wait for the sender to end
    the stream. The rules, beyond each chunk's own consistency: no unknown or repeated fields (a message's
    bytes are exactly its fields' canonical encoding); tensors in the spec's order, the chunks of one
    tensor contiguous and in order; one value type per stream; a header whose node id, round and
    density are valid (and, when given, the expected node id and round), its density within
    ``spec.density_tolerance`` of the masks that arrived. Width tiers (protocol 1.5): the header's tier mode
    is the spec's, and every tensor has exactly the narrow shape the header's tier gives
    (``spec.shapes_of``); ``finish`` hands the model over in the full shapes, zero and inactive outside the
    prefixes.
    """

    def __init__(
        self,
        spec: ModelSpec,
        expected_fleet: str,
        limits: WireLimits | None = None,
        *,
        expected_node_id: str | None = None,
        expected_round: int | None = None,
    ) -> None:
        self.spec = spec
        self.expected_fleet = check_fleet_id(expected_fleet, "expected_fleet")
        self.expected_node_id = None if expected_node_id is None else check_node_id(expected_node_id)
        self.expected_round = None if expected_round is None else check_round(expected_round)
        self.limits = limits or WireLimits.for_spec(spec)
        self.header: StreamHeader | None = None
        self.messages = 0
        self.chunks = 0
        self.total_bytes = 0
        self.value_type: ValueType | None = None  # of the stream's first chunk; every chunk must have it
        self._names = spec.names + tuple(spec.buffers)  # the buffers (1.3) after the parameters, when sent
        self._names_by_bytes = {name.encode(): name for name in self._names}
        self._buffer_names = frozenset(spec.buffers)
        self._rows = np.empty((0, _parse.COLUMNS), dtype=np.int64)  # one per chunk the header announces
        self._next_tensor = 0  # index into the spec's names of the next tensor to start
        self._current: _TensorState | None = None
        self._tensors: dict[str, _TensorState] = {}
        self._building: collections.deque[Future[Built]] = collections.deque()  # each tensor's, in order
        self._digest: PayloadHasher | None = None  # the header's version says which, once it arrives
        self._abandoned = False
        self._shapes = spec.shapes  # the tensors' shapes in this stream: under width tiers, its header's tier's

    @property
    def complete(self) -> bool:
        """Every message the header announced has arrived (``finish`` still checks the whole)."""
        return self.header is not None and self.messages - 1 >= self.header.message_count

    def feed(self, message: ProtoModelChunk | bytes) -> None:
        """Check and keep one message (a ``ModelChunk`` or its serialized bytes).

        A refused message abandons the stream (``abandon``): its queued builds are dropped.
        """
        self._check_live()
        try:
            self._feed(message)
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Give the stream up: the chunks its tensors have queued are not built (a refused stream, a
        call that failed or was cancelled part-way); ``feed`` and ``finish`` then refuse. Idempotent."""
        self._abandoned = True
        for state in self._tensors.values():
            state.build.cancel()

    def _check_live(self) -> None:
        if self._abandoned:
            raise WireDecodeError("stream was abandoned (refused or ended part-way)")

    def _feed(self, message: ProtoModelChunk | bytes) -> None:
        index = self.messages
        if isinstance(message, ProtoModelChunk):  # checked as the bytes a peer would have sent
            message = message.SerializeToString()
        raw = bytes(message)
        self._check_sizes(index, len(raw))
        self.messages += 1
        if self.header is None:
            self.header = self._take_header(index, raw)
            self._rows = np.empty((self.header.chunk_count, _parse.COLUMNS), dtype=np.int64)
            return
        if index > self.header.message_count:
            raise WireDecodeError(f"stream goes on past the {self.header.message_count} messages its header announced")
        rows = self._rows[self.chunks :]  # a chunk beyond the header's count has no row: refused
        entries, code, detail, where, in_entry = _parse.parse(np.frombuffer(raw, dtype=np.uint8), rows)
        if code != _parse.OK:
            self._refuse_parse(index, raw, code, detail, where, rows[entries] if in_entry else None)
        if not entries:
            raise WireDecodeError(f"message {index} carries no tensors")
        view = memoryview(raw)
        for row in rows[:entries].tolist():  # at most the header's chunk count, itself within the limit
            self.chunks += 1
            self._take_chunk(index, raw, view, row)
        while self._building and self._building[0].done():  # a tensor refused by its build stops the stream
            self._building.popleft().result()

    def _take_header(self, index: int, raw: bytes) -> StreamHeader:
        """The stream's first message: a header and nothing else, its fields' canonical encoding."""
        try:
            model_chunk = ProtoModelChunk.FromString(raw)
        except DecodeError as exc:
            raise WireDecodeError(f"message {index} is not a valid ModelChunk: {exc}") from exc
        _check_known_fields(index, model_chunk)
        if model_chunk.ByteSize() != len(raw):
            raise WireDecodeError(
                f"message {index} is {len(raw)} bytes but its fields encode in {model_chunk.ByteSize()}:"
                " repeated or non-canonically encoded fields are refused"
            )
        if not model_chunk.HasField("header") or len(model_chunk.tensors):
            raise WireDecodeError("stream does not start with a header-only message")
        return self._check_header(model_chunk.header)

    def _refuse_parse(
        self, index: int, raw: bytes, code: int, detail: int, where: int, row: Sequence[int] | None
    ) -> NoReturn:
        """Raise what ``_parse.parse`` found wrong with message ``index`` (``row``: the entry it broke in)."""
        assert self.header is not None
        if code == _parse.HEADER:
            raise WireDecodeError(f"message {index} carries a second header")
        if code == _parse.ENTRIES_OVER:
            raise WireDecodeError(f"stream has more than the {self.header.chunk_count} chunks its header announced")
        place = f"message {index}"
        if row is not None and row[_parse.NAME_LEN]:
            place += f", tensor {_quoted_name(raw, row)}"
        if code == _parse.UNKNOWN:
            raise WireDecodeError(f"{place}: unknown field number(s) [{detail}] (not in protocol {PROTOCOL_VERSION})")
        words, non_canonical = _parse.parse_error(code, detail, where)
        if non_canonical:
            raise WireDecodeError(
                f"{place} is not its fields' canonical encoding: {words}:"
                " repeated or non-canonically encoded fields are refused"
            )
        raise WireDecodeError(f"{place} is not a valid ModelChunk: {words}")

    def _check_sizes(self, index: int, size: int) -> None:
        if size > self.limits.max_message_bytes:
            raise WireLimitError(f"message {index} is {size} bytes, over the limit of {self.limits.max_message_bytes}")
        if self.total_bytes + size > self.limits.max_total_bytes:
            raise WireLimitError(f"stream exceeds the limit of {self.limits.max_total_bytes} bytes at message {index}")
        self.total_bytes += size

    def _check_header(self, proto: ProtoStreamHeader) -> StreamHeader:
        identity = NodeIdentity(
            protocol_version=proto.protocol_version, node_id=proto.node_id, fleet_id=proto.fleet_id,
            arch_id=proto.arch_id, round=proto.round, density=proto.density, tier=proto.tier or None,
        )  # fmt: skip
        try:
            compatible = identity.compatible()
        except ValueError as exc:
            raise HeaderMismatch(f"header: {exc}") from exc
        if not compatible:
            raise HeaderMismatch(
                f"header: protocol version {proto.protocol_version[:32]!r} has major"
                f" {protocol_major(proto.protocol_version)}, this node speaks {PROTOCOL_VERSION}"
            )
        if proto.fleet_id != self.expected_fleet:
            raise HeaderMismatch(
                f"header: stream is from fleet {proto.fleet_id[:256]!r}, expected {self.expected_fleet!r}"
            )
        if proto.arch_id != self.spec.arch_id:
            raise HeaderMismatch(
                f"header: architecture {proto.arch_id[:256]!r} is not this model's {self.spec.arch_id!r}"
            )
        try:
            identity = identity.check()
        except ValueError as exc:
            raise HeaderMismatch(f"header: {exc}") from exc
        if self.expected_node_id is not None and proto.node_id != self.expected_node_id:
            raise PeerIdentityMismatch(
                f"header: stream is from node {proto.node_id!r}, but it was pulled from {self.expected_node_id!r}"
            )
        if self.expected_round is not None and proto.round != self.expected_round:
            raise HeaderMismatch(f"header: stream is of round {proto.round}, round {self.expected_round} was asked for")
        self._shapes = self._tier_shapes(proto)
        digest = payload_hasher(proto.protocol_version)
        if len(proto.payload_digest) != digest.digest_size:
            raise HeaderMismatch(
                f"header: payload digest has {len(proto.payload_digest)} bytes, protocol"
                f" {proto.protocol_version} has {digest.digest_size} ({digest.name.lower()})"
            )
        if proto.chunk_count > self.limits.max_chunks:
            raise WireLimitError(
                f"header announces {proto.chunk_count} chunks, over the limit of {self.limits.max_chunks}"
            )
        if proto.message_count < 1 or proto.chunk_count < len(self.spec.shapes):
            raise HeaderMismatch(
                f"header announces {proto.message_count} messages and {proto.chunk_count} chunks,"
                f" too few for the model's {len(self.spec.shapes)} tensors"
            )
        if proto.message_count > proto.chunk_count:
            raise HeaderMismatch(
                f"header announces {proto.message_count} messages but only {proto.chunk_count} chunks to fill them"
            )
        self._digest = digest
        return StreamHeader(
            identity=identity,
            payload_digest=proto.payload_digest,
            message_count=proto.message_count,
            chunk_count=proto.chunk_count,
        )

    def _tier_shapes(self, proto: ProtoStreamHeader) -> Mapping[str, tuple[int, ...]]:
        """The shapes the header's tier mode and tier give the stream's tensors (TierMismatch: another mode than
        this node's, a mode it does not know, or a tier it has no shapes of)."""
        try:
            mode = parse_tier_mode(proto.tier_mode)
        except ValueError as exc:
            raise TierMismatch(f"header: {exc}") from None
        if mode != self.spec.tier_mode:
            sent = f"tier mode {mode}" + ("" if proto.tier_mode else " (its header names none)")
            raise TierMismatch(f"header: stream is of {sent}, this node runs tier mode {self.spec.tier_mode}: a fleet "
                               "runs one tier mode")  # fmt: skip
        if mode == "mask":
            if proto.tier:
                raise TierMismatch(f"header: tier {proto.tier[:16]!r} in a stream of tier mode mask")
            return self.spec.shapes
        try:
            return self.spec.shapes_of(proto.tier)
        except ValueError as exc:
            raise TierMismatch(f"header: {exc}") from None

    def _start_tensor(self, where: str, name: str, dense: bool) -> _TensorState:
        """A chunk of a tensor not seen yet: it must be the spec's next one, after the previous is complete."""
        current = self._current
        if current is not None and not current.complete:
            previous = self._names[self._next_tensor - 1]
            raise WireDecodeError(
                f"{where}: starts while tensor {previous!r} has {current.next_element} of its {current.numel}"
                " elements (the chunks of a tensor must be contiguous)"
            )
        expected = self._names[self._next_tensor] if self._next_tensor < len(self._names) else None
        if name != expected:
            raise WireDecodeError(
                f"{where}: out of order, expected tensor {expected!r} (tensors come in the model's order)"
            )
        self._next_tensor += 1
        assert self.value_type is not None  # set by the stream's first chunk, before its tensor starts
        if name in self._buffer_names:  # a running statistic: dense float32 (the chunk was checked)
            build = TensorBuild(name, self.spec.buffers[name], True, ValueType.FLOAT32)
        else:
            build = TensorBuild(name, self._shapes[name], dense, self.value_type)
        self._building.append(build.future)
        state = self._current = self._tensors[name] = _TensorState(build)
        return state

    def _take_chunk(self, index: int, raw: bytes, view: memoryview, row: list[int]) -> None:
        """Check one chunk (``row``: what ``_parse.parse`` read of it from ``raw``) against the stream so
        far, and hand its bitmap and values (views of the message) to its tensor's build."""
        (name_at, name_len, type_number, bitmap_at, bitmap_len, values_at, values_len) = row[: _parse.NNZ]
        nnz, dense, start, count, value_start, dims = row[_parse.NNZ : _parse.SHAPE]
        flagged = bool(row[_parse.BUFFER])
        if flagged and not self._buffer_names:
            raise WireDecodeError(
                f"message {index}, tensor {_quoted_name(raw, row)}: a buffer (running statistic) this node did not"
                " ask for (it keeps its own: norm_stats local, or a model without buffers)"
            )
        name = self._names_by_bytes.get(raw[name_at : name_at + name_len])
        if name is None:
            raise WireDecodeError(
                f"message {index}, tensor {_quoted_name(raw, row)}: unknown tensor name (not in {self.spec.arch_id})"
            )
        where = f"message {index}, tensor {name!r}"
        is_buffer = name in self._buffer_names
        if flagged != is_buffer:
            kind = "a buffer" if is_buffer else "a parameter"
            raise WireDecodeError(f"{where}: is {kind} of the model, but its buffer flag is {flagged}")
        shape = (self.spec.buffers if is_buffer else self._shapes)[name]
        if dims != len(shape) or tuple(row[_parse.SHAPE : _parse.SHAPE + dims]) != shape:
            sent = tuple(row[_parse.SHAPE : _parse.SHAPE + dims])
            if self._shapes is not self.spec.shapes:  # width tiers: not the prefix its header's tier gives
                raise TierMismatch(f"{where}: shape {sent} is not the prefix {shape} of tier {self._tier_text()}")
            raise WireDecodeError(f"{where}: shape {sent} does not match the model's {shape}")
        try:
            value_type = ValueType(type_number)
        except ValueError:
            raise WireDecodeError(f"{where}: unknown value type {type_number}") from None
        if is_buffer:
            if value_type is not ValueType.FLOAT32 or not dense:
                raise WireDecodeError(f"{where}: a buffer travels dense in FLOAT32, not {value_type.name}")
        elif self.value_type is None:
            self.value_type = value_type
        elif value_type is not self.value_type:
            raise WireDecodeError(
                f"{where}: value type {value_type.name} in a stream of {self.value_type.name}"
                " (one value type per stream)"
            )
        numel = math.prod(shape)
        dense = bool(dense)
        state = self._tensors.get(name)
        if state is None:
            state = self._start_tensor(where, name, dense)
        elif state.complete:
            raise WireDecodeError(f"{where}: tensor sent twice")
        if dense != state.dense:
            raise WireDecodeError(f"{where}: dense flag changes between chunks of one tensor")
        if start != state.next_element:
            raise WireDecodeError(
                f"{where}: chunk starts at element {start}, expected {state.next_element}"
                " (chunks must be contiguous and in order)"
            )
        end = start + count
        if end > numel or (count == 0 and numel > 0):
            raise WireDecodeError(f"{where}: chunk range [{start}, {end}) is empty or beyond numel {numel}")
        if end < numel and count % 8:
            raise WireDecodeError(f"{where}: a chunk that is not the tensor's last must cover a multiple of 8 elements")
        if dense:
            if bitmap_len:
                raise WireDecodeError(f"{where}: a dense chunk carries a bitmap")
            if value_start != start or nnz != count:
                raise WireDecodeError(
                    f"{where}: dense chunk of elements [{start}, {end}) declares values"
                    f" [{value_start}, {value_start + nnz})"
                )
        elif bitmap_len != (count + 7) // 8:
            raise WireDecodeError(
                f"{where}: bitmap has {bitmap_len} bytes, expected {(count + 7) // 8}"
                f" for {count} elements (truncated or padded bitmap)"
            )
        if value_start != state.next_value:
            raise WireDecodeError(f"{where}: values start at index {value_start}, expected {state.next_value}")
        if state.next_value + nnz > numel:
            raise WireDecodeError(f"{where}: {state.next_value + nnz} values for a tensor of {numel} elements")
        if values_len != nnz * value_type.itemsize:
            raise WireDecodeError(
                f"{where}: nnz={nnz} but {values_len} value bytes arrived"
                f" (expected {nnz * value_type.itemsize} for {value_type.name})"
            )
        bitmap = view[bitmap_at : bitmap_at + bitmap_len]
        values = view[values_at : values_at + values_len]
        assert self._digest is not None  # set with the header
        self._digest.update(bitmap)
        self._digest.update(values)
        state.build.add(bitmap, values, count)
        state.next_element = end
        state.next_value += nnz

    def finish(self) -> DecodedModel:
        """Check the stream is complete and consistent, then build float32 weights and bool masks.

        A refusal abandons the stream (the other tensors' builds are dropped).
        """
        self._check_live()
        try:
            return self._finish()
        except BaseException:
            self.abandon()
            raise

    def _finish(self) -> DecodedModel:
        header = self.header
        if header is None:
            raise WireDecodeError("stream ended before its header")
        if self.messages - 1 != header.message_count:
            raise WireDecodeError(
                f"stream ended after {self.messages - 1} of the {header.message_count} tensor messages"
                " its header announced"
            )
        if self.chunks != header.chunk_count:
            raise WireDecodeError(f"stream has {self.chunks} chunks, its header announced {header.chunk_count}")
        for waiting in reversed(self._tensors.values()):  # the builders work from the first: help from the last
            waiting.build.build_here()
            if waiting.build.future.done() and waiting.build.future.exception() is not None:
                break  # refused: raised below, and the stream abandoned
        weights: dict[str, torch.Tensor] = {}
        masks: dict[str, torch.Tensor] = {}
        active = 0
        for name, shape in self._shapes.items():
            numel = math.prod(shape)
            state = self._tensors.get(name)
            if state is None:
                raise WireDecodeError(f"tensor {name!r} is missing from the stream")
            if state.next_element != numel:
                raise WireDecodeError(
                    f"tensor {name!r} is incomplete: {state.next_element} of {numel} elements arrived"
                )
            weights[name], masks[name] = state.build.future.result()  # raises the tensor's refusal, if any
            active += state.next_value
        buffers = self._finish_buffers()
        assert self._digest is not None  # set with the header
        digest = self._digest.digest()
        if digest != header.payload_digest:
            raise WireDecodeError(
                f"payload digest {self._digest.name.lower()}:{digest.hex()} does not match the header's"
                f" {header.payload_digest_text}"
            )
        total = self.spec.total_numel
        kept = active / total if total else 0.0
        density = header.identity.density
        assert density is not None  # checked with the header
        if total and abs(density - kept) > self.spec.density_tolerance:
            raise HeaderMismatch(
                f"header: density {density!r}, but the masks keep {kept:.6f} of the weights"
                f" (tolerance {self.spec.density_tolerance:.2g})"
            )
        assert self.value_type is not None
        if self._shapes is not self.spec.shapes:  # width tiers: the prefixes in the full shapes, inactive elsewhere
            weights, masks = _widened(self.spec, weights, masks)
        return DecodedModel(header, weights, masks, self.value_type, self.total_bytes, buffers)

    def _tier_text(self) -> str:
        assert self.header is not None
        return repr(self.header.identity.tier)

    def _finish_buffers(self) -> dict[str, torch.Tensor]:
        """The running statistics that arrived (all of the spec's, or none: a sender that keeps its own), each
        checked: finite (by its build), a ``running_var`` never negative, a ``num_batches_tracked`` a whole
        number >= 0 (handed over as int64, the others float32)."""
        arrived = [name for name in self.spec.buffers if name in self._tensors]
        if not arrived:
            return {}
        missing = [name for name in self.spec.buffers if name not in self._tensors]
        if missing:
            raise WireDecodeError(
                f"buffer {missing[0]!r} is missing from the stream"
                " (a stream carries all of the model's buffers or none)"
            )
        buffers: dict[str, torch.Tensor] = {}
        for name in arrived:
            state = self._tensors[name]
            if not state.complete:
                raise WireDecodeError(f"buffer {name!r} is incomplete: {state.next_element} of {state.numel} elements")
            value = state.build.future.result()[0]
            leaf = name.rpartition(".")[2]
            if leaf == "running_var" and bool((value < 0).any()):
                raise WireDecodeError(f"buffer {name!r}: {int((value < 0).sum())} variances are negative")
            if leaf == "num_batches_tracked":
                if bool((value < 0).any()) or not bool(torch.equal(value, value.round())):
                    raise WireDecodeError(f"buffer {name!r}: {value.flatten()[:4].tolist()} is not a count >= 0")
                value = value.to(torch.int64)
            buffers[name] = value
        return buffers


def _widened(
    spec: ModelSpec, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Narrow tensors (a width tier's prefixes) placed in zero, inactive tensors of ``spec``'s full shapes."""
    full_weights, full_masks = {}, {}
    for name, shape in spec.shapes.items():
        index = tuple(slice(0, n) for n in weights[name].shape)
        full_weights[name] = torch.zeros(shape, dtype=weights[name].dtype)
        full_weights[name][index] = weights[name]
        full_masks[name] = torch.zeros(shape, dtype=torch.bool)
        full_masks[name][index] = masks[name]
    return full_weights, full_masks


def compile_decoder() -> None:
    """Compile the decoder's loops (the expansion's and the message walk's; about 1.8 s) now rather than in
    the first pull.

    numba loads here or with the first decode, not with this package: a simulation uses the wire
    format's specs and sizes but never decodes, and need not pay numba's import (0.1 s) and memory
    (about 70 MiB resident). A daemon calls this at start.
    """
    from edge_node.wire._expand import compile_loops

    compile_loops()
    _parse.compile_parser()


def decode_model(
    messages: Iterable[ProtoModelChunk | bytes],
    spec: ModelSpec,
    expected_fleet: str,
    limits: WireLimits | None = None,
    *,
    expected_node_id: str | None = None,
    expected_round: int | None = None,
) -> DecodedModel:
    """Validate a whole stream and return the model it carries (the rules: ``ModelDecoder``).

    Raises:
        PeerIdentityMismatch: the header names another node than ``expected_node_id``.
        HeaderMismatch: another fleet, architecture, protocol major version or round; a header field
            out of range; a density the masks do not have.
        WireLimitError: a message, the chunk count or the total bytes exceed ``limits``.
        WireDecodeError: anything else malformed, with the tensor and the problem in the message.
    """
    decoder = ModelDecoder(
        spec, expected_fleet, limits, expected_node_id=expected_node_id, expected_round=expected_round
    )
    for message in messages:
        decoder.feed(message)
    return decoder.finish()
