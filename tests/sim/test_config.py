"""SimConfig: one default per hyper-parameter of the client round (DisPFLParams, shared with the daemon's
NodeConfig), a run saved with another micro_batch resumes with what it ran with, and whole-batch settings
default to whole batches."""

from __future__ import annotations

import dataclasses

import pytest

from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.errors import ConfigError
from edge_node.node.config import NodeConfig
from edge_node.sim.config import SimConfig


def test_both_configs_take_the_client_rounds_defaults_from_one_dataclass():
    params = DisPFLParams()
    sim, node = SimConfig().dispfl_params(), NodeConfig().dispfl_params()
    assert node == params
    # The differences, each said in SimConfig: a simulation's prune schedule ends at its own last round (a daemon
    # runs until stopped), and its first run (no flag) trains 1 epoch of 32, about a minute on 2 cores.
    first_run = {"planned_rounds": params.planned_rounds, "epochs": params.epochs, "batch_size": params.batch_size}
    assert dataclasses.replace(sim, **first_run) == params
    assert sim.planned_rounds == SimConfig().rounds and (sim.epochs, sim.batch_size) == (1, 32)
    assert params.micro_batch == 16  # a device's memory, and the lock-step fleet equals the simulation unflagged


@pytest.mark.parametrize("saved_micro_batch", [0, None])  # saved with 0, or before the setting existed
def test_a_run_saved_with_another_micro_batch_resumes_with_it(saved_micro_batch):
    saved = SimConfig(micro_batch=0).to_json()
    if saved_micro_batch is None:
        del saved["micro_batch"]
    resumed, notes = SimConfig().resumed_as(saved)
    assert resumed.micro_batch == 0 and resumed.differences(saved) == []
    assert notes == ["this run was saved with micro_batch 0 (the default is 16 now); resumed with it "
                     "(pass --micro-batch 0 to say so)"]  # fmt: skip
    # a value chosen on purpose (not the default) is not overridden: the resume is refused as another setting
    assert SimConfig(micro_batch=32).resumed_as(saved)[0].differences(saved) == ["micro_batch"]
    assert SimConfig(micro_batch=0).resumed_as(saved) == (SimConfig(micro_batch=0), [])


def test_whole_batch_settings_default_to_whole_batches_in_the_python_api_too():
    """micro_batch left out means whole batches where the steps take them (captured steps), a device's slices
    otherwise; a value given is never replaced."""
    graphed = {"cuda_graphs": True, "device": "cuda"}
    assert SimConfig().micro_batch == DisPFLParams().micro_batch == SimConfig().default_micro_batch
    assert SimConfig(**graphed).micro_batch == 0 == SimConfig(**graphed).default_micro_batch
    assert SimConfig(micro_batch=8).micro_batch == 8
    with pytest.raises(ConfigError, match="cuda_graphs captures whole batches: it needs micro_batch 0, not 16"):
        SimConfig(**graphed, micro_batch=16)


def test_a_resume_with_captured_steps_never_takes_the_saved_slices():
    """A captured run resumed without the graphs keeps its whole batches (with the note); a run of slices resumed
    with the graphs is not given its slices back (they would be refused): it is refused as another micro_batch."""
    graphed = SimConfig(cuda_graphs=True, device="cuda").to_json()
    resumed, notes = SimConfig().resumed_as(graphed)
    assert resumed.micro_batch == 0 and resumed.differences(graphed) == [] and len(notes) == 1
    sliced = SimConfig().to_json()
    resumed, notes = SimConfig(cuda_graphs=True, device="cuda").resumed_as(sliced)
    assert (resumed.micro_batch, notes) == (0, []) and resumed.differences(sliced) == ["micro_batch"]
