"""Codec: round trips, bit order, chunking, exact sizes, and refusal of every malformed stream."""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from edge_node.errors import HeaderMismatch, PeerIdentityMismatch, WireDecodeError, WireLimitError
from edge_node.wire import (
    PROTOCOL_VERSION,
    ModelDecoder,
    ModelSpec,
    ValueType,
    WireLimits,
    _build,
    decode_model,
    encode_model,
    encoded_model_size,
)
from edge_node.wire.messages import ProtoModelChunk
from tests import wire_models
from tests.wire_models import find_tensor, kept_fraction

SHAPES: dict[str, tuple[int, ...]] = {
    "conv1.weight": (8, 3, 3, 3),
    "conv1.bias": (8,),
    "norm.weight": (8,),
    "fc1.weight": (40, 72),  # 2880 elements: several chunks at a 4 KiB message budget
    "fc1.bias": (40,),
    "fc2.weight": (10, 40),
    "fc2.bias": (10,),
}
SPEC = ModelSpec("tiny", 10, SHAPES)
SMALL = 4096  # message budget that forces chunking


def random_model(seed: int, density: float = 0.5) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return wire_models.random_model(SHAPES, seed, density)


def encode(weights, masks, **kwargs) -> list[ProtoModelChunk]:
    full = {name: masks.get(name, torch.ones(shape, dtype=torch.bool)) for name, shape in SHAPES.items()}
    args = {"node_id": "node-a", "fleet_id": "fleet-1", "round": 7, "density": kept_fraction(full)} | kwargs
    return encode_model(SPEC, weights, masks, **args)


def copies(messages: list[ProtoModelChunk]) -> list[ProtoModelChunk]:
    return [ProtoModelChunk.FromString(m.SerializeToString()) for m in messages]


def test_round_trip_restores_masked_weights_and_masks() -> None:
    weights, masks = random_model(0)
    model = decode_model(encode(weights, masks), SPEC, "fleet-1")
    assert list(model.weights) == list(SHAPES)
    for name in SHAPES:
        assert torch.equal(model.masks[name], masks[name])
        assert torch.equal(model.weights[name], torch.where(masks[name], weights[name], 0.0))
        assert model.weights[name].dtype == torch.float32
    identity = model.header.identity
    assert (identity.node_id, identity.fleet_id, identity.round) == ("node-a", "fleet-1", 7)
    assert identity.arch_id == SPEC.arch_id and identity.density == kept_fraction(masks)


def test_bitmap_is_little_endian_row_major_and_values_in_order() -> None:
    shape = (2, 8)
    spec = ModelSpec("bits", 2, {"w": shape})
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[0, 0] = mask[0, 3] = mask[1, 7] = True  # flat indices 0, 3, 15
    weight = torch.arange(16, dtype=torch.float32).reshape(shape)
    (header, body) = encode_model(spec, {"w": weight}, {"w": mask}, node_id="n", fleet_id="f", round=0, density=3 / 16)
    tensor = body.tensors[0]
    assert tensor.bitmap == bytes([0b0000_1001, 0b1000_0000])
    assert np.frombuffer(tensor.values, "<f4").tolist() == [0.0, 3.0, 15.0]
    assert tensor.nnz == 3 and not tensor.dense and header.header.protocol_version == PROTOCOL_VERSION


def test_all_true_mask_and_missing_mask_go_dense_without_bitmap() -> None:
    weights, masks = random_model(1)
    del masks["conv1.bias"]
    messages = encode(weights, masks)
    dense = {t.name for m in messages for t in m.tensors if t.dense}
    assert dense == {"conv1.bias", "norm.weight", "fc1.bias", "fc2.bias"}
    assert all(not t.bitmap for m in messages for t in m.tensors if t.dense)
    model = decode_model(messages, SPEC, "fleet-1")
    assert bool(model.masks["conv1.bias"].all())


@pytest.mark.parametrize("value_type", list(ValueType))
def test_messages_respect_budget_and_large_tensors_split(value_type: ValueType) -> None:
    weights, masks = random_model(2, density=0.9)
    messages = encode(weights, masks, value_type=value_type, max_message_bytes=SMALL)
    assert max(m.ByteSize() for m in messages) <= SMALL
    chunks = [t for m in messages for t in m.tensors if t.name == "fc1.weight"]
    assert len(chunks) > 1 and all(c.start % 8 == 0 for c in chunks)
    assert sum(c.count for c in chunks) == 40 * 72
    model = decode_model(messages, SPEC, "fleet-1")
    expected = torch.where(masks["fc1.weight"], weights["fc1.weight"].to(value_type.torch_dtype).float(), 0.0)
    assert torch.equal(model.weights["fc1.weight"], expected)


@pytest.mark.parametrize("where", ["first", "last", "middle"])
def test_tensors_built_chunk_by_chunk_when_bitmap_and_values_do_not_line_up(where: str) -> None:
    """A chunk's values need not belong to its own bitmap range (the layout depends only on counts):
    active elements bunched at one end make positions (first) or values (last) wait for later chunks."""
    weights, masks = random_model(3)
    flat = torch.zeros(40 * 72, dtype=torch.bool)
    active = {"first": slice(0, 2000), "last": slice(-2000, None), "middle": slice(400, 2400)}[where]
    flat[active] = True
    masks["fc1.weight"] = flat.reshape(40, 72)
    messages = encode(weights, masks, max_message_bytes=SMALL)
    chunks = [t for m in messages for t in m.tensors if t.name == "fc1.weight"]
    assert len(chunks) > 2, len(chunks)
    ranges = [(c.start, c.start + c.count, c.value_start, c.value_start + c.nnz) for c in chunks]
    assert any(sum(bin(b).count("1") for b in c.bitmap) != c.nnz for c in chunks), ranges  # they do not line up
    model = decode_model(messages, SPEC, "fleet-1")
    for name in SHAPES:
        assert torch.equal(model.masks[name], masks[name])
        assert torch.equal(model.weights[name], torch.where(masks[name], weights[name], 0.0))


@pytest.mark.parametrize("value_type", list(ValueType))
@pytest.mark.parametrize("density", [0.0, 0.01, 0.3, 0.77, 1.0])
@pytest.mark.parametrize("budget", [SMALL, 9000, 1 << 20])
def test_encoded_model_size_is_exact(value_type: ValueType, density: float, budget: int) -> None:
    weights, masks = random_model(int(density * 100) + budget, density)
    header = {"node_id": "a-rather-long-node-name", "fleet_id": "f", "round": 300, "density": kept_fraction(masks)}
    messages = encode(weights, masks, value_type=value_type, max_message_bytes=budget, **header)
    nnz = {name: int(m.sum()) for name, m in masks.items()}
    size = encoded_model_size(SPEC, nnz, value_type, budget, **header)
    assert size == sum(len(m.SerializeToString()) for m in messages) == sum(m.ByteSize() for m in messages)


def test_encoded_model_size_dense_tensors_need_no_count() -> None:
    weights, masks = random_model(3)
    dense = {"conv1.bias", "norm.weight", "fc1.bias", "fc2.bias"}
    for name in dense:
        del masks[name]
    nnz = {name: int(m.sum()) for name, m in masks.items()}
    full = {name: masks.get(name, torch.ones(SHAPES[name], dtype=torch.bool)) for name in SHAPES}
    size = encoded_model_size(
        SPEC, nnz, dense_tensors=dense, node_id="node-a", fleet_id="fleet-1", round=7, density=kept_fraction(full)
    )
    assert size == sum(m.ByteSize() for m in encode(weights, masks))
    with pytest.raises(ValueError, match="conv1.bias"):
        encoded_model_size(SPEC, nnz)


def test_wire_bytes_close_to_bitmap_plus_values() -> None:
    shapes = {"a": (256, 256, 3, 3), "b": (512, 1024)}
    spec = ModelSpec("big", 10, shapes)
    numel = sum(math.prod(s) for s in shapes.values())
    for density in (0.1, 0.5):
        nnz = {name: int(math.prod(s) * density) for name, s in shapes.items()}
        size = encoded_model_size(spec, nnz, ValueType.FLOAT32)
        floor = numel / 8 + sum(nnz.values()) * 4
        assert floor <= size <= floor * 1.01


def test_encode_refuses_bad_input_naming_it() -> None:
    weights, masks = random_model(4)
    with pytest.raises(ValueError, match="fc1.weight.*NaN"):
        encode({**weights, "fc1.weight": weights["fc1.weight"].clone().fill_(float("nan"))}, masks)
    with pytest.raises(ValueError, match="overflow float16"):
        encode({**weights, "fc2.bias": torch.full((10,), 1e6)}, masks, value_type=ValueType.FLOAT16)
    with pytest.raises(ValueError, match="missing"):
        encode({k: v for k, v in weights.items() if k != "fc2.bias"}, masks)
    with pytest.raises(TypeError, match="bool"):
        encode(weights, {**masks, "fc2.weight": masks["fc2.weight"].float()})
    with pytest.raises(ValueError, match="round=-1"):
        encode(weights, masks, round=-1)
    with pytest.raises(ValueError, match="max_message_bytes=100"):
        encode(weights, masks, max_message_bytes=100)


def test_encode_and_decode_leave_inputs_untouched() -> None:
    weights, masks = random_model(5)
    before = {k: v.clone() for k, v in weights.items()}
    messages = encode(weights, masks, value_type=ValueType.BFLOAT16)
    model = decode_model(messages, SPEC, "fleet-1")
    model.weights["fc1.weight"].add_(1.0)  # the decoded tensors own their memory
    assert all(torch.equal(before[k], weights[k]) for k in weights)
    assert decode_model(messages, SPEC, "fleet-1").weights["fc1.weight"].abs().max() < 100


def _nan_value(messages) -> None:
    tensor = find_tensor(messages, "fc2.weight")
    tensor.values = np.float32("nan").tobytes() + tensor.values[4:]


def _inf_value(messages) -> None:
    tensor = find_tensor(messages, "conv1.bias")
    tensor.values = tensor.values[:-4] + np.float32("-inf").tobytes()


def _drop_value(messages) -> None:
    tensor = find_tensor(messages, "fc2.weight")
    tensor.values, tensor.nnz = tensor.values[:-4], tensor.nnz - 1


def _extra_bit(messages) -> None:
    tensor = find_tensor(messages, "conv1.weight")
    bitmap = bytearray(tensor.bitmap)
    bitmap[0] ^= next(1 << i for i in range(8) if not bitmap[0] >> i & 1)
    tensor.bitmap = bytes(bitmap)


def _set_field(tensor_name: str, **fields):
    def mutate(messages) -> None:
        tensor = find_tensor(messages, tensor_name)
        for key, value in fields.items():
            if key == "shape":
                del tensor.shape[:]
                tensor.shape.extend(value)
            else:
                setattr(tensor, key, value)

    return mutate


BAD_STREAMS = {
    "truncated bitmap": (
        lambda ms: setattr(find_tensor(ms, "conv1.weight"), "bitmap", find_tensor(ms, "conv1.weight").bitmap[:-1]),
        "'conv1.weight': bitmap has 26 bytes, expected 27",
    ),
    "value count below bitmap": (_drop_value, "'fc2.weight': bitmap has \\d+ active elements but \\d+ values"),
    "bitmap above value count": (_extra_bit, "'conv1.weight': bitmap has \\d+ active elements but \\d+ values"),
    "nnz disagrees with values": (_set_field("fc2.weight", nnz=3), "'fc2.weight': nnz=3 but \\d+ value bytes"),
    "unknown name": (_set_field("fc2.bias", name="fc3.bias"), "'fc3.bias': unknown tensor name"),
    "wrong shape": (_set_field("fc2.weight", shape=(40, 10)), "'fc2.weight': shape \\(40, 10\\) does not match"),
    "NaN": (_nan_value, "'fc2.weight': 1 values are NaN or Inf"),
    "Inf": (_inf_value, "'conv1.bias': 1 values are NaN or Inf"),
    "unknown value type": (_set_field("fc2.bias", value_type=9), "unknown value type 9"),
    "chunk gap": (_set_field("conv1.weight", start=8), "starts at element 8, expected 0"),
    "dense chunk with bitmap": (_set_field("fc2.bias", bitmap=b"\xff\x03"), "dense chunk carries a bitmap"),
    "corrupt payload": (
        lambda ms: setattr(find_tensor(ms, "fc2.bias"), "values", bytes(40)),
        "payload digest xxh3_128:[0-9a-f]{32} does not match the header's xxh3_128:[0-9a-f]{32}",
    ),
}


@pytest.mark.parametrize("case", list(BAD_STREAMS))
def test_decode_refuses_malformed_stream_naming_the_problem(case: str) -> None:
    weights, masks = random_model(6)
    messages = copies(encode(weights, masks))
    mutate, reason = BAD_STREAMS[case]
    mutate(messages)
    with pytest.raises(WireDecodeError, match=reason):
        decode_model(messages, SPEC, "fleet-1")


def test_decode_refuses_truncated_duplicated_and_reordered_streams() -> None:
    weights, masks = random_model(7)
    messages = encode(weights, masks, max_message_bytes=SMALL)
    with pytest.raises(WireDecodeError, match=f"ended after 2 of the {len(messages) - 1} tensor messages"):
        decode_model(messages[:3], SPEC, "fleet-1")
    with pytest.raises(WireDecodeError, match="before its header"):
        decode_model([], SPEC, "fleet-1")
    with pytest.raises(WireDecodeError, match="does not start with a header"):
        decode_model(messages[1:], SPEC, "fleet-1")
    with pytest.raises(WireDecodeError, match="second header"):
        decode_model([messages[0], messages[0], *messages[1:]], SPEC, "fleet-1")
    with pytest.raises(WireDecodeError, match="past the"):
        decode_model([*messages, messages[-1]], SPEC, "fleet-1")
    swapped = [messages[0], messages[2], messages[1], *messages[3:]]
    with pytest.raises(WireDecodeError, match="expected"):
        decode_model(swapped, SPEC, "fleet-1")
    with pytest.raises(WireDecodeError, match="not a valid ModelChunk"):
        decode_model([messages[0].SerializeToString(), b"\xff\xff\xff"], SPEC, "fleet-1")


def test_decode_refuses_other_fleet_architecture_and_protocol() -> None:
    weights, masks = random_model(8)
    messages = encode(weights, masks)
    with pytest.raises(HeaderMismatch, match="from fleet 'fleet-1', expected 'fleet-2'"):
        decode_model(messages, SPEC, "fleet-2")
    other_spec = ModelSpec("tiny", 100, SHAPES)
    with pytest.raises(HeaderMismatch, match="architecture 'tiny/10/"):
        decode_model(messages, other_spec, "fleet-1")
    bumped = copies(messages)
    bumped[0].header.protocol_version = "2.0"
    with pytest.raises(HeaderMismatch, match="major 2"):
        decode_model(bumped, SPEC, "fleet-1")
    newer_minor = copies(messages)
    newer_minor[0].header.protocol_version = "1.7"
    assert decode_model(newer_minor, SPEC, "fleet-1").header.identity.protocol_version == "1.7"
    for bad in ("1.1\n", "\u0661.1", "1.\uff11", " 1.1", "1.1.1", "1", "999999.1"):  # \d and $ would pass some
        odd = copies(messages)
        odd[0].header.protocol_version = bad
        with pytest.raises(HeaderMismatch, match="not of the form MAJOR.MINOR"):
            decode_model(odd, SPEC, "fleet-1")


def test_decode_enforces_limits() -> None:
    weights, masks = random_model(9)
    messages = encode(weights, masks)
    biggest = max(m.ByteSize() for m in messages)
    with pytest.raises(WireLimitError, match=f"is {biggest} bytes, over the limit of 4096"):
        decode_model(messages, SPEC, "fleet-1", WireLimits(max_message_bytes=4096))
    with pytest.raises(WireLimitError, match="exceeds the limit of 5000 bytes"):
        decode_model(encode(weights, masks, max_message_bytes=SMALL), SPEC, "fleet-1", WireLimits(max_total_bytes=5000))
    with pytest.raises(WireLimitError, match="announces \\d+ chunks, over the limit of 3"):
        decode_model(messages, SPEC, "fleet-1", WireLimits(max_chunks=3))


def test_model_spec_arch_id_hashes_names_and_shapes() -> None:
    assert SPEC.arch_id.startswith("tiny/10/") and len(SPEC.arch_id.split("/")[2]) == 8
    assert ModelSpec("tiny", 10, dict(SHAPES)).arch_id == SPEC.arch_id
    changed = dict(SHAPES, **{"fc2.bias": (11,)})
    assert ModelSpec("tiny", 10, changed).arch_id != SPEC.arch_id
    weights, _ = random_model(0)
    assert ModelSpec.from_tensors("tiny", 10, weights) == SPEC
    with pytest.raises(ValueError, match="arch_name='bad name'"):
        ModelSpec("bad name", 10, SHAPES)
    assert ValueType.parse("bf16") is ValueType.BFLOAT16 and ValueType.parse("fp16").itemsize == 2
    with pytest.raises(ValueError, match="value_type='int8'"):
        ValueType.parse("int8")


@pytest.mark.parametrize("budget", [4096, 9000, 1 << 20])
def test_limits_for_spec_admit_every_valid_stream_and_little_more(budget: int) -> None:
    limits = WireLimits.for_spec(SPEC)
    dense_fp32 = SPEC.total_numel * 4
    assert limits.max_total_bytes <= dense_fp32 * 1.15 + (64 << 10) + 1024
    for density in (0.0, 0.3, 0.99, 1.0):
        for value_type in ValueType:
            weights, masks = random_model(int(density * 1000) + budget, density)
            if density == 0.99:  # all but one weight of every tensor: the largest sparse encoding
                for mask in masks.values():
                    mask.fill_(True).view(-1)[0] = False
            long_ids = {"node_id": "n" * 63, "fleet_id": "f" * 63, "round": 10**15 - 1}
            messages = encode(weights, masks, value_type=value_type, max_message_bytes=budget, **long_ids)
            assert sum(m.ByteSize() for m in messages) <= limits.max_total_bytes
            assert sum(len(m.tensors) for m in messages) <= limits.max_chunks
            assert max(m.ByteSize() for m in messages) <= limits.max_message_bytes
            decode_model(messages, SPEC, "f" * 63)  # the default limits are these


def test_decoder_is_complete_at_the_announced_message_count() -> None:
    weights, masks = random_model(11)
    messages = [m.SerializeToString() for m in encode(weights, masks, max_message_bytes=SMALL)]
    decoder = ModelDecoder(SPEC, "fleet-1", expected_node_id="node-a", expected_round=7)
    for i, raw in enumerate(messages):
        assert not decoder.complete
        decoder.feed(raw)
        assert decoder.complete == (i == len(messages) - 1)
    assert decoder.finish().header.round == 7


def test_decoder_refuses_what_a_canonical_sender_never_sends() -> None:
    weights, masks = random_model(12)
    messages = [m.SerializeToString() for m in encode(weights, masks, max_message_bytes=SMALL)]
    with pytest.raises(WireDecodeError, match="message 1: unknown field number\\(s\\) \\[15\\]"):
        decode_model([messages[0], messages[1] + b"\x78\x01", *messages[2:]], SPEC, "fleet-1")
    tensor = ProtoModelChunk.FromString(messages[1]).tensors[0].SerializeToString()
    inner = tensor + b"\xa0\x06\x01"  # field 100 (varint 1) inside the tensor
    padded_tensor = b"\x12" + bytes([len(inner) & 0x7F | 0x80, len(inner) >> 7]) + inner
    with pytest.raises(WireDecodeError, match="tensor 'conv1.weight': unknown field number\\(s\\) \\[100\\]"):
        decode_model([messages[0], padded_tensor], SPEC, "fleet-1")
    with pytest.raises(WireDecodeError, match="non-canonically encoded"):
        decode_model([messages[0] + messages[0], *messages[1:]], SPEC, "fleet-1")  # the header field twice
    with pytest.raises(PeerIdentityMismatch, match="from node 'node-a', but it was pulled from 'node-b'"):
        decode_model(messages, SPEC, "fleet-1", expected_node_id="node-b")
    with pytest.raises(HeaderMismatch, match="round 7, round 8 was asked for"):
        decode_model(messages, SPEC, "fleet-1", expected_round=8)
    lying = copies([ProtoModelChunk.FromString(m) for m in messages])
    lying[0].header.density = 0.9
    with pytest.raises(HeaderMismatch, match="density 0.9, but the masks keep 0.5"):
        decode_model(lying, SPEC, "fleet-1")
    with pytest.raises(ValueError, match="density=0.9 but the masks keep"):
        encode(weights, masks, density=0.9)


def _payload(messages: list[ProtoModelChunk]) -> bytes:
    return b"".join(t.bitmap + t.values for m in messages[1:] for t in m.tensors)


def test_payload_digest_is_the_one_the_header_version_names() -> None:
    """1.2 streams carry XXH3-128 of the payload; a 1.1 header (a 1.1 peer's, or served to one) SHA-256."""
    import hashlib

    import xxhash

    from edge_node.wire.codec import header_for_version

    weights, masks = random_model(8)
    messages = encode(weights, masks)
    header = messages[0].header
    assert header.protocol_version == PROTOCOL_VERSION == "1.5"
    assert header.payload_digest == xxhash.xxh3_128(_payload(messages)).digest()
    legacy = [header_for_version(messages, "1.1"), *messages[1:]]
    assert legacy[0].header.payload_digest == hashlib.sha256(_payload(messages)).digest()
    assert messages[0].header.protocol_version == "1.5"  # the stream's own header is untouched
    old = decode_model(legacy, SPEC, "fleet-1")
    new = decode_model(messages, SPEC, "fleet-1")
    assert old.header.payload_digest_text.startswith("sha256:") and new.header.payload_digest_text.startswith(
        "xxh3_128:"
    )
    for name in SHAPES:
        assert torch.equal(old.weights[name], new.weights[name]) and torch.equal(old.masks[name], new.masks[name])
    corrupt = copies(legacy)
    find_tensor(corrupt, "fc2.bias").values = bytes(40)
    with pytest.raises(WireDecodeError, match="payload digest sha256:[0-9a-f]{64} does not match"):
        decode_model(corrupt, SPEC, "fleet-1")


@pytest.mark.parametrize(
    ("version", "size", "expected"),
    [("1.2", 32, "16 (xxh3_128)"), ("1.1", 16, "32 (sha256)"), ("1.3", 0, "16 (xxh3_128)")],
)
def test_header_digest_of_another_size_than_its_version_names_is_refused(
    version: str, size: int, expected: str
) -> None:
    """A digest is checked only in the length its version's algorithm has: no other algorithm is tried."""
    weights, masks = random_model(9)
    messages = copies(encode(weights, masks))
    messages[0].header.protocol_version = version
    messages[0].header.payload_digest = bytes(size)
    reason = f"payload digest has {size} bytes, protocol {version} has {expected}"
    with pytest.raises(HeaderMismatch, match=re.escape(reason)):
        decode_model(messages, SPEC, "fleet-1")


def test_fp16_widening_is_exact_for_every_finite_half_and_counts_the_rest() -> None:
    """A chunk of fp16 bytes read as a decoder reads it gives numpy's float32 for each of the 63,488 finite
    halves (byte order and lookup), and its Inf and NaN are counted on the raw bits."""
    from edge_node.wire._expand import BITS, fill_dense

    halves = np.arange(1 << 16, dtype="<u2")
    expected = halves.view(np.float16).astype(np.float32)
    finite = np.isfinite(expected)
    out = np.zeros(halves.size, dtype=np.float32)
    assert fill_dense(np.frombuffer(halves.tobytes(), BITS[ValueType.FLOAT16]), out, ValueType.FLOAT16) == 2048
    assert int((~finite).sum()) == 2048 and not out.any()  # every Inf and NaN counted, nothing copied
    finite_bytes = halves[finite].tobytes()
    assert fill_dense(np.frombuffer(finite_bytes, BITS[ValueType.FLOAT16]), out[: finite.sum()], ValueType.FLOAT16) == 0
    assert np.array_equal(out[: finite.sum()].view(np.uint32), expected[finite].view(np.uint32))  # -0.0, subnormals


def test_a_message_with_more_chunks_than_announced_or_with_none_is_refused() -> None:
    weights, masks = random_model(14)
    messages = [m.SerializeToString() for m in encode(weights, masks, max_message_bytes=SMALL)]
    short = ProtoModelChunk.FromString(messages[0])
    announced = short.header.chunk_count
    short.header.chunk_count = max(short.header.message_count, len(SHAPES))  # fewer than the stream carries
    assert short.header.chunk_count < announced
    with pytest.raises(WireDecodeError, match=f"more than the {short.header.chunk_count} chunks its header announced"):
        decode_model([short.SerializeToString(), *messages[1:]], SPEC, "fleet-1")
    with pytest.raises(WireDecodeError, match="message 1 carries no tensors"):
        decode_model([messages[0], b"", *messages[1:]], SPEC, "fleet-1")
    with pytest.raises(WireDecodeError, match="message 1 is not a valid ModelChunk: a field runs past the end"):
        decode_model([messages[0], messages[1][:-1], *messages[2:]], SPEC, "fleet-1")


def test_a_tensor_field_sent_twice_or_encoded_long_is_refused_as_non_canonical() -> None:
    weights, masks = random_model(13)
    messages = [m.SerializeToString() for m in encode(weights, masks, max_message_bytes=SMALL)]
    tensor = ProtoModelChunk.FromString(messages[1]).tensors[0]
    body = tensor.SerializeToString()

    def message(inner: bytes) -> bytes:
        assert len(inner) < 2**14
        return b"\x12" + bytes([len(inner) & 0x7F | 0x80, len(inner) >> 7]) + inner

    assert message(body) == messages[1][: len(message(body))]
    nnz_again = body + b"\x30" + bytes([tensor.nnz & 0x7F | 0x80, tensor.nnz >> 7])  # field 6 twice: last wins
    long_start = body + b"\x40\x80\x00"  # field 8 (start) = 0 in a two-byte varint; a canonical sender omits it
    unpacked = b"".join(b"\x10" + bytes([d]) for d in tensor.shape) + body  # shape as unpacked int64s
    for inner in (nnz_again, long_start, unpacked):
        with pytest.raises(WireDecodeError, match="non-canonically encoded"):
            decode_model([messages[0], message(inner), *messages[2:]], SPEC, "fleet-1")


@contextlib.contextmanager
def _builders_held() -> Iterator[None]:
    """Every builder thread busy until the block ends, so that the chunks fed meanwhile queue up."""
    release, started = threading.Event(), threading.Semaphore(0)

    def hold() -> None:
        started.release()
        release.wait(10)

    workers = _build.BUILDERS.max_threads
    assert workers is not None
    for _ in range(workers):
        _build.BUILDERS.submit(hold)
    for _ in range(workers):
        assert started.acquire(timeout=10)
    try:
        yield
    finally:
        release.set()


def _idle_builds(decoder: ModelDecoder) -> list[_build.TensorBuild]:
    """The decoder's tensor builds, once none of them is running any more."""
    builds = [state.build for state in decoder._tensors.values()]
    deadline = time.monotonic() + 10
    while not all(b.idle for b in builds) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert all(b.idle for b in builds)
    return builds


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the tensors whose chunks a builder took, one entry a chunk."""
    names: list[str] = []
    take = _build.TensorBuild._take

    def counting_take(self: _build.TensorBuild, *args: object) -> None:
        names.append(self.name)
        take(self, *args)

    monkeypatch.setattr(_build.TensorBuild, "_take", counting_take)
    return names


@pytest.mark.parametrize("end", ["refused message", "abandoned call"])
def test_a_stream_given_up_part_way_drops_the_chunks_its_tensors_queued(end: str, built: list[str]) -> None:
    """A refused stream, or a call that ends part-way, costs no more building: queued chunks are dropped."""
    weights, masks = random_model(11)
    messages = copies(encode(weights, masks, max_message_bytes=SMALL))
    decoder = ModelDecoder(SPEC, "fleet-1")
    with _builders_held():
        for message in messages[:2]:
            decoder.feed(message)
        assert decoder.chunks >= 3 and not built  # queued behind the held builders
        if end == "refused message":
            bad = copies(messages[2:3])[0]
            bad.tensors[0].start += 8
            with pytest.raises(WireDecodeError, match="expected"):
                decoder.feed(bad)
        else:
            decoder.abandon()
    builds = _idle_builds(decoder)
    assert built == [] and all(b.cancelled for b in builds)
    with pytest.raises(WireDecodeError, match="abandoned"):
        decoder.feed(messages[2])
    with pytest.raises(WireDecodeError, match="abandoned"):
        decoder.finish()
    assert decode_model(messages, SPEC, "fleet-1").header.round == 7  # the builders are free for the next stream


def test_a_tensor_refused_by_its_build_drops_the_other_tensors_queued_chunks(built: list[str]) -> None:
    weights, masks = random_model(12)
    messages = copies(encode(weights, masks, max_message_bytes=SMALL))
    _nan_value(messages)  # fc2.weight, near the end
    decoder = ModelDecoder(SPEC, "fleet-1")
    for message in messages:
        decoder.feed(message)
    with pytest.raises(WireDecodeError, match="NaN or Inf"):
        decoder.finish()
    builds = _idle_builds(decoder)
    assert all(b.cancelled for b in builds)
    assert "fc2.weight" in built
