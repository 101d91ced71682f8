"""A lock-step fleet of real daemons under ``--norm-stats average``: the running statistics travel (protocol
1.3) and are averaged; a model without them is refused in one line before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import REPO_ROOT


def _loopback(tmp_path: Path, out: Path, model: str, rounds: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "edge_node", "loopback", "--nodes", "2", "--rounds", str(rounds), "--lockstep",
         "--model", model, "--batch-size", "32", "--norm-stats", "average", "--output", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip


def test_a_two_node_fleet_averages_its_statistics(tmp_path: Path):
    out = tmp_path / "fleet"
    done = _loopback(tmp_path, out, "tests.plugin_factories:bn_conv", 2)
    assert done.returncode == 0, done.stderr[-3000:]
    from edge_node.node.state import CHECKPOINT_FILE

    for node in ("node0", "node1"):
        records = [json.loads(line) for line in (out / node / "rounds.jsonl").read_text().splitlines()]
        assert [(r["round"], r["norm_stats"]) for r in records] == [(0, "average"), (1, "average")], node
        buffers = torch.load(out / node / CHECKPOINT_FILE, weights_only=True)["buffers"]
        assert int(buffers["norm.num_batches_tracked"]) > 0, node


def test_a_model_without_statistics_is_refused_before_writing(tmp_path: Path):
    out = tmp_path / "fleet"
    done = _loopback(tmp_path, out, "tests.plugin_factories:gn_conv", 1)
    assert done.returncode == 2 and "has no running statistics" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()
