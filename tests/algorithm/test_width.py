"""Width tiers' coordinate space (edge_node.algorithm.width) and the built-in models' nested sub-networks."""

from __future__ import annotations

import pytest
import torch

from edge_node.algorithm.flops import weight_positions
from edge_node.algorithm.width import (
    choose_width,
    dense_flops,
    narrow,
    outside_prefix,
    prefix_masks,
    prefix_problem,
    widen,
)
from edge_node.errors import ModelError
from edge_node.models import MODEL_NAMES, build_model, build_width_model, width_channels

FULL = {"a.weight": (8, 4, 3, 3), "a.bias": (8,), "head.weight": (10, 8)}


def test_prefix_problem_names_what_is_not_a_prefix():
    assert prefix_problem(FULL, {"a.weight": (4, 4, 3, 3), "a.bias": (4,), "head.weight": (10, 4)}) is None
    assert "not a prefix" in prefix_problem(FULL, {**FULL, "a.bias": (9,)})
    assert "no channel" in prefix_problem(FULL, {**FULL, "a.bias": (0,)})
    assert "lacks 'head.weight'" in prefix_problem(FULL, {"a.weight": (8, 4, 3, 3), "a.bias": (8,)})
    assert "not a prefix" in prefix_problem(FULL, {**FULL, "head.weight": (10, 8, 1)})


def test_narrow_and_widen_move_exactly_the_prefix():
    full = {name: torch.randn(shape) for name, shape in FULL.items()}
    shapes = {"a.weight": (3, 4, 3, 3), "a.bias": (3,), "head.weight": (10, 3)}
    part = narrow(full, shapes)
    assert {n: tuple(t.shape) for n, t in part.items()} == shapes
    assert torch.equal(part["head.weight"], full["head.weight"][:, :3])
    changed = widen(full, {n: t + 1 for n, t in part.items()})
    masks = prefix_masks(FULL, shapes)
    for name in FULL:
        assert torch.equal(changed[name][masks[name]], full[name][masks[name]] + 1)
        assert torch.equal(changed[name][~masks[name]], full[name][~masks[name]])
        assert outside_prefix(masks[name], shapes[name]) == 0
    assert outside_prefix(torch.ones(8, dtype=torch.bool), (3,)) == 5


def test_choose_width_takes_the_widest_model_within_the_flops_share():
    positions = {"a.weight": 100.0, "head.weight": 1.0}

    def shapes_at(w: float) -> dict[str, tuple[int, ...]]:
        c = max(1, -(-int(w * 8 * 1000) // 1000))  # ceil(8 w)
        return {"a.weight": (c, 4, 3, 3), "head.weight": (10, c)}

    full = dense_flops(positions, shapes_at(1.0))
    choice = choose_width(shapes_at, positions, 0.4)
    assert choice.flop_share <= 0.4 and choice.flop_share == dense_flops(positions, shapes_at(choice.width)) / full
    wider = shapes_at(choice.width + 1 / 8)
    assert dense_flops(positions, wider) / full > 0.4  # one more channel would exceed the share
    assert choose_width(shapes_at, positions, 1.0).width == 1.0
    tiny = choose_width(shapes_at, positions, 0.01)  # even one channel exceeds 1 %: the narrowest, its real share
    assert shapes_at(tiny.width)["a.weight"][0] == 1 and tiny.flop_share > 0.01
    with pytest.raises(ValueError, match="share=0"):
        choose_width(shapes_at, positions, 0.0)


def test_width_channels_keep_channels_per_group():
    assert width_channels(64, 0.2) == 13
    assert width_channels(64, 0.2, 32) == 14  # 2 channels per group: 13 -> 14 (7 groups)
    assert width_channels(512, 0.01, 32) == 16  # never fewer than one group
    assert width_channels(64, 1.0, 32) == 64


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_builtin_models_at_width_one_are_todays_and_narrow_ones_are_prefixes(name):
    today = build_model(name, 10, seed=3)
    same = build_width_model(name, 10, (3, 32, 32), 1.0, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(today.parameters(), same.parameters(), strict=True))
    full = {n: tuple(p.shape) for n, p in today.named_parameters()}
    positions = weight_positions(today, (3, 32, 32))

    def shapes_at(w: float) -> dict[str, tuple[int, ...]]:
        with torch.device("meta"):
            return {n: tuple(p.shape) for n, p in build_model(name, 10, width=w).named_parameters()}

    choice = choose_width(shapes_at, positions, 0.2)
    small = build_width_model(name, 10, (3, 32, 32), choice.width)
    assert prefix_problem(full, {n: tuple(p.shape) for n, p in small.named_parameters()}) is None
    assert 0.1 < choice.flop_share <= 0.2
    assert small(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    for module in small.modules():  # GroupNorm keeps the full model's channels per group
        if isinstance(module, torch.nn.GroupNorm):
            assert module.num_channels // module.num_groups in (2, 4, 8, 16)


def test_a_plugin_opts_in_by_accepting_width_and_must_nest():
    small = build_width_model("tests.plugin_factories:nested_mlp", 3, (12,), 0.5)
    assert small.fc1.weight.shape == (8, 12)
    with pytest.raises(ModelError, match="does not accept a width argument"):
        build_width_model("tests.plugin_factories:tiny_mlp", 3, (12,), 0.5)
    with pytest.raises(ModelError, match="not a nested sub-network: parameter 'fc1.weight' has shape"):
        build_width_model("tests.plugin_factories:unnested_mlp", 3, (12,), 0.5)
    with pytest.raises(ModelError, match=r"width=0 must be in \(0, 1\]"):
        build_model("cnn", 10, width=0)


# ----- a width tier's client round (edge_node.algorithm.dispfl on a narrow model)


def _mlp_batches(epochs, generator):
    for _ in range(epochs * 2):
        x = torch.randn(16, 12, generator=generator)
        yield x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def _round(state, offers, model, client):
    from edge_node.algorithm.dispfl import DisPFLParams, RoundHooks, client_round

    hooks = RoundHooks(_mlp_batches, lambda m: 0.5)
    params = DisPFLParams(epochs=1, batch_size=16, regrow="gradient")
    return client_round(state, offers, model, 0, params, seed=1, client=client, hooks=hooks)


def test_a_narrow_client_trains_its_prefix_only_and_aggregates_with_a_wider_peer():
    from edge_node.algorithm.dispfl import aggregate_peers, published, start

    name = "tests.plugin_factories:nested_mlp"
    full_model = build_model(name, 3, seed=0, input_shape=(12,))
    narrow_model = build_width_model(name, 3, (12,), 0.5)
    init = {n: p.detach().clone() for n, p in full_model.named_parameters()}
    within = {n: tuple(p.shape) for n, p in narrow_model.named_parameters()}
    full_shapes = {n: tuple(w.shape) for n, w in init.items()}
    prefix = prefix_masks(full_shapes, within)

    narrow_client = start(init, 0.5, seed=1, client=0, within=within)
    for n, m in narrow_client.train_mask.items():
        assert not (m & ~prefix[n]).any(), f"{n}: a mask position outside the prefix"
    assert sum(int(m.sum()) for m in narrow_client.train_mask.values()) < 0.6 * sum(
        int(p.sum()) for p in prefix.values()
    )
    wide_client = start(init, 1.0, seed=1, client=1)

    done = _round(narrow_client, [("wide", *published(wide_client))], narrow_model, 0)
    assert {n: tuple(w.shape) for n, w in done.trained.state.weights.items()} == within  # trained narrow
    for n, w in done.state.weights.items():
        assert tuple(w.shape) == full_shapes[n]
        assert not done.state.train_mask[n][~prefix[n]].any() and not done.state.next_mask[n][~prefix[n]].any()
        assert not w[~prefix[n]].any(), f"{n}: a weight outside the prefix"
    assert any(not torch.equal(done.state.weights[n], narrow_client.weights[n]) for n in init)

    # the wide client pulls the narrow one: where the narrow peer holds a coordinate the two are averaged, elsewhere
    # the wide client's own value stays (DisPFL's intersection weighting, per coordinate)
    merged = aggregate_peers(wide_client, [published(done.state)])
    for n, w in merged.weights.items():
        held = done.state.train_mask[n]
        assert torch.allclose(w[held], (wide_client.weights[n][held] + done.state.weights[n][held]) / 2)
        assert torch.equal(w[~held], wide_client.weights[n][~held])
    wide = _round(wide_client, [("narrow", *published(done.state))], full_model, 1)
    assert tuple(wide.trained.state.weights["fc1.weight"].shape) == full_shapes["fc1.weight"]
    assert all(wide.state.train_mask[n].all() for n in init)  # dense stays dense


def test_retier_across_widths_moves_the_mask_to_the_new_prefix():
    """A node whose tier moves (capacity auto, width tiers): narrower drops what lay beyond, wider regrows into
    its new channels; the mask never leaves the new prefix and a width tier's is whole inside it."""
    from edge_node.algorithm.dispfl import retier, start

    name = "tests.plugin_factories:nested_mlp"
    init = {n: p.detach().clone() for n, p in build_model(name, 3, seed=0, input_shape=(12,)).named_parameters()}
    full = {n: tuple(w.shape) for n, w in init.items()}
    half = {n: tuple(p.shape) for n, p in build_width_model(name, 3, (12,), 0.5).named_parameters()}
    quarter = {n: tuple(p.shape) for n, p in build_width_model(name, 3, (12,), 0.25).named_parameters()}
    state = start(init, 1.0, seed=1, client=0, within=half)
    for target, density in ((quarter, 1.0), (half, 1.0), (quarter, 0.5)):
        moved = retier(state, density, 3, seed=1, client=0, within=target)
        inside = prefix_masks(full, target)
        for n, m in moved.next_mask.items():
            assert not (m & ~inside[n]).any(), f"{n}: outside the new prefix"
        held = sum(int(m.sum()) for m in moved.next_mask.values())
        room = sum(int(p.sum()) for p in inside.values())
        assert held == room if density == 1.0 else 0.4 * room < held < 0.6 * room
        assert all(torch.equal(moved.train_mask[n], state.train_mask[n]) for n in init)  # what was published stays
    wider = retier(start(init, 1.0, seed=1, client=0, within=quarter), 1.0, 3, seed=1, client=0, within=half)
    assert all(torch.equal(wider.next_mask[n], prefix_masks(full, half)[n]) for n in init)  # its new channels grow


@pytest.mark.parametrize("name", ["cnn", "resnet18"])
def test_the_full_model_zero_outside_a_prefix_computes_what_the_narrow_model_computes(name):
    """What a width node hands its application (handover, export): the full-shape model, zero outside its prefix."""
    torch.manual_seed(0)
    narrow_model = build_width_model(name, 10, (3, 32, 32), 0.4).eval()
    with torch.no_grad():
        for p in narrow_model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # GroupNorm's affine away from 1 and 0 too
    full_model = build_model(name, 10, seed=0, input_shape=(3, 32, 32)).eval()
    zeros = {n: torch.zeros_like(p) for n, p in full_model.named_parameters()}
    full_model.load_state_dict(widen(zeros, dict(narrow_model.named_parameters())), strict=False)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(full_model(x), narrow_model(x), atol=1e-4)
