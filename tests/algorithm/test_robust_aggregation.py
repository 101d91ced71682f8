"""Robust aggregation (median, trimmed mean over the holders), the distance check, and the attacks they face."""

from __future__ import annotations

import math

import pytest
import torch

from edge_node.algorithm.aggregation import aggregate
from edge_node.algorithm.dispfl import ClientState, DisPFLParams, aggregate_peers
from edge_node.algorithm.poison import StaleModels, flipped_labels, parse_attack, poisoned
from edge_node.algorithm.robust_aggregation import distance_check, parse_aggregate, refusal_kind, robust_aggregate
from edge_node.errors import ConfigError


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _m(*bits: int) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.bool)


def test_median_and_trimmed_mean_count_only_the_holders() -> None:
    own, own_mask = {"w": _t(1, 0, 5, 2)}, {"w": _m(1, 0, 1, 1)}
    peers = [{"w": _t(3, 4, 0, 2)}, {"w": _t(100, 6, 0, 2)}, {"w": _t(2, 0, 0, -7)}]
    masks = [{"w": _m(1, 1, 0, 1)}, {"w": _m(1, 1, 0, 1)}, {"w": _m(1, 0, 0, 1)}]
    nxt = {"w": _m(1, 1, 1, 0)}
    median = robust_aggregate(own, own_mask, nxt, peers, masks, "median")["w"]
    # coordinate 0: holders 1, 3, 100, 2 -> (2 + 3) / 2; coordinate 1: 4, 6 -> 5 (two holders: their mean);
    # coordinate 2: the own 5 alone; coordinate 3: not on the next mask.
    assert median.tolist() == [2.5, 5.0, 5.0, 0.0]
    trimmed = robust_aggregate(own, own_mask, nxt, peers, masks, "trimmed:0.25")["w"]
    assert trimmed.tolist() == [2.5, 5.0, 5.0, 0.0]  # 4 holders: one dropped at each end; 2 holders: none
    untrimmed = robust_aggregate(own, own_mask, nxt, peers, masks, "trimmed:0")["w"]
    mean = aggregate(own, own_mask, nxt, peers, masks)["w"]
    assert torch.allclose(untrimmed, mean)  # trimmed:0 is the holders' mean


def test_a_coordinate_nobody_holds_is_zero_and_a_newly_regrown_one_takes_the_peers_median() -> None:
    own, own_mask, nxt = {"w": _t(0, 0)}, {"w": _m(0, 0)}, {"w": _m(1, 1)}
    got = robust_aggregate(own, own_mask, nxt, [{"w": _t(1, 0)}, {"w": _t(3, 0)}, {"w": _t(9, 0)}],
                           [{"w": _m(1, 0)}] * 3, "median")["w"]  # fmt: skip
    assert got.tolist() == [3.0, 0.0]


def test_the_median_resists_a_minority_the_mean_does_not() -> None:
    honest = _t(1.0, -1.0, 0.5)
    own, mask = {"w": honest}, {"w": _m(1, 1, 1)}
    peers = [{"w": honest + 0.01}, {"w": honest - 0.01}, {"w": -10 * honest}]  # one sign-flipped, scaled
    masks = [mask] * 3
    median = robust_aggregate(own, mask, mask, peers, masks, "median")["w"]
    mean = aggregate(own, mask, mask, peers, masks)["w"]
    assert torch.allclose(median, honest, atol=0.011)
    assert (mean - honest).abs().max() > 1.0


def test_aggregate_mean_is_dispfl_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    w = {"a": torch.randn(5, 3, generator=g), "b": torch.randn(7, generator=g)}
    m = {k: torch.rand(v.shape, generator=g) > 0.5 for k, v in w.items()}
    state = ClientState({k: v * m[k] for k, v in w.items()}, m, m, 0.5)
    peers = [({k: torch.randn(v.shape, generator=g) * m[k] for k, v in w.items()}, m) for _ in range(3)]
    got = aggregate_peers(state, peers, rule="mean").weights
    want = aggregate(state.weights, m, m, [p for p, _ in peers], [q for _, q in peers])
    assert all(torch.equal(got[k], want[k]) for k in w)


@pytest.mark.parametrize("spec", ["trimmed:0.5", "trimmed:-0.1", "trimmed:nan", "trimmed:", "trimmed:x", "max", ""])
def test_a_bad_aggregate_is_one_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="aggregate="):
        parse_aggregate(spec)
    with pytest.raises(ConfigError, match="aggregate="):
        DisPFLParams(aggregate=spec)


def test_parse_aggregate() -> None:
    assert parse_aggregate("mean") == ("mean", 0.0)
    assert parse_aggregate("median") == ("median", 0.0)
    assert parse_aggregate("trimmed:0.2") == ("trimmed", 0.2)


def _model(g: torch.Generator, base: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    mask = torch.rand(base.shape, generator=g) > 0.3
    return {"w": (base + 0.2 * torch.randn(base.shape, generator=g)) * mask}, {"w": mask}


def test_distance_check_refuses_flipped_noise_and_zero_peers_and_keeps_honest_ones() -> None:
    g = torch.Generator().manual_seed(1)
    base = torch.randn(2000, generator=g)
    own_w, own_m = _model(g, base)
    honest = [_model(g, base) for _ in range(3)]
    flipped_w, flipped_m = _model(g, base)
    attack_noise = parse_attack("noise")
    noise_w = poisoned(attack_noise, flipped_w, flipped_m, torch.Generator().manual_seed(2))
    peers = [(f"h{i}", w, m) for i, (w, m) in enumerate(honest)]
    peers += [("flip", poisoned(parse_attack("sign-flip"), flipped_w, flipped_m, g), flipped_m)]
    zero_w = poisoned(parse_attack("zero"), flipped_w, flipped_m, g)
    peers += [("noise", noise_w, flipped_m), ("zero", zero_w, flipped_m)]
    result = distance_check(own_w, own_m, peers)
    assert result.accepted == ["h0", "h1", "h2"]
    assert sorted(result.refused) == ["flip", "noise", "zero"]
    assert all(refusal_kind(reason) == "distance" for reason in result.refused.values())
    assert refusal_kind("tensor 'w': rms 9 is above 5") == "screened"


def test_robust_round_counts_distance_refusals_and_mean_has_none() -> None:
    from edge_node.algorithm.dispfl import RoundHooks, screen_and_aggregate

    g = torch.Generator().manual_seed(3)
    base = torch.randn(500, generator=g)
    own_w, own_m = _model(g, base)
    state = ClientState(own_w, own_m, own_m, 0.7)
    fw, fm = _model(g, base)
    offers = [("h", *_model(g, base)), ("flip", {"w": -fw["w"]}, fm)]
    hooks = RoundHooks(lambda e, gen: iter(()), lambda model: 0.0)
    _, accepted, refused = screen_and_aggregate(state, offers, hooks, rule="median")
    assert accepted == ["h"] and list(refused) == ["flip"]
    _, accepted, refused = screen_and_aggregate(state, offers, hooks, rule="mean")
    assert accepted == ["h", "flip"] and not refused


def test_attacks_transform_what_is_published() -> None:
    w, m = {"w": _t(1, -2, 0, 4)}, {"w": _m(1, 1, 0, 1)}
    g = torch.Generator().manual_seed(0)
    assert poisoned(parse_attack("sign-flip"), w, m, g)["w"].tolist() == [-1, 2, 0, -4]
    assert poisoned(parse_attack("scale:0.5"), w, m, g)["w"].tolist() == [0.5, -1, 0, 2]
    assert poisoned(parse_attack("zero"), w, m, g)["w"].tolist() == [0, 0, 0, 0]
    noise = poisoned(parse_attack("noise"), w, m, g)["w"]
    assert noise[2] == 0 and noise[m["w"]].abs().sum() > 0 and not torch.equal(noise, w["w"])
    assert poisoned(parse_attack("label-flip"), w, m, g)["w"] is w["w"]
    assert w["w"].tolist() == [1, -2, 0, 4]  # never modified
    batches = list(flipped_labels([(torch.zeros(3, 1), torch.tensor([0, 3, 9]))], 10))
    assert batches[0][1].tolist() == [9, 6, 0]


def test_stale_publishes_the_model_of_r_rounds_ago() -> None:
    stale = StaleModels(2)
    got = [stale.publish({"w": _t(r)}, {"w": _m(1)})[0]["w"].item() for r in range(5)]
    assert got == [0, 0, 0, 1, 2]


@pytest.mark.parametrize(
    ("spec", "rounds", "match"),
    [
        ("flip", None, "must be one of"),
        ("scale:0", None, "finite number above 0"),
        ("scale:-1", None, "finite number above 0"),
        ("scale:inf", None, "finite number above 0"),
        ("scale:nan", None, "finite number above 0"),
        ("scale:", None, "must be one of"),
        ("stale:0", None, "integer >= 1"),
        ("stale:x", None, "integer >= 1"),
        ("stale:11", 10, "beyond the run's 10 rounds"),
    ],
)
def test_a_bad_attack_is_one_config_error(spec: str, rounds: int | None, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_attack(spec, rounds)


def test_good_attacks_parse() -> None:
    assert parse_attack("scale:3").factor == 3.0
    assert parse_attack("stale:10", 10).rounds_back == 10
    assert parse_attack("stale:50", 0).rounds_back == 50  # a run until stopped has no last round
    assert math.isclose(parse_attack("scale:1e-3").factor, 1e-3)


def test_both_configs_take_the_aggregate_and_refuse_a_bad_one(tmp_path) -> None:
    from edge_node.node.config import NodeConfig
    from edge_node.sim.config import SimConfig

    assert SimConfig(aggregate="trimmed:0.2", output=tmp_path / "run").dispfl_params().aggregate == "trimmed:0.2"
    assert NodeConfig(aggregate="median").dispfl_params().aggregate == "median"
    assert NodeConfig().dispfl_params().aggregate == "mean"
    with pytest.raises(ConfigError, match="trimming fraction"):
        SimConfig(aggregate="trimmed:0.5", output=tmp_path / "run")
    with pytest.raises(ConfigError, match="must be one of"):
        NodeConfig(aggregate="krum")
