"""The worked example ``examples/mobilenet_finetune``, installed as a user would: a MobileNetV2-style network
with BatchNorm, pretrained centrally on five classes, then fine-tuned by a 2-node ``edge-node loopback`` fleet
on the other five with only its last blocks trainable. Smoke size: edge-node's built-in demo images
(``MOBILENET_FINETUNE_SOURCE=demo``, 240 training samples), one epoch, one round; docs/RESULTS.md has the
CIFAR-10 runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "mobilenet_finetune"
TRAINABLE = "features.16.*,features.17.*,features.18.*,classifier.*"

# loopback's settings off the demo set when these fleets were written (its defaults are the shared table's now)
FLEET = ["--epochs", "1", "--capacity", "0.6", "--threads", "1"]


@pytest.fixture(scope="module")
def example_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(EXAMPLE)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO_ROOT)]),
            "MOBILENET_FINETUNE_SOURCE": "demo", "MOBILENET_FINETUNE_LIMIT": "240"}  # fmt: skip


def test_pretrain_then_a_fleet_fine_tunes_the_last_blocks(example_env, tmp_path: Path):
    start = tmp_path / "pretrained.safetensors"
    pretrain = [sys.executable, "-m", "mobilenet_finetune.pretrain", "--out", str(start), "--epochs", "1",
                "--batch-size", "32"]  # fmt: skip
    done = subprocess.run(pretrain, capture_output=True, text=True, timeout=300, env=example_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert start.is_file() and "the head classifier.* left out" in done.stdout
    out = tmp_path / "fleet"
    done = subprocess.run(
        [sys.executable, "-m", "edge_node", "loopback", "--nodes", "2", "--rounds", "1", "--lockstep", *FLEET,
         "--model", "mobilenet-v2", "--dataset", "mobilenet_finetune:last_five", "--init-weights", str(start),
         "--trainable", TRAINABLE, "--batch-size", "32", "--output", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=300, env=example_env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for node in ("node0", "node1"):
        (record,) = [json.loads(line) for line in (out / node / "rounds.jsonl").read_text().splitlines()]
        assert record["norm_stats"] == "local" and record["peers_answered"], node
        # only the trainable tail travels: the last blocks and the head are 311,845 of the 587,205 parameters, at
        # the fleet's density 0.6 about 0.79 MB (measured 786,376 B); the whole model at 0.6 would be 1.48 MB
        assert 0.5e6 < record["bytes_in"] < 1.0e6, (node, record["bytes_in"])
    log = (out / "node0.log").read_text()
    assert "classifier.weight, classifier.bias" in log  # the new head, from the fleet seed, named in the log
