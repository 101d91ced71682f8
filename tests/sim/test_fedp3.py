"""FedP3 in the simulation: clients upload only their owned layers and the final layer (bytes follow the
layer sizes), and LDP-FedP3's spent epsilon grows with the rounds and is Opacus's own figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from edge_node.algorithm.fedp3 import layer_groups, owned_layers, uploaded_names
from edge_node.data import load_dataset
from edge_node.errors import ConfigError
from edge_node.models import build_model
from edge_node.records import per_node
from edge_node.sim.config import SimConfig
from edge_node.sim.runner import partition, run_simulation

TINY = dict(
    method="fedp3", clients=4, epochs=1, samples_per_client=60, batch_size=32, rounds=2, progress=False,
    energy_backend="estimate", seed=5,
)  # fmt: skip


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def demo():
    return load_dataset("demo")


def test_each_client_uploads_exactly_its_owned_layers_and_the_final_layer(demo, tmp_path):
    config = SimConfig(fedp3_layers="lowerb", output=tmp_path / "run", **TINY)
    records = _records(run_simulation(config, demo))
    sizes = {name: p.numel() for name, p in build_model("cnn", 10, seed=0).named_parameters()}
    groups = layer_groups(list(sizes))
    for r in records:
        values = [
            sum(
                sizes[n]
                for n in uploaded_names(groups, owned_layers("lowerb", i, 4, 4, seed=5, round_index=r["round"]))
            )
            for i in range(4)
        ]
        # client i owns hidden layer i: conv1 (4,864 + head), conv2 (102,464), fc1 (614,784), fc2 (73,920)
        assert values == [4864 + 1930, 102464 + 1930, 614784 + 1930, 73920 + 1930]
        # fp32 values, plus headers and the all-zero presence bitmap the wire format carries for every tensor
        # not sent (it has no "absent tensor"): one bit per unsent parameter
        total = sum(sizes.values())
        for sent, v in zip(per_node(r, "bytes_out"), values, strict=True):
            assert 0 <= sent - 4 * v - (total - v) / 8 <= 1024
        assert r["paper_comm_mb_mean"] == pytest.approx(4 * sum(values) / 4 / 1e6)
        assert r["server_bytes_in"] == sum(per_node(r, "bytes_out"))
        assert max(per_node(r, "bytes_out")) < 4 * sum(sizes.values())  # never the whole model


def test_ldp_spent_epsilon_grows_and_matches_opacus_for_the_same_noise(demo, tmp_path):
    config = SimConfig(privacy="ldp", epsilon=6.0, delta=1e-5, output=tmp_path / "ldp", **TINY)
    records = _records(run_simulation(config, demo))
    assert [r["privacy"] for r in records] == ["ldp", "ldp"]
    spent = [r["dp_epsilon_spent"] for r in records]
    assert 0 < spent[0] < spent[1] <= 6.0
    train, _ = partition(config, demo)
    expected = []
    for t in range(2):  # the library's own figure, client by client: its z for the budget, its steps so far
        per_client = []
        for idx in train:
            q, per_round = 32 / len(idx), math.ceil(len(idx) / 32)
            z = get_noise_multiplier(target_epsilon=6.0, target_delta=1e-5, sample_rate=q, steps=2 * per_round)
            accountant = RDPAccountant()
            for _ in range((t + 1) * per_round):
                accountant.step(noise_multiplier=z, sample_rate=q)
            per_client.append(accountant.get_epsilon(1e-5))
        expected.append(max(per_client))
    assert spent == pytest.approx(expected, rel=1e-6)
    assert spent[1] > 0.8 * 6.0  # the budget is (nearly) spent by the planned last round


def test_privacy_is_refused_for_methods_without_it_and_without_a_budget(tmp_path):
    with pytest.raises(ConfigError, match="not implemented for method dispfl"):
        SimConfig(method="dispfl", privacy="ldp", epsilon=1.0, output=tmp_path)
    with pytest.raises(ConfigError, match="needs --epsilon"):
        SimConfig(method="fedp3", privacy="ldp", output=tmp_path)
    with pytest.raises(ConfigError, match="delta"):
        SimConfig(method="fedp3", privacy="ldp", epsilon=1.0, delta=1.5, output=tmp_path)
