"""The simulation's fast path for a GPU, ``--micro-batch 0`` (the whole batch through the model at once), and
the per-client path in the daemon's slices of 16 give the same models after one round of a tiny run: the same
SGD step up to float rounding (measured: largest weight difference 1.5e-8 at one thread; bound 1e-5), the same
masks."""

from __future__ import annotations

import torch

from edge_node.data import load_dataset
from edge_node.sim.checkpoint import load_checkpoint
from edge_node.sim.config import SimConfig
from edge_node.sim.runner import run_simulation


def test_whole_batch_and_slices_of_16_give_the_same_models_after_one_round(tmp_path):
    torch.set_num_threads(1)  # restored by conftest
    data = load_dataset("demo")
    saved = {}
    for micro in (16, 0):
        config = SimConfig(clients=3, neighbours=1, rounds=1, samples_per_client=80, batch_size=32, micro_batch=micro,
                           progress=False, energy_backend="estimate", output=tmp_path / str(micro))  # fmt: skip
        saved[micro] = load_checkpoint(run_simulation(config, data) / "checkpoint.pt", torch.device("cpu"))
    sliced, whole = saved[16], saved[0]
    largest = max(
        (a[k] - b[k]).abs().max().item() for a, b in zip(sliced["weights"], whole["weights"], strict=True) for k in a
    )
    assert 0 < largest <= 1e-5  # not bitwise (the slices sum in another order), the same step
    for key in ("train_masks", "next_masks"):
        for a, b in zip(sliced[key], whole[key], strict=True):
            assert all(torch.equal(a[k], b[k]) for k in a), key
