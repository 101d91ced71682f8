"""Property: any masks, shapes and value types round-trip bit-exactly, in exactly the predicted bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_node.wire import ModelSpec, ValueType, decode_model, encode_model, encoded_model_size

shapes = st.lists(st.integers(min_value=0, max_value=40), min_size=0, max_size=3).map(tuple)
SPECIAL = np.array([0.0, -0.0, 1e-40, -1e-45, 65504.0, -2.5, 3.0e-5], dtype=np.float32)  # signed zero, subnormals


@st.composite
def models(draw):
    tensor_shapes = draw(st.lists(shapes, min_size=1, max_size=5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weights, masks = {}, {}
    for i, shape in enumerate(tensor_shapes):
        name = f"layer{i}.weight"
        values = np.asarray(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 3), dtype=np.float32)
        flat = values.reshape(-1)
        if flat.size:
            picks = rng.integers(0, flat.size, size=min(4, flat.size))
            flat[picks] = rng.choice(SPECIAL, size=picks.size)
        density = draw(st.sampled_from([0.0, 0.05, 0.5, 0.97, 1.0]))
        weights[name] = torch.from_numpy(values)
        masks[name] = torch.from_numpy(np.asarray(rng.random(shape) < density))
    value_type = draw(st.sampled_from(list(ValueType)))
    budget = draw(st.sampled_from([4096, 5000, 1 << 20]))
    return weights, masks, value_type, budget


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models())
def test_round_trip_is_bit_exact_and_size_is_exact(model) -> None:
    weights, masks, value_type, budget = model
    spec = ModelSpec.from_tensors("prop", 3, weights)
    total = sum(m.numel() for m in masks.values())
    density = sum(int(m.sum()) for m in masks.values()) / total if total else 0.5
    if density == 0.0:  # a model keeps at least one weight: density 0 is refused (the one rule, (0, 1])
        with pytest.raises(ValueError, match=r"density=0\.0 must be a number in \(0, 1\]"):
            encode_model(spec, weights, masks, node_id="n1", fleet_id="f", round=5, density=density)
        return
    messages = encode_model(
        spec, weights, masks, node_id="n1", fleet_id="f", round=5, density=density,
        value_type=value_type, max_message_bytes=budget,
    )  # fmt: skip
    assert all(m.ByteSize() <= budget for m in messages)
    nnz = {name: int(mask.sum()) for name, mask in masks.items()}
    predicted = encoded_model_size(spec, nnz, value_type, budget, node_id="n1", fleet_id="f", round=5, density=density)
    assert predicted == sum(len(m.SerializeToString()) for m in messages)
    decoded = decode_model([m.SerializeToString() for m in messages], spec, "f")
    assert decoded.wire_bytes == predicted
    for name, weight in weights.items():
        expected = torch.where(masks[name], weight.to(value_type.torch_dtype).to(torch.float32), torch.zeros(()))
        assert torch.equal(decoded.masks[name], masks[name])
        assert torch.equal(decoded.weights[name].view(torch.int32), expected.view(torch.int32)), name
