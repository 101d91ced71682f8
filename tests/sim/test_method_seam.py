"""The method seam: a method is one module behind ``Method`` and one registry entry; the runner, its config
and the report take everything else from what it declares (here a method defined in this test runs end to
end, with no other change)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest

from edge_node.data import load_dataset
from edge_node.errors import ConfigError
from edge_node.records import SIM_KEYS, per_node
from edge_node.sim.config import SimConfig
from edge_node.sim.methods import METHOD_SETTINGS, REGISTRY, Method, RoundResult, RunState, SimContext
from edge_node.sim.runner import run_simulation
from edge_node.sim.table import METHOD_ORDER, build_table, read_run

FIELDS = {f.name for f in dataclasses.fields(SimConfig)}


def test_every_registered_method_declares_what_the_runner_reads():
    assert list(REGISTRY) == ["dispfl", "dispfl-s2s", "local", "dpsgd", "dpsgd-ft", "fedavg", "fedavg-ft", "fedp3",
                              "ditto", "fedspa", "fedspa-rsm", "sub-fedavg", "heterofl"]  # fmt: skip
    assert METHOD_ORDER == ("local", "dpsgd", "dpsgd-ft", "fedavg", "fedavg-ft", "fedp3", "ditto", "heterofl",
                            "dispfl", "dispfl-s2s", "fedspa", "fedspa-rsm", "sub-fedavg")  # rows  # fmt: skip
    for name, method in REGISTRY.items():
        assert method.name == name and method.label and method.acc_before_is
        assert method.headline in ("before", "after"), name
        assert method.headline == "before" or method.acc_after_is is not None, name
        assert method.uses <= FIELDS, (name, method.uses - FIELDS)  # settings it reads are SimConfig's
    assert {"density", "neighbours", "screen", "fedavg_clients", "target_density"} <= METHOD_SETTINGS


@dataclass(frozen=True)
class Hermit(Method):
    """Trains alone like Local but judges the model before training (a method no module of edge-node has)."""

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        clients, result = ctx.train_dense(t, state.clients)
        result.fields["s2s_pruned"] = False  # a method's own record key (SIM_KEYS holds it)
        return RunState(clients, state.extra), result


HERMIT = Hermit(name="hermit", label="Hermit", acc_before_is="untrained this round", acc_after_is="trained",
                headline="before", uses=frozenset({"fedavg_clients"}))  # fmt: skip


def test_a_new_method_is_one_class_and_one_registry_entry(monkeypatch, tmp_path):
    monkeypatch.setitem(REGISTRY, "hermit", HERMIT)
    config = SimConfig(method="hermit", clients=3, rounds=1, epochs=1, samples_per_client=40, batch_size=20,
                       progress=False, energy_backend="estimate", output=tmp_path / "hermit")  # fmt: skip
    assert config.density == 1.0  # not sparse: dense, whatever was given
    warnings = config.ignored({"density", "fedavg_clients", "neighbours"})
    assert warnings == [
        "density is ignored by method hermit (used by dispfl, dispfl-s2s, fedspa, fedspa-rsm, sub-fedavg)",
        "neighbours is ignored by method hermit (used by dispfl, dispfl-s2s, dpsgd, dpsgd-ft)",
    ]
    out = run_simulation(config, load_dataset("demo"))
    (record,) = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert tuple(record) == SIM_KEYS
    assert record["method"] == "hermit" and record["acc_mean_is"] == "untrained this round"
    assert record["acc_mean"] == record["acc_before_mean"] and record["acc_after_is"] == "trained"
    assert record["prune_rate"] is None and record["screen"] is None and record["s2s_pruned"] is False
    assert record["density_mean"] == 1.0 and per_node(record, "bytes_in") == [0, 0, 0]
    table = build_table([read_run(out)])
    assert table.rows[0][0] == "Hermit"


def test_an_unknown_method_or_a_record_key_outside_the_records_is_refused(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="^method 'nope' must be one of dispfl, dispfl-s2s, local, "):
        SimConfig(method="nope")

    @dataclass(frozen=True)
    class Sloppy(Hermit):
        def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
            state, result = super().round(ctx, t, state)
            result.fields["my_own_key"] = 1
            return state, result

    monkeypatch.setitem(REGISTRY, "sloppy", Sloppy(**{**dataclasses.asdict(HERMIT), "name": "sloppy"}))
    config = SimConfig(method="sloppy", clients=3, rounds=1, epochs=1, samples_per_client=40, batch_size=20,
                       progress=False, energy_backend="estimate", output=tmp_path / "sloppy")  # fmt: skip
    with pytest.raises(AssertionError, match="outside SIM_KEYS"):
        run_simulation(config, load_dataset("demo"))
