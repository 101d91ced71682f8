"""The simulation split over 2 torchrun processes (gloo, CPU) runs the same round as one process: with one
thread per process on both sides the records and the checkpoint are bitwise equal (a different thread
count changes the summation order of a convolution, float noise the masks' top-k then amplifies).
Process 0 alone writes; a sharded run resumes from its checkpoint; a method that cannot be split is refused
by name before any collective."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edge_node.exit_codes import ExitCode
from edge_node.sim.checkpoint import load_checkpoint
from edge_node.sim.methods import REGISTRY
from edge_node.sim.shard import block, check_shardable

TINY = [
    "--dataset", "demo", "--clients", "5", "--neighbours", "2", "--epochs", "1", "--samples-per-client", "60",
    "--no-progress", "--energy-backend", "estimate",
]  # fmt: skip
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def _simulate(args: list[str], out: Path, processes: int) -> None:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    command = [*(launcher if processes > 1 else [sys.executable]), "-m", "edge_node", "simulate", *TINY, *args]
    done = subprocess.run([*command, "--output", str(out)], capture_output=True, text=True, env=ONE_THREAD,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def _records(run: Path) -> list[dict]:
    lines = (run / "rounds.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in lines]


def _assert_same_run(a: Path, b: Path) -> None:
    assert _records(a) == _records(b)
    ca, cb = (load_checkpoint(p / "checkpoint.pt", torch.device("cpu")) for p in (a, b))
    assert ca["round"] == cb["round"]
    for key in ("weights", "train_masks", "next_masks"):
        for da, db in zip(ca[key], cb[key], strict=True):
            assert da.keys() == db.keys()
            assert all(torch.equal(da[k], db[k]) for k in da), key


@pytest.mark.parametrize("method", ["dispfl", "dpsgd-ft"])
def test_two_gloo_processes_equal_one_process_and_resume(tmp_path, method):
    one, two = tmp_path / "one", tmp_path / "two"
    _simulate(["--method", method, "--rounds", "2"], one, 1)
    _simulate(["--method", method, "--rounds", "1"], two, 2)
    assert len(_records(two)) == 1
    _simulate(["--method", method, "--rounds", "2"], two, 2)  # resumes round 2 from process 0's checkpoint
    _assert_same_run(one, two)
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_method_shards_or_is_refused_by_name(name):
    method = REGISTRY[name]
    if method.shardable:
        check_shardable(name, True, 4, 2)
    else:
        with pytest.raises(Exception, match=f"method '{name}' cannot run over 2 processes"):
            check_shardable(name, False, 4, 2)


def test_the_blocks_cover_every_client_once():
    for n, world in [(5, 2), (100, 3), (7, 7)]:
        owned = [i for r in range(world) for i in block(r, world, n)]
        assert owned == list(range(n))
        assert (
            max(len(block(r, world, n)) for r in range(world)) - min(len(block(r, world, n)) for r in range(world)) <= 1
        )


def test_a_refused_method_under_torchrun_is_one_line_and_writes_nothing(tmp_path):
    """As process 0 of 2 sees it (torchrun's environment), before any process group is joined."""
    out = tmp_path / "run"
    env = {**ONE_THREAD, "WORLD_SIZE": "2", "RANK": "0"}
    command = [sys.executable, "-m", "edge_node", "simulate", *TINY, "--method", "fedavg", "--output", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert [line for line in done.stderr.splitlines() if "error" in line] == [
        "edge-node: error: method 'fedavg' cannot run over 2 processes (its round needs more than the round-start "
        "models of other clients: a server's global model or a vote across clients); run it in one process"
    ]
    assert not out.exists()


def test_under_torchrun_a_refusal_is_said_once(tmp_path):
    """Every process refuses the same settings; only process 0 prints it (the launcher names failed ranks)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command = [*launcher, "-m", "edge_node", "simulate", *TINY, "--method", "fedavg", "--output", str(tmp_path / "run")]
    done = subprocess.run(command, capture_output=True, text=True, env=ONE_THREAD, timeout=120)
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("edge-node: error:")]
    assert len(said) == 1 and "method 'fedavg' cannot run over 2 processes" in said[0], done.stderr
    assert not (tmp_path / "run").exists()


def test_fewer_clients_than_processes_is_refused():
    with pytest.raises(Exception, match="clients=1 must be at least the number of processes"):
        check_shardable("dispfl", True, 1, 2)
