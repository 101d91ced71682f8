"""A fleet of real daemons trains a BatchNorm model (FedBN, ``--norm-stats local``): each node's running
statistics are its own, in its checkpoint and in the model ``load_trained`` hands out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import REPO_ROOT

MODEL = "tests.plugin_factories:bn_conv"


def test_a_two_node_fleet_keeps_each_nodes_batchnorm_statistics(tmp_path: Path):
    out = tmp_path / "fleet"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "edge_node", "loopback", "--nodes", "2", "--rounds", "2", "--lockstep", "--model",
         MODEL, "--batch-size", "32", "--output", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    from edge_node.api import load_trained
    from edge_node.node.state import CHECKPOINT_FILE

    means = []
    for node in ("node0", "node1"):
        records = [json.loads(line) for line in (out / node / "rounds.jsonl").read_text().splitlines()]
        assert [(r["round"], r["norm_stats"]) for r in records] == [(0, "local"), (1, "local")], node
        saved = torch.load(out / node / CHECKPOINT_FILE, weights_only=True)
        buffers = saved["buffers"]
        assert buffers and all(torch.isfinite(v.float()).all() for v in buffers.values()), node
        model = load_trained(out / node)  # the statistics come with the model handed out
        for name, value in model.named_buffers():
            assert torch.equal(value, buffers[name]), (node, name)
        means.append(torch.cat([v.flatten() for k, v in sorted(buffers.items()) if k.endswith("running_mean")]))
    assert not torch.equal(means[0], means[1])  # each node's statistics are its own data's
