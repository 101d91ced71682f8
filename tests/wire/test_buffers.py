"""BatchNorm running statistics on the wire (protocol 1.3, ``norm_stats average``): dense float32 chunks
flagged ``buffer`` after the parameters, only to a caller that asked, validated like weights."""

from __future__ import annotations

import pytest
import torch
import xxhash

from edge_node.errors import WireDecodeError
from edge_node.wire import ModelSpec, ValueType, decode_model, encode_model, encoded_model_size
from edge_node.wire.codec import without_buffers
from edge_node.wire.messages import ProtoModelChunk
from tests.plugin_factories import TinyBNConv

FLEET = "fleet-1"


def _model() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyBNConv(3, 3)
    model.train()(torch.randn(6, 3, 8, 8) + 2)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    masks = {n: torch.rand(w.shape) < 0.6 for n, w in weights.items()}
    return {n: w * masks[n] for n, w in weights.items()}, masks, {n: b.clone() for n, b in model.named_buffers()}


WEIGHTS, MASKS, BUFFERS = _model()
PLAIN = ModelSpec.from_tensors("bnconv", 3, WEIGHTS)  # a node under local
SPEC = PLAIN.with_buffers(BUFFERS)  # a node under average
DENSITY = sum(int(m.sum()) for m in MASKS.values()) / sum(m.numel() for m in MASKS.values())


def encode(buffers=BUFFERS, spec=SPEC, **kwargs) -> list[ProtoModelChunk]:
    return encode_model(spec, WEIGHTS, MASKS, node_id="a", fleet_id=FLEET, round=2, density=DENSITY,
                        buffers=buffers, **kwargs)  # fmt: skip


def redigest(messages: list[ProtoModelChunk]) -> list[ProtoModelChunk]:
    digest = xxhash.xxh3_128()
    for message in messages[1:]:
        for tensor in message.tensors:
            digest.update(tensor.bitmap)
            digest.update(tensor.values)
    messages[0].header.payload_digest = digest.digest()
    return messages


def test_the_spec_keeps_the_arch_id_and_limits_count_the_buffers():
    assert SPEC.arch_id == PLAIN.arch_id and SPEC != PLAIN
    assert list(SPEC.buffers) == ["norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]


@pytest.mark.parametrize("value_type", [ValueType.FLOAT32, ValueType.FLOAT16])
def test_buffers_round_trip_dense_float32_after_the_weights(value_type):
    messages = encode(value_type=value_type, max_message_bytes=4096)
    flagged = [t for m in messages[1:] for t in m.tensors if t.buffer]
    assert [t.name for t in flagged] == list(BUFFERS) and all(t.dense and t.value_type == 1 for t in flagged)
    assert not any(t.buffer for t in messages[-2].tensors)  # messages of their own
    nnz = {n: int(m.sum()) for n, m in MASKS.items()}
    size = encoded_model_size(SPEC, nnz, value_type, 4096, node_id="a", fleet_id=FLEET, round=2, density=DENSITY,
                              buffers=True)  # fmt: skip
    assert size == sum(len(m.SerializeToString()) for m in messages)
    model = decode_model(messages, SPEC, FLEET)
    assert set(model.buffers) == set(BUFFERS)
    for name, value in BUFFERS.items():
        assert model.buffers[name].dtype == (torch.int64 if value.dtype == torch.int64 else torch.float32)
        assert torch.equal(model.buffers[name], value)
    plain = decode_model(
        encode(None, value_type=value_type), SPEC, FLEET
    )  # a local peer's stream: accepted, no buffers
    assert plain.buffers == {} and all(torch.equal(plain.weights[n], model.weights[n]) for n in WEIGHTS)


def test_a_stream_without_its_buffers_is_the_plain_stream():
    stripped = without_buffers(encode())
    plain = encode(buffers=None)
    assert [m.SerializeToString() for m in stripped] == [m.SerializeToString() for m in plain]
    assert decode_model(stripped, PLAIN, FLEET).buffers == {}


def _bad(mutate) -> list[ProtoModelChunk]:
    messages = encode()
    for message in messages[1:]:
        for tensor in message.tensors:
            if tensor.buffer:
                mutate(tensor)
    return redigest(messages)


def _nan(tensor):
    if tensor.name == "norm.running_mean":
        tensor.values = torch.full((8,), float("nan")).numpy().tobytes()


def _fraction(tensor):
    if tensor.name == "norm.num_batches_tracked":
        tensor.values = torch.tensor([1.5]).numpy().tobytes()


@pytest.mark.parametrize(
    ("messages", "spec", "expected"),
    [
        (lambda: _bad(_nan), SPEC, "'norm.running_mean': 8 values are NaN or Inf"),
        (lambda: encode(BUFFERS | {"norm.running_var": -BUFFERS["norm.running_var"]}), SPEC, "variances are negative"),
        (lambda: _bad(_fraction), SPEC, "is not a count >= 0"),
        (lambda: encode(BUFFERS | {"norm.running_mean": torch.zeros(4)}, PLAIN.with_buffers(
            BUFFERS | {"norm.running_mean": torch.zeros(4)})), SPEC, r"shape \(4,\) does not match the model's \(8,\)"),
        (lambda: encode(), PLAIN, "a buffer \\(running statistic\\) this node did not ask for"),
        (lambda: _drop_last(encode()), SPEC, "buffer 'norm.num_batches_tracked' is missing"),
    ],
)  # fmt: skip
def test_bad_buffers_are_refused(messages, spec, expected):
    with pytest.raises(WireDecodeError, match=expected):
        decode_model(messages(), spec, FLEET)


def _drop_last(messages: list[ProtoModelChunk]) -> list[ProtoModelChunk]:
    last = messages[-1]
    assert last.tensors[-1].name == "norm.num_batches_tracked"
    del last.tensors[-1]
    messages[0].header.chunk_count -= 1
    if not last.tensors:
        messages.pop()
        messages[0].header.message_count -= 1
    return redigest(messages)
