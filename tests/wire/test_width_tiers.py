"""Width tiers on the wire (protocol 1.5): a stream carries its tier's narrow shapes, checked where it enters."""

from __future__ import annotations

import pytest
import torch

from edge_node.errors import TierMismatch, WireDecodeError
from edge_node.net import ModelSnapshot, PeerAddress, PeerServer, pull_models
from edge_node.protocol import TIER_DENSITIES, tier_name
from edge_node.wire import ModelSpec, decode_model, encode_model, encoded_model_size
from tests.net.test_grpc_peer import FAST, serving
from tests.wire_models import PEER_FLEET as FLEET
from tests.wire_models import PEER_SHAPES, PEER_SPEC, kept_fraction


def _narrow(shape: tuple[int, ...], share: float) -> tuple[int, ...]:
    """A toy width: the first dimension of a hidden tensor shrinks (the classifier's outputs stay whole)."""
    return (max(1, round(shape[0] * share)), *shape[1:])


def _tiers() -> dict[str, dict[str, tuple[int, ...]]]:
    out = {}
    for d in TIER_DENSITIES:
        shapes = {name: shape if name.startswith("fc2") else _narrow(shape, d) for name, shape in PEER_SHAPES.items()}
        shapes["fc2.weight"] = (10, shapes["fc1.weight"][0])  # the next layer's inputs narrow with it
        shapes["fc1.weight"] = (shapes["fc1.weight"][0], 72)
        out[tier_name(d)] = shapes
    return out


WIDTH = PEER_SPEC.with_tiers("width", _tiers())


def held_at(tier: str, seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A width node's full-shape state: random weights on its tier's prefixes, zero and inactive elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    weights, masks = {}, {}
    for name, shape in PEER_SHAPES.items():
        index = tuple(slice(0, n) for n in WIDTH.tiers[tier][name])
        weights[name], masks[name] = torch.zeros(shape), torch.zeros(shape, dtype=torch.bool)
        weights[name][index] = torch.randn(WIDTH.tiers[tier][name], generator=gen)
        masks[name][index] = True
    return weights, masks


def encode(spec: ModelSpec, tier: str | None, weights, masks, node_id: str = "n1"):  # type: ignore[no-untyped-def]
    return encode_model(spec, weights, masks, node_id=node_id, fleet_id=FLEET, round=2,
                        density=kept_fraction(masks), tier=tier)  # fmt: skip


def test_a_stream_carries_its_tiers_prefixes_and_arrives_in_full_shapes() -> None:
    weights, masks = held_at("0.4")
    messages = encode(WIDTH, "0.4", weights, masks)
    assert (messages[0].header.tier_mode, messages[0].header.tier) == ("width", "0.4")
    sent = {t.name: tuple(t.shape) for m in messages[1:] for t in m.tensors}
    assert sent == dict(WIDTH.tiers["0.4"]) and all(t.dense for m in messages[1:] for t in m.tensors)
    nnz = {name: int(m.sum()) for name, m in masks.items()}
    size = encoded_model_size(WIDTH, nnz, node_id="n1", fleet_id=FLEET, round=2, density=kept_fraction(masks),
                              tier="0.4")  # fmt: skip
    assert size == sum(len(m.SerializeToString()) for m in messages)
    full = encode(PEER_SPEC, None, weights, masks)  # the same model under mask tiers: full-shape bitmaps
    assert sum(len(m.SerializeToString()) for m in messages) < sum(len(m.SerializeToString()) for m in full)
    model = decode_model(messages, WIDTH, FLEET)
    assert model.header.identity.tier == "0.4"
    for name in PEER_SHAPES:
        assert torch.equal(model.weights[name], weights[name]) and torch.equal(model.masks[name], masks[name])


def test_a_mask_stream_has_no_tier_fields_as_in_1_4() -> None:
    weights, masks = held_at("1.0")
    header = encode(PEER_SPEC, None, weights, masks)[0].header
    assert (header.tier_mode, header.tier) == ("", "")


def test_streams_of_another_tier_mode_are_refused_both_ways() -> None:
    weights, masks = held_at("0.6")
    with pytest.raises(TierMismatch, match="stream is of tier mode width, this node runs tier mode mask"):
        decode_model(encode(WIDTH, "0.6", weights, masks), PEER_SPEC, FLEET)
    with pytest.raises(TierMismatch, match=r"tier mode mask \(its header names none\), this node runs tier mode width"):
        decode_model(encode(PEER_SPEC, None, weights, masks), WIDTH, FLEET)
    both = PEER_SPEC.with_tiers("both", _tiers())
    with pytest.raises(TierMismatch, match="tier mode width, this node runs tier mode both"):
        decode_model(encode(WIDTH, "0.6", weights, masks), both, FLEET)


def test_a_peer_sending_another_tiers_shapes_than_its_header_names_is_refused() -> None:
    weights, masks = held_at("0.4")
    messages = encode(WIDTH, "0.4", weights, masks)
    messages[0].header.tier = "0.6"
    with pytest.raises(TierMismatch, match=r"shape \(\d+, 3, 3, 3\) is not the prefix \(\d+, 3, 3, 3\) of tier '0.6'"):
        decode_model(messages, WIDTH, FLEET)
    messages[0].header.tier = "0.5"
    with pytest.raises(WireDecodeError, match="tier"):
        decode_model(messages, WIDTH, FLEET)
    messages[0].header.tier, messages[0].header.tier_mode = "0.4", "depth"
    with pytest.raises(TierMismatch, match="tier_mode='depth' is not one of mask, width, both"):
        decode_model(messages, WIDTH, FLEET)


def test_a_sender_cannot_publish_weights_outside_its_tiers_prefix() -> None:
    weights, masks = held_at("0.6")
    with pytest.raises(ValueError, match="active weights lie outside the tier's prefix"):
        encode(WIDTH, "0.2", weights, masks)
    with pytest.raises(ValueError, match="tier 'None' is not one of"):
        encode(WIDTH, None, weights, masks)


def test_specs_refuse_tiers_that_are_not_prefixes_or_incomplete() -> None:
    bad = _tiers()
    bad["0.2"] = {**bad["0.2"], "conv1.bias": (9,)}
    with pytest.raises(ValueError, match="tier 0.2's shapes are not prefixes"):
        PEER_SPEC.with_tiers("width", bad)
    with pytest.raises(ValueError, match="needs the shapes of every tier"):
        PEER_SPEC.with_tiers("width", {"0.2": _tiers()["0.2"]})
    with pytest.raises(ValueError, match="not mask"):
        PEER_SPEC.with_tiers("mask", _tiers())
    assert WIDTH.arch_id == PEER_SPEC.arch_id  # a narrow model's coordinates are the full model's


def test_a_server_refuses_a_caller_of_another_tier_mode_and_counts_it() -> None:
    weights, masks = held_at("0.4")
    server = PeerServer(WIDTH, node_id="srv", fleet_id=FLEET, tier="0.4")
    server.publish(ModelSnapshot(weights, masks, 3, kept_fraction(masks), "srv", FLEET, WIDTH.arch_id, "0.4"))
    with serving(server) as port:
        peer = PeerAddress("srv", "127.0.0.1", port)
        refused = pull_models([peer], PEER_SPEC, FLEET, **FAST)  # a mask node (or one of 1.4: no tier mode)
        assert str(refused.failures["srv"]).startswith(
            "refused: FAILED_PRECONDITION: caller's tier mode mask is not this node's width"
        )
        pulled = pull_models([peer], WIDTH, FLEET, **FAST)
        assert list(pulled.received) == ["srv"] and torch.equal(pulled.received["srv"].masks["fc1.weight"],
                                                                 masks["fc1.weight"])  # fmt: skip
    assert server.refusals() == {"tier-mode": 1}


def test_a_receiver_refuses_a_stream_of_another_mode_from_a_lying_server() -> None:
    """A server that takes a width caller's request but streams full mask shapes: refused where it enters (tier)."""
    weights, masks = held_at("0.4")
    liar = PeerServer(WIDTH, node_id="liar", fleet_id=FLEET, tier="0.4")
    liar.publish_messages(encode(PEER_SPEC, None, weights, masks, "liar"), round=3, density=kept_fraction(masks))
    with serving(liar) as port:
        result = pull_models([PeerAddress("liar", "127.0.0.1", port)], WIDTH, FLEET, **FAST)
    failure = result.failures["liar"]
    assert failure.kind == "tier" and "this node runs tier mode width" in failure.detail and not result.received
