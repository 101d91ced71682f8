"""FedSpa, FedSpa-RSM, Ditto and Sub-FedAvg on the tiny configuration: what each method promises of its
clients' models (read back from the run's checkpoint: the clients' entries, then the server's), its bytes,
and that a run of them resumes where it stopped."""

from __future__ import annotations

import math

import pytest
import torch

from edge_node.algorithm.dispfl import start
from edge_node.algorithm.fedavg import sample_clients
from edge_node.algorithm.masks import active_counts, erk_densities
from edge_node.algorithm.sub_fedavg import prunable, round_rate
from edge_node.data import load_dataset
from edge_node.records import per_node
from edge_node.sim.checkpoint import CHECKPOINT_NAME, load_checkpoint
from edge_node.sim.config import SimConfig
from edge_node.sim.runner import run_simulation
from edge_node.sim.table import build_table, read_run
from tests.sim.tiny import TINY, read_records


@pytest.fixture(scope="module")
def demo():
    return load_dataset("demo")


def _run(demo, out, **settings):
    config = SimConfig(output=out, **{**TINY, **settings})
    run_dir = run_simulation(config, demo)
    return config, read_records(run_dir), load_checkpoint(run_dir / CHECKPOINT_NAME, torch.device("cpu"))


def _nnz(mask: dict[str, torch.Tensor]) -> dict[str, int]:
    return {name: int(m.sum()) for name, m in mask.items()}


def test_fedspa_keeps_every_client_at_exactly_its_density_while_its_masks_move(demo, tmp_path):
    config, records, saved = _run(demo, tmp_path / "fedspa", method="fedspa", setting="ii", rounds=3)
    *clients, server = saved["train_masks"]
    shapes = {name: tuple(m.shape) for name, m in server.items()}
    tiers = [0.2, 0.4, 0.6, 0.8]  # setting ii: client i at tier i mod 5
    initial = [start(dict(zip(shapes, (torch.zeros(s) for s in shapes.values()), strict=True)), d, seed=config.seed,
                     client=0).train_mask for d in tiers]  # fmt: skip
    for mask, d, first in zip(clients, tiers, initial, strict=True):
        assert _nnz(mask) == active_counts(shapes, erk_densities(shapes, d))  # exactly, tensor by tensor
        assert _nnz(first) == _nnz(mask)
    moved = [any(not torch.equal(m[n], f[n]) for n in m) for m, f in zip(clients, initial, strict=True)]
    trained = {i for t in range(3) for i in sample_clients(4, 2, config.seed, t)}
    assert [moved[i] for i in range(4)] == [i in trained for i in range(4)] and any(moved)
    assert all(bool(m.all()) for m in server.values())  # the server's model is dense
    for weights, mask in zip(saved["weights"][:-1], clients, strict=True):  # personal model = m_k * W
        assert all(torch.equal(weights[n], saved["weights"][-1][n] * mask[n]) for n in mask)
    for r in records:
        assert r["density_mean"] == pytest.approx(sum(
            sum(active_counts(shapes, erk_densities(shapes, d)).values()) for d in tiers) / 4 / sum(
            math.prod(s) for s in shapes.values()))  # fmt: skip
        assert r["prune_rate"] == pytest.approx(0.25 * (1 + math.cos(math.pi * r["round"] / 3)))
        assert r["busiest_node"] == "server" and r["trained_clients"] == 2
        assert r["server_bytes_in"] == sum(per_node(r, "bytes_out"))
        assert r["server_bytes_out"] == sum(per_node(r, "bytes_in"))
        mask_bytes = sum(math.ceil(math.prod(s) / 8) for s in shapes.values())  # the next mask, a raw bitmap
        for sent, down in zip(per_node(r, "bytes_out"), per_node(r, "bytes_in"), strict=True):
            assert sent == down == 0 or mask_bytes <= sent - down <= mask_bytes + 16


def test_fedspa_rsm_masks_never_change_and_are_one_mask_for_all(demo, tmp_path):
    config, records, saved = _run(demo, tmp_path / "rsm", method="fedspa-rsm", density=0.3)
    *clients, server = saved["train_masks"]
    shapes = {name: tuple(m.shape) for name, m in server.items()}
    first = start({n: torch.zeros(s) for n, s in shapes.items()}, 0.3, seed=config.seed, client=0).train_mask
    for mask in clients:
        assert all(torch.equal(mask[n], first[n]) for n in first)
    assert all(r["prune_rate"] is None for r in records)
    # an upload is the update on the mask, with no mask beside it: the bytes of the model sent down (headers
    # aside: the sender's id, "client-1" against "server")
    for r in records:
        assert all(0 <= sent - down <= 16 for sent, down in zip(per_node(r, "bytes_out"), per_node(r, "bytes_in"),
                                                                strict=True))  # fmt: skip
        assert max(per_node(r, "bytes_out")) < 0.4 * 4 * sum(math.prod(s) for s in shapes.values())


def test_ditto_personal_models_differ_from_the_global_and_lambda_pulls_them_only(demo, tmp_path):
    # batches of 10: 6 steps a round, 2 on the global model and 4 on the personal one (in round 0 a personal
    # model starts on the global model it is pulled towards: the pull is 0 at its first step)
    runs = {lam: _run(demo, tmp_path / f"ditto-{lam}", method="ditto", ditto_lambda=lam, batch_size=10)
            for lam in (0.0, 0.5, 5.0)}  # fmt: skip
    sampled = sample_clients(4, 2, TINY["seed"], 1)
    distances = {}
    for lam, (_config, records, saved) in runs.items():
        *personal, server = saved["weights"]
        r = records[-1]
        assert r["acc_mean"] == r["acc_after_mean"] and r["acc_before_mean"] is not None
        distances[lam] = sum(
            float(torch.linalg.vector_norm(personal[i][n] - server[n])) for i in sampled for n in server
        )
        assert distances[lam] > 0  # personal models are not the global one
    # the global model does not depend on lambda; the personal models do, closer to it as lambda grows
    globals_ = [saved["weights"][-1] for _c, _r, saved in runs.values()]
    assert all(torch.equal(globals_[0][n], g[n]) for g in globals_[1:] for n in g)
    assert per_node(runs[0.0][1][-1], "acc_before") == per_node(runs[5.0][1][-1], "acc_before")
    assert distances[5.0] < distances[0.5] < distances[0.0]


def test_ditto_unsampled_clients_keep_their_personal_models(demo, tmp_path):
    _config, _records, saved = _run(demo, tmp_path / "ditto", method="ditto", rounds=1)
    sampled = set(sample_clients(4, 2, TINY["seed"], 0))
    *personal, _server = saved["weights"]
    unsampled = [p for i, p in enumerate(personal) if i not in sampled]
    assert len(unsampled) == 2 and all(torch.equal(unsampled[0][n], unsampled[1][n]) for n in unsampled[0])


def test_sub_fedavg_density_follows_its_schedule_down_to_the_target(demo, tmp_path):
    target, rate, rounds = 0.9, 0.05, 4
    # every prune is kept: any accuracy will do, and any change of mask (the last, shrunk prune of a few weights
    # moves the masks by less than the default threshold of 1e-4)
    config, records, saved = _run(demo, tmp_path / "sub", method="sub-fedavg", density=target, rounds=rounds,
                                  subfedavg_acc_threshold=0.0, subfedavg_dist_threshold=0.0)  # fmt: skip
    *clients, server = saved["train_masks"]
    names = prunable(server)
    held = {}
    for i, mask in enumerate(clients):
        expected = {n: m.numel() for n, m in server.items()}  # dense at the start
        for t in range(rounds):
            if i in sample_clients(4, 2, config.seed, t):
                density = sum(expected[n] for n in names) / sum(server[n].numel() for n in names)
                r = round_rate(density, target, rate)
                expected = {n: c - math.floor(r * c) if n in names else c for n, c in expected.items()}
        assert _nnz(mask) == expected, i
        held[i] = sum(expected[n] for n in names) / sum(server[n].numel() for n in names)
        assert held[i] >= target
    assert held[1] == pytest.approx(target, abs=1e-4)  # sampled in all 4 rounds: 0.95, 0.9025, then 0.9
    densities = [r["density_mean"] for r in records]
    assert densities == sorted(densities, reverse=True) and densities[-1] < densities[0] < 1.0
    assert all(r["prune_rate"] == rate for r in records)


def test_sub_fedavg_keeps_no_prune_below_its_accuracy_threshold(demo, tmp_path):
    _config, records, _saved = _run(demo, tmp_path / "sub", method="sub-fedavg", subfedavg_acc_threshold=1.0)
    assert all(r["density_mean"] == 1.0 for r in records)  # no tiny model is 100 % right on its test data


@pytest.mark.parametrize("method", ["fedspa", "ditto", "sub-fedavg"])
def test_a_run_with_a_server_resumes_as_if_it_had_not_stopped(demo, tmp_path, method):
    _c, whole, _s = _run(demo, tmp_path / "whole", method=method)
    _run(demo, tmp_path / "parts", method=method, rounds=1)
    _c, parts, _s = _run(demo, tmp_path / "parts", method=method)
    for a, b in zip(whole, parts, strict=True):
        for key in ("acc_before", "acc_after", "bytes_out", "bytes_in"):
            assert per_node(a, key) == per_node(b, key), (method, key)
        assert a["density_mean"] == b["density_mean"], method


def test_the_report_puts_the_four_methods_in_one_table(demo, tmp_path):
    runs = []
    for method in ("fedspa", "fedspa-rsm", "ditto", "sub-fedavg"):
        _run(demo, tmp_path / method, method=method, rounds=1)
        runs.append(read_run(tmp_path / method))
    table = build_table(runs)
    assert [row[0] for row in table.rows] == ["Ditto", "FedSpa (d=0.5)", "FedSpa-RSM (d=0.5)", "Sub-FedAvg (d=0.5)"]
