"""Screening peers before aggregation: honest spread passes, absurd magnitudes are refused, bounds hold."""

from __future__ import annotations

import math

import pytest
import torch

from edge_node.algorithm import (
    SGDConfig,
    aggregate,
    init_masks,
    load_weights,
    read_weights,
    robust,
    screen_peer_models,
    train_masked,
)
from edge_node.algorithm.robust import DEFAULT_MAX_ABS_RATIO, DEFAULT_OWN_ANCHOR, StatsMemo
from edge_node.errors import ConfigError
from edge_node.models import build_model

TIERS = (0.2, 0.5, 0.8, 1.0)


def masked(weights: dict[str, torch.Tensor], density: float, seed: int) -> tuple[dict, dict]:
    masks = init_masks(weights, density, torch.Generator().manual_seed(seed))
    return {n: w * masks[n] for n, w in weights.items()}, masks


def _stripes(classes: tuple[int, ...], n_batches: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Toy batches of only ``classes`` (non-iid clients): a class-dependent stripe in noise."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        y = torch.tensor(classes)[torch.randint(0, len(classes), (32,), generator=g)]
        x = torch.randn(32, 3, 32, 32, generator=g) * 0.1
        for i, label in enumerate(y.tolist()):
            x[i, :, 3 * label : 3 * label + 3, :] += 2.0
        out.append((x, y))
    return out


@pytest.fixture(scope="module")
def trained_clients() -> tuple[dict, list[tuple[dict, dict]]]:
    """The shared initial cnn and four clients trained from it at densities 0.2 .. 1.0, two classes each."""
    init = read_weights(build_model("cnn", seed=0))
    clients = []
    for i, density in enumerate(TIERS):
        model = build_model("cnn", seed=0)
        weights, masks = masked(read_weights(model), density, seed=i)
        load_weights(model, weights)
        train_masked(model, masks, _stripes((2 * i, 2 * i + 1), 8, seed=i), SGDConfig(lr=0.1))
        clients.append((read_weights(model), masks))
    return init, clients


def test_trained_honest_peers_are_accepted_by_each_other_and_by_a_fresh_node(trained_clients) -> None:
    init, clients = trained_clients
    for own_index, (own_w, own_m) in enumerate(clients):
        peers = [(f"c{j}", w, m) for j, (w, m) in enumerate(clients) if j != own_index]
        for k in range(1, len(peers) + 1):  # one peer (the median is then the own model) .. all
            result = screen_peer_models(own_w, own_m, peers[:k])
            assert result.accepted == [p[0] for p in peers[:k]] and not result.refused, result.refused
    fresh_w, fresh_m = masked(init, 0.5, seed=99)  # a node joining late, still at the initial weights
    for k in (1, len(clients)):
        result = screen_peer_models(fresh_w, fresh_m, [(f"c{j}", w, m) for j, (w, m) in enumerate(clients[:k])])
        assert not result.refused, result.refused


def test_groupnorm_zero_biases_of_a_fresh_node_do_not_refuse_trained_peers() -> None:
    init = read_weights(build_model("resnet18", seed=0))  # GroupNorm: weight 1, bias 0 at init
    assert any(name.endswith("bias") and not w.any() for name, w in init.items())
    g = torch.Generator().manual_seed(1)
    own_w, own_m = masked(init, 0.5, seed=0)
    peers = []
    for j, density in enumerate((0.2, 0.6, 1.0)):
        moved = {}
        for name, w in init.items():
            scale = math.exp(0.35 * float(torch.randn((), generator=g)))  # a tensor grows or shrinks up to ~3x
            drift = torch.randn(w.shape, generator=g) * (0.05 if w.dim() == 1 else float(w.std()) * 0.5)
            moved[name] = w * scale + drift
        peers.append((f"p{j}", *masked(moved, density, seed=10 + j)))
    for k in (1, 2, len(peers)):
        result = screen_peer_models(own_w, own_m, peers[:k])
        assert not result.refused, result.refused


def _attacks(honest: dict[str, torch.Tensor], mask: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    one_coordinate = {n: w.clone() for n, w in honest.items()}
    flat = one_coordinate["fc1.weight"].view(-1)
    flat[int(mask["fc1.weight"].view(-1).nonzero()[0])] = 1e6  # all the norm in one weight
    return {
        "huge": {n: torch.full_like(w, 3e38) for n, w in honest.items()},
        "large": {n: torch.full_like(w, 1e30) for n, w in honest.items()},
        "flipped": {n: -100.0 * w for n, w in honest.items()},  # sign flipped and scaled
        "one-bias": {**honest, "fc3.bias": torch.full_like(honest["fc3.bias"], 1e4)},
        "one-coordinate": one_coordinate,
    }


@pytest.mark.parametrize("colluders", [1, 2])  # with two honest peers and the own model: a minority
def test_absurd_peers_are_refused_naming_the_tensor(trained_clients, colluders: int) -> None:
    _init, clients = trained_clients
    own_w, own_m = clients[0]
    honest = [(f"h{j}", w, m) for j, (w, m) in enumerate(clients[1:3], start=1)]
    base_w, base_m = clients[3]
    for attack, weights in _attacks(base_w, base_m).items():
        bad = [(f"{attack}{i}", {n: w * base_m[n] for n, w in weights.items()}, base_m) for i in range(colluders)]
        result = screen_peer_models(own_w, own_m, [*honest, *bad])
        assert result.accepted == ["h1", "h2"], (attack, result)
        for peer_id, _w, _m in bad:
            assert result.refused[peer_id].startswith("tensor '"), result.refused
            assert "times the reference" in result.refused[peer_id]
        if attack == "one-bias":
            assert all(r.startswith("tensor 'fc3.bias'") for r in result.refused.values())


def test_unusable_peer_models_are_refused_with_a_reason(trained_clients) -> None:
    _init, clients = trained_clients
    own_w, own_m = clients[0]
    w, m = clients[1]
    nan = {**w, "fc2.bias": w["fc2.bias"].clone()}
    nan["fc2.bias"][0] = float("nan")
    peers = [
        ("nan", nan, m),
        ("missing", {k: v for k, v in w.items() if k != "fc3.weight"}, m),
        ("shape", {**w, "fc3.bias": torch.zeros(11)}, m),
        ("mask", w, {**m, "fc1.weight": m["fc1.weight"].float()}),
        ("ok", w, m),
    ]
    result = screen_peer_models(own_w, own_m, peers)
    assert result.accepted == ["ok"]
    assert result.refused == {
        "nan": "tensor 'fc2.bias': active values are NaN or infinite",
        "missing": "tensor 'fc3.weight': weights are not a floating-point tensor",
        "shape": "tensor 'fc3.bias': shape (11,), the node's is (10,)",
        "mask": "tensor 'fc1.weight': mask is not a bool tensor of shape (384, 1600)",
    }


def test_colluding_majority_is_bounded_by_the_own_model(trained_clients) -> None:
    _init, clients = trained_clients
    own_w, own_m = clients[0]
    base_w, base_m = clients[2]
    for scale in (30.0, 300.0, 1e6):  # five colluders, no honest peer: the median is theirs
        peers = [(f"x{i}", {n: scale * w for n, w in base_w.items()}, base_m) for i in range(5)]
        result = screen_peer_models(own_w, own_m, peers)
        floor = math.sqrt(sum(float((w * w).sum()) for w in own_w.values()) / sum(int(m.sum()) for m in own_m.values()))
        for peer_id, weights, mask in peers:
            if peer_id not in result.accepted:
                continue
            for name, w in weights.items():
                bound = DEFAULT_MAX_ABS_RATIO * DEFAULT_OWN_ANCHOR * max(float(own_w[name].abs().max()), floor)
                assert float(w[mask[name]].abs().max()) <= bound
        assert (scale == 1e6) == (len(result.accepted) == 0)


def test_screen_leaves_inputs_untouched_and_checks_its_arguments(trained_clients) -> None:
    _init, clients = trained_clients
    own_w, own_m = clients[0]
    before = {n: w.clone() for n, w in own_w.items()}
    screen_peer_models(own_w, own_m, [("a", *clients[1])])
    assert all(torch.equal(before[n], own_w[n]) for n in own_w)
    assert screen_peer_models(own_w, own_m, []).accepted == []
    with pytest.raises(ConfigError, match="max_rms_ratio=0.5"):
        screen_peer_models(own_w, own_m, [], max_rms_ratio=0.5)
    with pytest.raises(ConfigError, match="not distinct"):
        screen_peer_models(own_w, own_m, [("a", *clients[1]), ("a", *clients[2])])


def test_a_memo_screens_alike_computing_each_models_statistics_once(trained_clients, monkeypatch) -> None:
    """A simulated round's clients screen the same published models: one StatsMemo computes each one's once."""
    _init, clients = trained_clients
    nan = {**clients[1][0], "fc2.bias": clients[1][0]["fc2.bias"].clone()}
    nan["fc2.bias"][0] = float("nan")
    models = [*clients, (nan, clients[1][1]), ({n: 1e6 * w for n, w in clients[2][0].items()}, clients[2][1])]
    computed: list[int] = []
    real = robust.model_stats
    monkeypatch.setattr(robust, "model_stats", lambda w, m, names: computed.append(id(w)) or real(w, m, names))
    memo = StatsMemo()
    for own in range(len(clients)):  # every honest client screens every other model, as a round's clients do
        offers = [(f"m{j}", w, m) for j, (w, m) in enumerate(models) if j != own]
        plain = screen_peer_models(*models[own], offers, stats_of=real)
        assert set(plain.refused) == {"m4", "m5"}
        assert screen_peer_models(*models[own], offers, stats_of=memo) == plain
    assert sorted(computed) == sorted(id(w) for w, _m in models)  # once per model, a refused one's included


def _reference_aggregate(own_w, own_old, own_new, nws, nms):
    """The formula as it was before the overflow fallback (float32 only)."""
    out = {}
    for name, w in own_w.items():
        total, count = w * own_old[name], own_old[name].to(w.dtype)
        for nw, nm in zip(nws, nms, strict=True):
            total, count = total + nw[name] * nm[name], count + nm[name]
        out[name] = torch.where(count > 0, total / count.clamp_min(1), torch.zeros_like(total)) * own_new[name]
    return out


def test_aggregate_is_bit_identical_on_ordinary_inputs(trained_clients) -> None:
    _init, clients = trained_clients
    (own_w, own_m), *peers = clients
    args = (own_w, own_m, own_m, [w for w, _m in peers], [m for _w, m in peers])
    expected, got = _reference_aggregate(*args), aggregate(*args)
    assert all(torch.equal(expected[n].view(torch.int32), got[n].view(torch.int32)) for n in expected)


def test_aggregate_of_huge_finite_values_stays_finite() -> None:
    mask = {"w": torch.tensor([True, True, True, False])}
    own = {"w": torch.tensor([3e38, -3e38, 1.0, 0.0])}
    peers = [{"w": torch.tensor([3e38, -3e38, 2.0, 0.0])}, {"w": torch.tensor([3.4e38, 3e38, 3.0, 5.0])}]
    out = aggregate(own, mask, mask, peers, [mask, mask])["w"]
    assert bool(torch.isfinite(out).all())
    expected = torch.tensor([(3e38 + 3e38 + 3.4e38) / 3, (-3e38 - 3e38 + 3e38) / 3, 2.0, 0.0], dtype=torch.float64)
    assert torch.allclose(out.double(), expected, rtol=1e-6)
    assert bool(torch.isinf(_reference_aggregate(own, mask, mask, peers, [mask, mask])["w"]).any())  # as it was
