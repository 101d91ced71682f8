"""Property: the whole receive path (decode, screen, aggregate) survives any mutation of a valid stream.

Hostile streams are generated from a valid one by flipping bytes, truncating, dropping, duplicating
and reordering messages, writing huge / NaN / infinite / subnormal values (with the payload digest
recomputed, so that the checks behind it are reached), lying counts, bitmaps and shapes. Whatever
arrives: decoding raises nothing but ``WireDecodeError`` (and its subclasses), nothing non-finite or
beyond the screen's bound is aggregated, and the receiver's own model is untouched.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from edge_node.algorithm import aggregate, screen_peer_models
from edge_node.algorithm.robust import DEFAULT_MAX_ABS_RATIO, DEFAULT_OWN_ANCHOR
from edge_node.errors import WireDecodeError
from edge_node.protocol import parse_protocol_version
from edge_node.wire import ModelSpec, ValueType, WireLimits, decode_model, encode_model
from edge_node.wire.codec import header_for_version
from edge_node.wire.messages import ProtoModelChunk
from tests import wire_models
from tests.wire_models import kept_fraction

SHAPES: dict[str, tuple[int, ...]] = {"conv.weight": (4, 3, 3, 3), "conv.bias": (4,), "fc.weight": (6, 40)}
SPEC = ModelSpec("prop", 6, SHAPES)
FLEET = "fleet-1"
LIMITS = WireLimits.for_spec(SPEC)
SPECIAL = [3e38, -3e38, 1e30, float("nan"), float("inf"), float("-inf"), 1e-45, -0.0, 65504.0, 1e6]


def _model(seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    weights, masks = wire_models.random_model(SHAPES, seed, 0.5)
    return {n: w * masks[n] for n, w in weights.items()}, masks


OWN = _model(100)
HONEST = [_model(101), _model(102)]


def _rehash(messages: list[ProtoModelChunk]) -> None:
    """A consistent liar: the header's digest made to match the (edited) payload.

    A header whose protocol version an earlier edit made unparseable names no digest algorithm: it
    keeps its old digest (the decoder refuses the version before it looks at the digest).
    """
    if messages and messages[0].HasField("header"):
        version = messages[0].header.protocol_version
        try:
            parse_protocol_version(version)
        except ValueError:
            return
        messages[0] = header_for_version(messages, version)


def _tensors(messages: list[ProtoModelChunk]) -> list:
    return [t for m in messages[1:] for t in m.tensors]


def _mutate_fields(draw, kind: str, messages: list[ProtoModelChunk]) -> None:
    """The edits of decoded fields (values, bitmaps, shapes, counts, header): only while messages are parsed."""
    tensors = _tensors(messages)
    if kind in ("values", "bitmap", "shape", "nnz") and tensors:
        tensor = tensors[draw(st.integers(0, len(tensors) - 1))]
        if kind == "values" and tensor.values:
            dtype = {1: "<f4", 2: "<f2", 3: "<u2"}.get(tensor.value_type, "<f4")
            values = np.frombuffer(tensor.values, dtype).copy()
            picks = draw(st.lists(st.integers(0, values.size - 1), min_size=1, max_size=values.size))
            special = draw(st.sampled_from(SPECIAL))
            with np.errstate(over="ignore"):
                if dtype == "<u2":  # bfloat16: the upper half of the float32
                    values[picks] = (np.array([special], "<f4").view("<u4") >> 16).astype("<u2")[0]
                else:
                    values[picks] = np.array([special]).astype(dtype)[0]
            tensor.values = values.tobytes()
        elif kind == "bitmap" and tensor.bitmap:
            bitmap = bytearray(tensor.bitmap)
            bitmap[draw(st.integers(0, len(bitmap) - 1))] = draw(st.integers(0, 255))
            tensor.bitmap = bytes(bitmap)
        elif kind == "shape":
            del tensor.shape[:]
            tensor.shape.extend(draw(st.lists(st.integers(-3, 50), max_size=4)))
        elif kind == "nnz":
            tensor.nnz = draw(st.integers(0, 2**40))
        if draw(st.booleans()):
            _rehash(messages)  # a consistent liar: the digest matches what it sends
    elif kind == "counts" and messages[0].HasField("header"):
        messages[0].header.message_count = draw(st.integers(0, 2**40))
        messages[0].header.chunk_count = draw(st.integers(0, 2**40))
    elif kind == "header" and messages[0].HasField("header"):
        header = messages[0].header
        field = draw(st.sampled_from(["density", "round", "node_id", "protocol_version"]))
        if field == "density":
            header.density = draw(st.floats(allow_nan=True, allow_infinity=True))
        elif field == "round":
            header.round = draw(st.integers(0, 2**64 - 1))
        elif field == "node_id":
            header.node_id = draw(st.text(max_size=70))
        else:
            header.protocol_version = draw(st.text(max_size=12))


@st.composite
def hostile_streams(draw) -> list[bytes]:
    seed = draw(st.integers(0, 2**16))
    weights, masks = wire_models.random_model(SHAPES, seed, 0.5)
    value_type = draw(st.sampled_from(list(ValueType)))
    encoded = encode_model(
        SPEC, weights, masks, node_id="peer", fleet_id=FLEET, round=1, density=kept_fraction(masks),
        value_type=value_type, max_message_bytes=4096,
    )  # fmt: skip
    messages = [ProtoModelChunk.FromString(m.SerializeToString()) for m in encoded]
    raw: list[bytes] | None = None
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(
                ["values", "values", "bitmap", "counts", "shape", "nnz", "order", "drop", "duplicate", "bytes",
                 "truncate", "unknown", "header"]
            )
        )  # fmt: skip
        if raw is None and messages:
            _mutate_fields(draw, kind, messages)
        stream: list = messages if raw is None else raw  # after a byte-level edit the bytes are the stream
        if kind == "order" and len(stream) > 2:
            i, j = draw(st.integers(0, len(stream) - 1)), draw(st.integers(0, len(stream) - 1))
            stream[i], stream[j] = stream[j], stream[i]
        elif kind == "drop" and stream:
            del stream[draw(st.integers(0, len(stream) - 1))]
        elif kind == "duplicate" and stream:
            i = draw(st.integers(0, len(stream) - 1))
            copy = stream[i] if raw is not None else ProtoModelChunk.FromString(stream[i].SerializeToString())
            stream.insert(i, copy)
        elif kind in ("bytes", "truncate", "unknown"):
            raw = [m.SerializeToString() for m in messages] if raw is None else raw
            if not raw:
                continue
            i = draw(st.integers(0, len(raw) - 1))
            data = bytearray(raw[i])
            if kind == "bytes" and data:
                for _ in range(draw(st.integers(1, 4))):
                    data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
            elif kind == "truncate":
                del data[draw(st.integers(0, len(data))) :]
            else:
                data += bytes([draw(st.sampled_from([0x78, 0x7A, 0x82]))]) + bytes(draw(st.binary(max_size=8)))
            raw[i] = bytes(data)
    return raw if raw is not None else [m.SerializeToString() for m in messages]


def _largest(values: torch.Tensor) -> float:
    return float(values.abs().max()) if values.numel() else 0.0


def _bound(own_w: dict[str, torch.Tensor], own_m: dict[str, torch.Tensor], name: str) -> float:
    active = torch.cat([w[own_m[n]] for n, w in own_w.items()])
    floor = float(active.pow(2).mean().sqrt())
    return DEFAULT_MAX_ABS_RATIO * DEFAULT_OWN_ANCHOR * max(float(own_w[name][own_m[name]].abs().max()), floor)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_streams())
def test_hostile_streams_never_reach_the_aggregate_unbounded(stream: list[bytes]) -> None:
    own_w, own_m = OWN
    before = {n: w.clone() for n, w in own_w.items()}
    try:
        decoded = decode_model(stream, SPEC, FLEET, LIMITS, expected_node_id="peer")
    except WireDecodeError as exc:
        event(f"refused: {type(exc).__name__}")
        return  # refused: the documented outcome for a bad stream
    for name, shape in SHAPES.items():  # what the decoder lets through is well-formed and finite
        assert tuple(decoded.weights[name].shape) == shape and decoded.weights[name].dtype == torch.float32
        assert decoded.masks[name].dtype == torch.bool and tuple(decoded.masks[name].shape) == shape
        assert bool(torch.isfinite(decoded.weights[name]).all())
        assert not bool(decoded.weights[name][~decoded.masks[name]].any())
    assert abs(decoded.header.identity.density - kept_fraction(decoded.masks)) <= SPEC.density_tolerance
    peers = [("h1", *HONEST[0]), ("h2", *HONEST[1]), ("peer", decoded.weights, decoded.masks)]
    screen = screen_peer_models(own_w, own_m, peers)
    event("decoded, " + ("accepted" if "peer" in screen.accepted else "refused by the screen"))
    kept = {p: (w, m) for p, w, m in peers if p in screen.accepted}
    for _peer, (w, m) in kept.items():
        for name in SHAPES:
            assert _largest(w[name][m[name]]) <= _bound(own_w, own_m, name)
    out = aggregate(own_w, own_m, own_m, [w for w, _m in kept.values()], [m for _w, m in kept.values()])
    for name, tensor in out.items():
        assert bool(torch.isfinite(tensor).all())
        assert _largest(tensor) <= _bound(own_w, own_m, name) * (1 + 1e-6)
    assert all(torch.equal(before[n], own_w[n]) for n in own_w)
    assert math.isfinite(decoded.header.identity.density)


def test_a_header_edit_to_an_unparseable_version_then_a_rehash_still_makes_a_stream() -> None:
    """The strategy's own failure once (CI): a version edited to '' and then a rehash raised in the test."""
    weights, masks = wire_models.random_model(SHAPES, 7, 0.5)
    encoded = encode_model(SPEC, weights, masks, node_id="peer", fleet_id=FLEET, round=1, density=0.5)
    messages = [ProtoModelChunk.FromString(m.SerializeToString()) for m in encoded]
    messages[0].header.protocol_version = ""
    digest = messages[0].header.payload_digest
    _rehash(messages)
    assert messages[0].header.payload_digest == digest
    try:
        decode_model([m.SerializeToString() for m in messages], SPEC, FLEET, LIMITS, expected_node_id="peer")
    except WireDecodeError as exc:
        assert "protocol version" in str(exc)
    else:
        raise AssertionError("a stream with version '' was decoded")
