"""Width tiers in the simulation (``--tier-mode``): what each mode trains, and the settings refused with it."""

from __future__ import annotations

import pytest
import torch

from edge_node.data import load_dataset
from edge_node.errors import ConfigError
from edge_node.sim.checkpoint import CHECKPOINT_NAME
from edge_node.sim.config import SimConfig
from edge_node.sim.runner import run_simulation
from tests.sim.tiny import TINY, read_records

FIVE_TIERS = {**TINY, "clients": 5, "rounds": 1, "setting": "ii"}


def _client_densities(out):
    saved = torch.load(out / CHECKPOINT_NAME, weights_only=True)
    masks = saved["state"]["train_masks"] if "state" in saved else saved["train_masks"]
    return [sum(int(m.sum()) for m in mask.values()) / sum(m.numel() for m in mask.values()) for mask in masks]


@pytest.mark.parametrize("mode", ["width", "both"])
def test_width_tiers_train_nested_prefixes(mode, tmp_path):
    out = run_simulation(SimConfig(output=tmp_path / mode, tier_mode=mode, **FIVE_TIERS), load_dataset("demo"))
    [record] = read_records(out)
    assert 0.0 <= record["acc_mean"] <= 1.0 and record["flops_per_client_mean"] > 0
    densities = _client_densities(out)
    # client i has tier i mod 5 (0.2 .. 1.0): a wider tier holds more of the full model's coordinates
    assert densities == sorted(densities) and densities[0] < 0.35
    assert densities[-1] == (1.0 if mode == "width" else pytest.approx(0.5, abs=0.01))


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"method": "fedavg"}, "tier_mode width is not implemented for method fedavg"),
        ({"tier_mode": "both", "setting": "i"}, "tier_mode both .* needs setting ii"),
        ({"setting": "i", "density": 0.5}, "under setting i .* must be a tier"),
        ({"trainable": ["fc3.*"]}, "trainable .* is refused with it"),
        ({"privacy": "dp-sgd", "epsilon": 8.0}, "tier_mode width with privacy 'dp-sgd' is not implemented"),
    ],
)
def test_width_tiers_refuse_what_they_cannot_train(settings, refusal, tmp_path):
    values = {**FIVE_TIERS, "tier_mode": "width", "output": tmp_path / "x", **settings}
    with pytest.raises(ConfigError, match=refusal):
        SimConfig(**values)


def test_heterofl_averages_nested_prefixes_over_their_holders(tmp_path):
    from edge_node.algorithm.heterofl import aggregate_nested

    server = {"w": torch.zeros(4, 2)}
    merged = aggregate_nested(server, [{"w": torch.ones(2, 2)}, {"w": torch.full((4, 2), 3.0)}])
    assert merged["w"][:2].eq(2.0).all() and merged["w"][2:].eq(3.0).all()  # 2 holders, then 1
    assert aggregate_nested(server, [{"w": torch.ones(1, 1)}])["w"].sum() == 1.0  # held by none: the server's

    config = SimConfig(method="heterofl", output=tmp_path / "h", **{**FIVE_TIERS, "fedavg_clients": 5})
    assert config.tier_mode == "width"  # HeteroFL trains whole narrow models
    [record] = read_records(run_simulation(config, load_dataset("demo")))
    assert record["method"] == "heterofl" and 0.0 <= record["acc_mean"] <= 1.0
    assert record["server_bytes_in"] > 0 and record["density_mean"] == 1.0  # the server's global model
