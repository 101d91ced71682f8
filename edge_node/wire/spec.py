"""What both ends of a model stream agree on: value types, the model's spec, header, limits."""

from __future__ import annotations

import enum
import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import numpy as np
import torch
import xxhash

from edge_node.protocol import (  # noqa: F401  (parse_protocol_version: re-exported)
    ARCH_NAME_PATTERN,
    PROTOCOL_VERSION,
    TIER_DENSITIES,
    TIER_MODES,
    NodeIdentity,
    check_arch_id,
    parse_protocol_version,
    protocol_major,
    tier_name,
)

PROTOCOL_MAJOR = protocol_major(PROTOCOL_VERSION)  # a receiver refuses another MAJOR
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20  # a sender's largest serialized message; gRPC's receive default is 4 MiB
MIN_MAX_MESSAGE_BYTES = 4096  # below this a header plus one chunk of a tensor's metadata may not fit

_ARCH_NAME = re.compile(ARCH_NAME_PATTERN)


class ValueType(enum.IntEnum):
    """Encoding of the active values on the wire (numbers equal the proto enum)."""

    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3

    @property
    def itemsize(self) -> int:
        """Bytes per value."""
        return 4 if self is ValueType.FLOAT32 else 2

    @property
    def torch_dtype(self) -> torch.dtype:
        return {ValueType.FLOAT32: torch.float32, ValueType.FLOAT16: torch.float16}.get(self, torch.bfloat16)

    @classmethod
    def parse(cls, text: str | ValueType) -> ValueType:
        """``ValueType`` from a name such as ``"float16"``, ``"fp16"`` or ``"bf16"`` (config, flags)."""
        if isinstance(text, ValueType):
            return text
        key = str(text).strip().lower()
        aliases = {
            "float32": cls.FLOAT32, "fp32": cls.FLOAT32, "f32": cls.FLOAT32,
            "float16": cls.FLOAT16, "fp16": cls.FLOAT16, "f16": cls.FLOAT16, "half": cls.FLOAT16,
            "bfloat16": cls.BFLOAT16, "bf16": cls.BFLOAT16,
        }  # fmt: skip
        if key not in aliases:
            raise ValueError(f"value_type={text!r} must be one of float32, float16, bfloat16")
        return aliases[key]


@dataclass(frozen=True)
class ModelSpec:
    """Names and shapes of a model's parameter tensors, in ``named_parameters`` order.

    Both ends build it from the model they run; a stream is accepted only for the same ``arch_id``,
    and every tensor in it is checked against these names and shapes. ``shapes`` lists the tensors that
    travel (a model's frozen parameters do not); ``variant`` is what else the two ends must share (the
    digest of a pretrained start, the frozen parameters: edge_node.pretrained), hashed into the id with
    the shapes; "" (a model trained whole from the fleet seed) leaves the id as it always was.
    ``buffers``: the BatchNorm running statistics that travel too (a node under ``norm_stats average``:
    dense float32 after the parameters, protocol 1.3), in ``named_buffers`` order; empty (the default) for
    any other node. They are no part of the id (``local`` and ``average`` nodes of a model share it), but
    two specs are equal only with the same buffers.
    ``tier_mode``: what a capacity tier buys in the fleet (edge_node.protocol.TIER_MODES). Under width tiers
    (width, both: protocol 1.5) ``tiers`` holds each tier's narrow shapes by tier name ("0.2" .. "1.0"), prefixes
    of ``shapes``: a stream of tier ``t`` carries exactly ``tiers[t]``'s shapes (:meth:`shapes_of`). Neither is part
    of the id: a narrow model's coordinates are the full model's.
    """

    arch_name: str
    num_classes: int
    shapes: Mapping[str, tuple[int, ...]] = field(compare=False)
    variant: str = field(default="", compare=False)
    buffers: Mapping[str, tuple[int, ...]] = field(default_factory=dict, compare=False)
    tier_mode: str = field(default="mask", compare=False)
    tiers: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict, compare=False)
    arch_id: str = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.arch_name, str) or not _ARCH_NAME.fullmatch(self.arch_name):
            raise ValueError(f"arch_name={self.arch_name!r} must be 1-64 characters of [A-Za-z0-9_.-]")
        if not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise ValueError(f"num_classes={self.num_classes!r} must be a positive integer")
        shapes: dict[str, tuple[int, ...]] = {}
        for name, shape in self.shapes.items():
            if not isinstance(name, str) or not name or len(name.encode()) > 255:
                raise ValueError(f"parameter name {name!r} must be a non-empty string of at most 255 bytes")
            dims = tuple(int(d) for d in shape)
            if any(d < 0 for d in dims):
                raise ValueError(f"parameter {name!r} has a negative dimension in shape {dims}")
            shapes[name] = dims
        if not shapes:
            raise ValueError("a ModelSpec needs at least one parameter tensor")
        object.__setattr__(self, "shapes", MappingProxyType(shapes))
        buffers: dict[str, tuple[int, ...]] = {}
        for name, shape in self.buffers.items():
            if not isinstance(name, str) or not name or len(name.encode()) > 255 or name in shapes:
                raise ValueError(
                    f"buffer name {name!r} must be a non-empty string of at most 255 bytes, no parameter's"
                )
            dims = tuple(int(d) for d in shape)
            if any(d < 0 for d in dims):
                raise ValueError(f"buffer {name!r} has a negative dimension in shape {dims}")
            buffers[name] = dims
        object.__setattr__(self, "buffers", MappingProxyType(buffers))
        self._check_tiers(shapes)
        text = ";".join(f"{name}:{'x'.join(map(str, dims))}" for name, dims in shapes.items())
        if self.variant:
            text += f"|{self.variant}"
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        object.__setattr__(self, "arch_id", check_arch_id(f"{self.arch_name}/{self.num_classes}/{digest}"))

    def _check_tiers(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """``tier_mode`` is a mode; under width tiers every tier has shapes, each a prefix of ``shapes``."""
        if self.tier_mode not in TIER_MODES:
            raise ValueError(f"tier_mode={self.tier_mode!r} must be one of {', '.join(TIER_MODES)}")
        if self.tier_mode == "mask":
            if self.tiers:
                raise ValueError("tiers (narrow shapes) are for tier_mode width or both, not mask")
            return
        if sorted(self.tiers) != sorted(tier_name(d) for d in TIER_DENSITIES):
            raise ValueError(f"tier_mode {self.tier_mode} needs the shapes of every tier, got {sorted(self.tiers)}")
        tiers = {}
        for tier, narrow in self.tiers.items():
            dims = {name: tuple(int(d) for d in shape) for name, shape in narrow.items()}
            if list(dims) != list(shapes) or any(
                len(n) != len(f) or not all(1 <= a <= b for a, b in zip(n, f, strict=True))
                for n, f in zip(dims.values(), shapes.values(), strict=True)
            ):
                raise ValueError(f"tier {tier}'s shapes are not prefixes of the model's")
            tiers[tier] = MappingProxyType(dims)
        object.__setattr__(self, "tiers", MappingProxyType(tiers))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ModelSpec)
            and self.arch_id == other.arch_id
            and self.shapes == other.shapes
            and self.buffers == other.buffers
            and self.tier_mode == other.tier_mode
            and self.tiers == other.tiers
        )

    def __hash__(self) -> int:
        return hash(self.arch_id)

    @classmethod
    def from_tensors(
        cls, arch_name: str, num_classes: int, weights: Mapping[str, torch.Tensor], variant: str = ""
    ) -> ModelSpec:
        """Spec of ``weights`` (e.g. ``dict(model.named_parameters())``), keeping its order."""
        return cls(arch_name, num_classes, {name: tuple(t.shape) for name, t in weights.items()}, variant)

    def with_buffers(self, buffers: Mapping[str, torch.Tensor]) -> ModelSpec:
        """This spec with ``buffers`` (e.g. ``dict(model.named_buffers())``) travelling too (``norm_stats average``)."""
        shapes = {name: tuple(t.shape) for name, t in buffers.items()}
        return ModelSpec(
            self.arch_name, self.num_classes, self.shapes, self.variant, shapes, self.tier_mode, self.tiers
        )

    def with_tiers(self, tier_mode: str, tiers: Mapping[str, Mapping[str, tuple[int, ...]]]) -> ModelSpec:
        """This spec under ``tier_mode`` with each tier's narrow ``tiers`` shapes (width tiers, protocol 1.5)."""
        return ModelSpec(self.arch_name, self.num_classes, self.shapes, self.variant, self.buffers, tier_mode, tiers)

    def shapes_of(self, tier: str | None) -> Mapping[str, tuple[int, ...]]:
        """The shapes a stream of ``tier`` carries: the full ``shapes`` under ``mask``, the tier's narrow ones under
        width tiers (ValueError for a tier this spec has no shapes of)."""
        if self.tier_mode == "mask":
            return self.shapes
        if tier is None or tier not in self.tiers:
            raise ValueError(f"tier {str(tier)[:16]!r} is not one of {', '.join(self.tiers)}")
        return self.tiers[tier]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.shapes)

    def numel(self, name: str) -> int:
        return math.prod(self.shapes[name])

    @property
    def total_numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())

    @property
    def density_tolerance(self) -> float:
        """How far a stream header's density may be from the fraction of weights its masks keep.

        ERK and uniform masks keep ``max(1, floor(d_l * n_l))`` of each tensor's ``n_l`` weights, so a
        model's kept fraction is within ``T / N`` of its target density (``T`` tensors, ``N``
        parameters); 1e-6 more covers floating point. Prune-and-regrow keeps every tensor's count.
        """
        total = self.total_numel
        return math.inf if total == 0 else len(self.shapes) / total + 1e-6


@dataclass(frozen=True)
class StreamHeader:
    """The first message of a model stream, as the receiver saw it (after validation).

    ``identity``: the sender as its header says, every value known (a stream is of a round, at a density).
    """

    identity: NodeIdentity
    payload_digest: bytes  # payload_hasher(protocol_version) over (bitmap, values) of every chunk in order
    message_count: int = 0  # tensor-bearing messages after the header
    chunk_count: int = 0  # SparseTensor chunks in them

    @property
    def round(self) -> int:
        """The round the stream is of (a header always carries one)."""
        assert self.identity.round is not None
        return self.identity.round

    @property
    def payload_digest_text(self) -> str:
        """``"xxh3_128:<hex>"`` (``"sha256:<hex>"`` before 1.2) form of the payload digest, for logs."""
        assert self.identity.protocol_version is not None
        return f"{payload_hasher(self.identity.protocol_version).name.lower()}:{self.payload_digest.hex()}"


DEFAULT_RECEIVE_MESSAGE_BYTES = 4 << 20  # one serialized message a receiver takes (gRPC's default limit)
LIMIT_SLACK_FRACTION = 0.01  # for_spec: room above the largest encoding, as a fraction of it ...
LIMIT_SLACK_BYTES = 64 << 10  # ... plus a constant (headers of long ids, a sender's own chunking)


@dataclass(frozen=True)
class WireLimits:
    """What a receiver accepts from one stream; anything beyond is refused before it is stored.

    The defaults here are generic; ``WireLimits.for_spec(spec)`` bounds a stream by the receiver's own
    model, and is what ``pull_model(s)`` uses when given no limits.
    """

    max_message_bytes: int = DEFAULT_RECEIVE_MESSAGE_BYTES  # one serialized message
    max_chunks: int = 1 << 16  # SparseTensor chunks per stream
    max_total_bytes: int = 1 << 30  # all messages of one stream together

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_chunks", "max_total_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")

    @classmethod
    def for_spec(cls, spec: ModelSpec, *, max_message_bytes: int = DEFAULT_RECEIVE_MESSAGE_BYTES) -> WireLimits:
        """Limits that admit every valid stream of ``spec`` and little more.

        ``max_total_bytes`` is the largest stream the encoder can produce for this model: every tensor
        at its worst active count (all but one element active in fp32: a full bitmap plus almost dense
        values; or dense), split at the smallest message budget a sender may use (4 KiB, the most
        per-chunk overhead), with the longest header, plus 1 % and 64 KiB of slack. For a model of
        ``n`` parameters that is about ``4.13 n`` bytes, against ``4 n`` for its dense fp32 values.
        ``max_chunks`` is that stream's chunk count plus the same slack.
        """
        from edge_node.wire._layout import largest_stream  # the layout imports this module

        total_bytes, chunks = largest_stream(spec)
        slack = int(total_bytes * LIMIT_SLACK_FRACTION) + LIMIT_SLACK_BYTES
        return cls(
            max_message_bytes=min(max_message_bytes, total_bytes + slack),
            max_chunks=chunks + max(64, int(chunks * LIMIT_SLACK_FRACTION)),
            max_total_bytes=total_bytes + slack,
        )


@dataclass(frozen=True)
class DecodedModel:
    """A validated model from a peer: dense float32 weights (zero where inactive) and bool masks; ``buffers``:
    its running statistics when it sent them (float32, ``num_batches_tracked`` int64), else {}."""

    header: StreamHeader
    weights: dict[str, torch.Tensor]
    masks: dict[str, torch.Tensor]
    value_type: ValueType
    wire_bytes: int  # serialized bytes of all messages, header included
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def nnz(self) -> int:
        return int(sum(int(m.sum()) for m in self.masks.values()))


class PayloadHasher(Protocol):
    """What the decoder needs of a digest: ``hashlib`` objects and ``xxhash``'s both are one."""

    @property
    def name(self) -> str: ...
    @property
    def digest_size(self) -> int: ...
    def update(self, data: bytes | memoryview, /) -> None: ...
    def digest(self) -> bytes: ...


DIGEST_XXH3_SINCE = (1, 2)  # the protocol version whose stream headers carry XXH3-128, not SHA-256
BUFFERS_SINCE = (1, 3)  # the protocol version whose streams may carry running statistics (SparseTensor.buffer)
TIERS_SINCE = (1, 5)  # the protocol version whose headers name a tier mode and tier (width tiers' narrow shapes)


def payload_hasher(protocol_version: str) -> PayloadHasher:
    """A fresh hasher of the payload digest that a stream header of ``protocol_version`` carries.

    The digest guards against accidental corruption (a bit flipped in a buffer, a NIC or a relay that
    the transport's checks missed), not against an attacker, who can rewrite it with the payload: TLS
    authenticates streams. A non-cryptographic hash does that job: XXH3-128 hashes at tens of GB/s
    (0.6 ms for a 23.6 MB ResNet18 stream on one core here, against 11 ms for SHA-256), so checking it
    costs a pull almost nothing. 1.0 and 1.1 streams carry SHA-256 and are checked with it.
    """
    if parse_protocol_version(protocol_version) >= DIGEST_XXH3_SINCE:
        return xxhash.xxh3_128()
    return hashlib.sha256()


def numpy_value_dtype(value_type: ValueType) -> np.dtype:
    """Little-endian numpy dtype of the raw values (bfloat16 travels as its 16 bits)."""
    return np.dtype({ValueType.FLOAT32: "<f4", ValueType.FLOAT16: "<f2", ValueType.BFLOAT16: "<u2"}[value_type])
