"""A lock-step fleet of real daemons under ``--norm-stats average``: the running statistics travel (protocol
1.3) and are averaged, and the fleet computes what ``edge-node simulate`` does with the same seed and settings
(accuracies, weights, masks and the averaged statistics per client); a model without running statistics is
refused in one line before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from edge_node.fleet.fleet import Fleet
from edge_node.node.state import CHECKPOINT_FILE
from tests.conftest import REPO_ROOT
from tests.fleet.fleets import config, records, run_cli, run_to_end

MODEL = "tests.plugin_factories:bn_conv"
NODES, ROUNDS, NEIGHBOURS, SEED = 2, 2, 1, 1
ACC_TOLERANCE = 1e-9  # as tests/fleet/test_lockstep.py: counts over the same test samples
WEIGHT_TOLERANCE = 1e-5  # the same ops in the same order on one thread; allow reorderings
BUFFER_TOLERANCE = 1e-7  # the statistics are small (a simulation under local instead differs by 4.9e-6)


def test_a_lockstep_fleet_averaging_its_statistics_equals_the_simulation(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))  # the daemons import the test model's factory
    settings = dict(nodes=NODES, rounds=ROUNDS, lockstep=True, neighbours=NEIGHBOURS, seed=SEED,
                    partition="dir:0.5", capacity="0.6", batch_size=32, model=MODEL, norm_stats="average")  # fmt: skip
    with Fleet(config(tmp_path / "fleet", **settings)) as fleet:
        run_to_end(fleet)
        per_node = {d.node_id: records(fleet, d.node_id) for d in fleet.own_daemons()}
    sim_dir = tmp_path / "sim"
    done = run_cli(
        ["simulate", "--dataset", "demo", "--model", MODEL, "--norm-stats", "average", "--clients", str(NODES),
         "--neighbours", str(NEIGHBOURS), "--rounds", str(ROUNDS), "--epochs", "1", "--batch-size", "32",
         "--density", "0.6", "--partition", "dir:0.5", "--seed", str(SEED), "--output", str(sim_dir),
         "--no-progress", "--energy-backend", "estimate"],
        env={"OMP_NUM_THREADS": "1"},  # the daemons run --threads 1
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    sim = [json.loads(line) for line in (sim_dir / "rounds.jsonl").read_text().splitlines()]
    sim_ckpt = torch.load(sim_dir / "checkpoint.pt", weights_only=True)
    acc_diff = weight_diff = buffer_diff = 0.0
    for i in range(NODES):
        node = per_node[f"node{i}"]
        assert [(r["round"], r["norm_stats"]) for r in node] == [(t, "average") for t in range(ROUNDS)]
        for t in range(ROUNDS):
            assert node[t]["lockstep"] is True and node[t]["refusals"] == {} and node[t]["peers_answered"]
            for key in ("acc_before", "acc_after"):
                acc_diff = max(acc_diff, abs(node[t][key] - sim[t]["nodes"][i][key]))
        saved = torch.load(tmp_path / "fleet" / f"node{i}" / CHECKPOINT_FILE, weights_only=True)
        for name, values in saved["values"].items():
            assert torch.equal(saved["train_mask"][name], sim_ckpt["train_masks"][i][name]), (i, name)
            weight_diff = max(weight_diff, float((values - sim_ckpt["values"][i][name]).abs().max()))
        sim_buffers = sim_ckpt["buffers"][i]
        assert saved["buffers"].keys() == sim_buffers.keys() and int(saved["buffers"]["norm.num_batches_tracked"]) > 0
        for name, value in saved["buffers"].items():
            buffer_diff = max(buffer_diff, float((value.double() - sim_buffers[name].double()).abs().max()))
    line = f"accuracy {acc_diff:.3g}, weights {weight_diff:.3g}, running statistics {buffer_diff:.3g}"
    assert acc_diff <= ACC_TOLERANCE, line
    assert weight_diff <= WEIGHT_TOLERANCE and buffer_diff <= BUFFER_TOLERANCE, line


def test_a_model_without_statistics_is_refused_before_writing(tmp_path: Path):
    out = tmp_path / "fleet"
    done = subprocess.run(
        [sys.executable, "-m", "edge_node", "loopback", "--nodes", "2", "--rounds", "1", "--lockstep", "--model",
         "tests.plugin_factories:gn_conv", "--batch-size", "32", "--norm-stats", "average", "--output", str(out),
         "--no-progress"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 2 and "has no running statistics" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()
