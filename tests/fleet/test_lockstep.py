"""The proof that the networked system computes DisPFL: a lock-step fleet of real daemons and
``edge-node simulate`` with the same seed, partition and settings agree per client, in accuracy and in
the final weights and masks, up to floating-point noise (the same thread count on both sides)."""

from __future__ import annotations

import json
import os

import torch

from edge_node.fleet.fleet import Fleet
from tests.fleet.fleets import config, records, run_cli, run_to_end

NODES, ROUNDS, NEIGHBOURS, SEED = 4, 2, 2, 1
ACC_TOLERANCE = 1e-9  # accuracies are counts over the same test samples: equal unless a logit tie flips
HEADER_SLACK = 16  # bytes a stream's header may differ by between a daemon and the simulation (ids, round)
WEIGHT_TOLERANCE = 1e-5  # floating-point noise of the same ops in the same order is zero; allow reorderings


def test_lockstep_fleet_equals_the_simulation(tmp_path):
    compare_with_simulation(tmp_path, NODES, "mask")


def test_lockstep_fleet_of_width_tiers_equals_the_simulation(tmp_path):
    """Width tiers (protocol 1.5: narrow shapes on the wire, the narrow model trained): the same computation."""
    compare_with_simulation(tmp_path, 3, "width")


def compare_with_simulation(tmp_path, nodes: int, tier_mode: str) -> None:
    settings = dict(nodes=nodes, rounds=ROUNDS, lockstep=True, neighbours=NEIGHBOURS, seed=SEED,
                    partition="dir:0.5", capacity="0.6", batch_size=32, tier_mode=tier_mode)  # fmt: skip
    with Fleet(config(tmp_path / "fleet", **settings)) as fleet:
        run_to_end(fleet)
        per_node = {d.node_id: records(fleet, d.node_id) for d in fleet.own_daemons()}
    sim_dir = tmp_path / "sim"
    result = run_cli(
        ["simulate", "--dataset", "demo", "--clients", str(nodes), "--neighbours", str(NEIGHBOURS), "--rounds",
         str(ROUNDS), "--epochs", "1", "--batch-size", "32", "--micro-batch", "16", "--density", "0.6",
         "--partition", "dir:0.5", "--seed", str(SEED), "--output", str(sim_dir), "--no-progress",
         "--energy-backend", "estimate", "--tier-mode", tier_mode],
        env={"OMP_NUM_THREADS": "1"},  # the daemons run --threads 1: CPU reductions in another order are noise
    )  # fmt: skip  # --micro-batch 16: the daemons' default slices of a batch
    assert result.returncode == 0, result.stderr
    sim = [json.loads(line) for line in (sim_dir / "rounds.jsonl").read_text().splitlines()]
    acc_diff = 0.0
    for i in range(nodes):
        node = per_node[f"node{i}"]
        assert [r["round"] for r in node] == list(range(ROUNDS))
        for t in range(ROUNDS):
            assert node[t]["lockstep"] is True and node[t]["refusals"] == {}
            assert node[t].get("tier_mode") == (None if tier_mode == "mask" else tier_mode)
            assert tier_mode == "mask" or 0.5 < node[t]["width"] < 1.0  # tier 0.6's narrow model (cnn: 0.73)
            assert len(node[t]["peers_answered"]) == NEIGHBOURS  # the seeded neighbours, every one answered
            for key in ("acc_before", "acc_after"):
                acc_diff = max(acc_diff, abs(node[t][key] - sim[t]["nodes"][i][key]))
            # The bytes the simulation counts are the streams the daemons sent (under width tiers: the narrow shapes),
            # up to the headers' ids and rounds (client-1 and node1): a few bytes a stream.
            assert abs(node[t]["bytes_in"] - sim[t]["nodes"][i]["bytes_in"]) <= HEADER_SLACK * NEIGHBOURS, (t, i)
    sim_ckpt = torch.load(sim_dir / "checkpoint.pt", weights_only=True)
    weight_diff, mask_mismatches, compared = 0.0, 0, 0
    for i in range(nodes):
        node_ckpt = torch.load(tmp_path / "fleet" / f"node{i}" / "checkpoint.pt", weights_only=True)
        assert node_ckpt["rounds_done"] == ROUNDS
        for name, values in node_ckpt["values"].items():
            mask_mismatches += int((node_ckpt["train_mask"][name] != sim_ckpt["train_masks"][i][name]).sum())
            mask_mismatches += int((node_ckpt["next_mask"][name] != sim_ckpt["next_masks"][i][name]).sum())
            assert values.shape == sim_ckpt["values"][i][name].shape, name  # packed on equal masks
            weight_diff = max(weight_diff, float((values - sim_ckpt["values"][i][name]).abs().max()))
            compared += values.numel()
    line = (f"lock-step fleet of {nodes} ({tier_mode} tiers) vs simulation, {ROUNDS} rounds: max |accuracy "
            f"difference| {acc_diff:.3g}, "
            f"max |weight difference| {weight_diff:.3g} over {compared} active weights, {mask_mismatches} mask "
            "entries differ")  # fmt: skip
    print(line)
    if os.environ.get("EDGE_NODE_LOCKSTEP_REPORT"):
        with open(os.environ["EDGE_NODE_LOCKSTEP_REPORT"], "a") as f:
            f.write(line + "\n")
    assert mask_mismatches == 0, line
    assert acc_diff <= ACC_TOLERANCE, line
    assert weight_diff <= WEIGHT_TOLERANCE, line
