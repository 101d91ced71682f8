"""Every method of the paper's table on a tiny configuration: two rounds each, the same record fields, and
the accounting each method implies (Local sends nothing, FedAvg's busiest node is its server, D-PSGD pulls
dense models, sparse-to-sparser reaches its target density and never goes below it)."""

from __future__ import annotations

import pytest
import torch

from edge_node.algorithm import load_weights
from edge_node.algorithm.dispfl import ClientState
from edge_node.algorithm.masks import mask_density
from edge_node.algorithm.sparse_to_sparser import prune_state
from edge_node.data import load_dataset
from edge_node.data.batches import ClientData, ImagePool
from edge_node.models import build_model
from edge_node.records import SIM_KEYS, per_node
from edge_node.sim.checkpoint import CHECKPOINT_NAME, load_checkpoint
from edge_node.sim.config import METHODS, SimConfig
from edge_node.sim.methods import s2s
from edge_node.sim.methods.base import score
from edge_node.sim.runner import partition, run_simulation
from tests.sim.tiny import TINY, read_records

CNN_PARAMS = 797_962


@pytest.fixture(scope="module")
def demo():
    return load_dataset("demo")


@pytest.fixture(scope="module")
def runs(demo, tmp_path_factory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("methods")
    out = {}
    for method in METHODS:
        width = {"density": 0.6} if method == "heterofl" else {}  # width tiers: a tier's width (setting i)
        config = SimConfig(method=method, output=root / method, **{**TINY, **width})
        out[method] = read_records(run_simulation(config, demo))
    return out


def test_every_method_runs_two_rounds_with_the_same_record_fields(runs):
    for method, records in runs.items():
        assert [r["round"] for r in records] == [0, 1], method
        for r in records:
            assert tuple(r) == SIM_KEYS, method
            assert r["method"] == method and r["partition"] == "dir:0.3" and r["partition_variant"] == "reference"
            assert 0.0 <= r["acc_mean"] <= 1.0 and len(r["nodes"]) == 4
            assert r["flops_per_client_mean"] > 0 and r["busiest_node_bytes"] >= 0


def test_headline_accuracy_is_the_methods_own_metric(runs):
    for method in ("dispfl", "dispfl-s2s", "local", "dpsgd-ft", "fedavg-ft"):
        assert all(r["acc_mean"] == r["acc_after_mean"] for r in runs[method]), method
    for method in ("dpsgd", "fedavg"):
        assert all(r["acc_mean"] == r["acc_before_mean"] for r in runs[method]), method
    assert all(per_node(r, "acc_after") == [None] * 4 and r["acc_after_mean"] is None for r in runs["fedavg"])
    # dpsgd and dpsgd-ft are one trajectory, evaluated before / after the fine-tune of local training
    for a, b in zip(runs["dpsgd"], runs["dpsgd-ft"], strict=True):
        assert per_node(a, "acc_before") == per_node(b, "acc_before")
        assert per_node(a, "acc_after") == per_node(b, "acc_after")


def test_local_sends_and_receives_zero_bytes(runs):
    for r in runs["local"]:
        assert per_node(r, "bytes_in") == per_node(r, "bytes_out") == [0, 0, 0, 0]
        assert r["busiest_node_bytes"] == 0 and r["paper_comm_mb_busiest"] == 0.0
        assert r["server_bytes_in"] is None and r["density_mean"] == 1.0


def test_fedavg_busiest_node_is_the_server(runs):
    dense_mb = 4 * CNN_PARAMS / 1e6
    for method in ("fedavg", "fedavg-ft"):
        for r in runs[method]:
            assert r["busiest_node"] == "server" and r["trained_clients"] == 2
            assert r["server_bytes_in"] == sum(per_node(r, "bytes_out")) > 2 * 4 * CNN_PARAMS  # 2 dense models up
            assert r["server_bytes_out"] == sum(per_node(r, "bytes_in"))  # the global model down to the 2 sampled
            assert r["busiest_node_bytes"] == r["server_bytes_in"] + r["server_bytes_out"]
            assert r["paper_comm_mb_busiest"] == pytest.approx(2 * dense_mb)  # 2 received dense models
            assert sorted(b > 0 for b in per_node(r, "bytes_out")) == [False, False, True, True]


def test_dense_baselines_train_and_send_dense_models(runs):
    dispfl, dpsgd = runs["dispfl"][0], runs["dpsgd"][0]
    assert dpsgd["density_mean"] == 1.0 and dpsgd["prune_rate"] is None
    assert dpsgd["paper_comm_mb_mean"] == pytest.approx(2 * 4 * CNN_PARAMS / 1e6)  # 2 neighbours, dense
    assert dispfl["paper_comm_mb_mean"] < 0.6 * dpsgd["paper_comm_mb_mean"]  # density 0.5
    # FLOPs of dense training: E * n * 3 * F(dense); DisPFL's sparse training costs less
    assert dpsgd["flops_per_client_mean"] == pytest.approx(1 * 60 * 3 * dpsgd["forward_flops_dense"])
    assert dispfl["flops_per_client_mean"] < dpsgd["flops_per_client_mean"]
    assert runs["local"][0]["flops_per_client_mean"] == dpsgd["flops_per_client_mean"]


def test_sparse_to_sparser_reaches_its_target_density_and_never_goes_below(demo, tmp_path):
    target = 0.26
    config = SimConfig(
        method="dispfl-s2s", output=tmp_path / "s2s", density=0.28, target_density=target,
        s2s_stable_threshold=1e9,  # every client votes "stable" in round 1: pruning starts in round 2
        **{**TINY, "rounds": 5},
    )  # fmt: skip
    records = read_records(run_simulation(config, demo))
    # vote in round 1: prunes from T0 = 2 at gaps f0 = 1, round(1/1.3) = 1, ... (the authors' code; f0 = T0 = 2
    # would prune in rounds 2 and 4 only)
    assert [r["s2s_pruned"] for r in records] == [False, False, True, True, True]
    assert records[1]["s2s_start_round"] == 2 and records[1]["s2s_stable_fraction"] == 1.0
    densities = [r["density_mean"] for r in records]
    assert densities[:2] == pytest.approx([0.28, 0.28], abs=1e-4)
    assert all(d >= target for d in densities)
    assert densities[-1] == pytest.approx(target, abs=1e-5)
    # fewer active weights published: fewer bytes than before the prune
    assert records[-1]["paper_comm_mb_busiest"] < records[0]["paper_comm_mb_busiest"]
    assert records[-1]["busiest_node_bytes"] < records[0]["busiest_node_bytes"]


def test_sparse_to_sparser_reports_the_pruned_model_the_client_keeps(demo, tmp_path, monkeypatch):
    """In a prune round, acc_after and density_mean are those of the model each client keeps and publishes
    (the checkpoint's), not of the trained model before the prune; FLOPs are those of the training done.
    The prune here also zeroes the kept weights, so that the two models' accuracies cannot agree by chance
    (removing the smallest weights of a tiny model seldom changes a prediction)."""

    def prune_and_zero(state: ClientState, params):
        pruned = prune_state(state, params)
        return ClientState({k: torch.zeros_like(w) for k, w in pruned.weights.items()}, pruned.train_mask,
                           pruned.next_mask, pruned.density)  # fmt: skip

    monkeypatch.setattr(s2s, "prune_state", prune_and_zero)
    config = SimConfig(
        method="dispfl-s2s", output=tmp_path / "s2s", density=0.5, target_density=0.2, s2s_stable_threshold=1e9,
        **{**TINY, "rounds": 3},
    )  # fmt: skip
    records = read_records(run_simulation(config, demo))
    assert [r["s2s_pruned"] for r in records] == [False, False, True]
    last = records[-1]
    saved = load_checkpoint(config.run_dir / CHECKPOINT_NAME, torch.device("cpu"))
    kept = [mask_density(m) for m in saved["train_masks"]]
    assert last["density_mean"] == pytest.approx(sum(kept) / len(kept)) and max(kept) < 0.49  # pruned
    assert records[1]["density_mean"] == pytest.approx(0.5, abs=1e-3)
    model = build_model(config.model, demo.num_classes)
    pool = ImagePool.from_dataset(demo, torch.device("cpu"))
    train_parts, test_parts = partition(config, demo)
    for i, weights in enumerate(saved["weights"]):
        assert not any(bool(w.any()) for w in weights.values())
        load_weights(model, weights)
        data = ClientData.from_indices(pool, train_parts[i], test_parts[i])
        assert per_node(last, "acc_after")[i] == score(model, data, config.eval_batch_size), i
    assert per_node(last, "acc_after") != per_node(records[1], "acc_after")
    assert last["flops_per_client_mean"] == pytest.approx(records[1]["flops_per_client_mean"])  # trained at 0.5
