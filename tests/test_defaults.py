"""One default per setting that ``simulate``, ``start`` and ``loopback`` share; the demo quick-start preset alone
differs, on the demo set, and says so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.defaults import DEFAULTS, PRESETS, preset_note, threads_of
from edge_node.errors import ConfigError
from edge_node.fleet.config import FleetConfig
from edge_node.node.config import NodeConfig
from edge_node.sim.config import SimConfig

TABLE = {f.name: getattr(DEFAULTS, f.name) for f in dataclasses.fields(DEFAULTS)}
OFF_DEMO = "tests.plugin_factories:blobs"  # any data set but the demo set (never loaded here)
RUN_RULES = {"dataset", "planned_rounds"}  # the data set given here; T = a run's own rounds (the table's: a daemon's)


def _defaults(cls: type) -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def test_the_daemon_and_the_client_round_take_the_table():
    node, params = _defaults(NodeConfig), _defaults(DisPFLParams)
    assert {k: node[k] for k in TABLE} == TABLE  # start takes every shared setting
    shared = {k for k in params if k in TABLE and k != "task"}  # the round's task is the resolved one
    assert {k: params[k] for k in shared} == {k: TABLE[k] for k in shared} and len(shared) >= 12
    assert DisPFLParams().task.name == TABLE["task"]


def test_a_simulation_off_the_demo_set_takes_the_table(tmp_path: Path):
    config = SimConfig(dataset=OFF_DEMO, clients=10, output=tmp_path)
    shared = {k: getattr(config, k) for k in TABLE if hasattr(config, k) and k not in RUN_RULES}
    assert shared == {k: TABLE[k] for k in shared}
    assert set(shared) >= {"epochs", "batch_size", "neighbours", "micro_batch", "lr", "threads", "partition", "seed"}
    assert SimConfig(dataset=OFF_DEMO, clients=3, output=tmp_path).neighbours == 2  # at most the other clients


def test_a_fleet_off_the_demo_set_takes_the_table(tmp_path: Path):
    config = FleetConfig(dataset=OFF_DEMO, nodes=8, output=tmp_path)
    shared = {k: getattr(config, k) for k in TABLE if hasattr(config, k) and k not in RUN_RULES | {"threads"}}
    assert shared == {k: TABLE[k] for k in shared}
    assert set(shared) >= {"epochs", "batch_size", "neighbours", "lr", "capacity", "partition", "seed"}
    assert config.threads == threads_of(8) and threads_of(1) == TABLE["threads"]  # 8 daemons share the cores
    assert FleetConfig(dataset=OFF_DEMO, nodes=3, output=tmp_path).neighbours == 2


@pytest.mark.parametrize("command", ["simulate", "loopback"])
def test_the_demo_preset_fills_only_what_is_not_given(command, tmp_path: Path):
    def make(**given: object) -> object:
        if command == "simulate":
            return SimConfig(output=tmp_path, **given)
        return FleetConfig(output=tmp_path, **given)

    demo = PRESETS[command]
    assert {k: getattr(make(), k) for k in demo} == dict(demo)
    assert make(epochs=3).epochs == 3 and make(batch_size=64).batch_size == 64
    assert preset_note(command, "demo", set()).startswith('# demo quick-start preset (dataset "demo"')
    assert preset_note(command, "demo", set(demo)) == "" and preset_note(command, OFF_DEMO, set()) == ""


def test_the_preset_neighbours_are_at_most_the_other_clients(tmp_path: Path):
    assert SimConfig(output=tmp_path, clients=2).neighbours == 1  # the preset's 2: one client has only one other
    assert SimConfig(output=tmp_path, clients=3).neighbours == PRESETS["simulate"]["neighbours"]


def test_simulate_threads_is_checked_and_resumable(tmp_path: Path):
    assert SimConfig(threads=2, output=tmp_path).threads == 2
    with pytest.raises(ConfigError, match=r"threads=0 must be at least 1"):
        SimConfig(threads=0, output=tmp_path)
    config = SimConfig(output=tmp_path)
    assert config.differences({**config.to_json(), "threads": 3}) == []


def test_a_fleet_saved_before_the_table_resumes_with_the_same_command(tmp_path: Path):
    """fleet-config.json of before: None for "the default" of batch size, lr and neighbours."""
    config = FleetConfig(output=tmp_path)
    before = {**config.to_json(), "batch_size": None, "lr": None, "neighbours": None}
    assert config.differences(before) == []
    assert FleetConfig(output=tmp_path, batch_size=64).differences(before) == ["batch_size"]
