"""A BatchNorm model in the simulation: FedBN's ``local`` statistics per client, checkpointed and resumed."""

import json

import pytest
import torch

from edge_node.data import load_dataset
from edge_node.errors import ConfigError
from edge_node.records import per_node
from edge_node.sim.checkpoint import CHECKPOINT_NAME, load_checkpoint
from edge_node.sim.config import SimConfig
from edge_node.sim.runner import run_simulation

BN = "tests.plugin_factories:bn_conv"
COMMON = dict(
    dataset="demo", model=BN, clients=2, neighbours=1, samples_per_client=65, batch_size=16, epochs=1,
    progress=False, energy_backend="estimate",
)  # fmt: skip


def _records(out):
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def demo():
    return load_dataset("demo")


def test_each_client_keeps_its_statistics_and_a_resume_goes_on_with_them(tmp_path, demo):
    straight = run_simulation(SimConfig(**COMMON, rounds=2, output=tmp_path / "straight"), demo)
    records = _records(straight)
    assert [r["norm_stats"] for r in records] == ["local", "local"]  # never mistaken for a FedAvg of buffers
    saved = load_checkpoint(straight / CHECKPOINT_NAME, torch.device("cpu"))
    a, b = saved["buffers"]
    assert int(a["norm.num_batches_tracked"]) == 2 * 4  # 65 samples in batches of 16: the last one of 1 dropped
    assert not torch.allclose(a["norm.running_mean"], b["norm.running_mean"])  # each client's own
    resumed_dir = tmp_path / "resumed"
    run_simulation(SimConfig(**COMMON, rounds=1, output=resumed_dir), demo)
    run_simulation(SimConfig(**COMMON, rounds=2, output=resumed_dir), demo)
    again = load_checkpoint(resumed_dir / CHECKPOINT_NAME, torch.device("cpu"))
    for mine, theirs in zip(saved["buffers"], again["buffers"], strict=True):
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    for got, want in zip(_records(resumed_dir), records, strict=True):  # the evaluation used the resumed statistics
        assert per_node(got, "acc_before") == per_node(want, "acc_before")
        assert per_node(got, "acc_after") == per_node(want, "acc_after")


def test_a_model_without_statistics_records_no_policy(tmp_path, demo):
    out = run_simulation(SimConfig(**{**COMMON, "model": "tests.plugin_factories:gn_conv"}, rounds=1,
                                   output=tmp_path / "plain"), demo)  # fmt: skip
    assert _records(out)[0]["norm_stats"] is None
    assert "buffers" not in torch.load(out / CHECKPOINT_NAME, weights_only=True)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (dict(method="fedavg"), "method fedavg does not keep each client's BatchNorm running statistics"),
        (dict(method="fedp3", privacy="ldp", epsilon=8.0), "DP-SGD's per-sample gradients are undefined"),
    ],
)
def test_a_method_that_cannot_keep_the_statistics_refuses_before_writing(tmp_path, demo, settings, expected):
    out = tmp_path / "refused"
    with pytest.raises(ConfigError, match=expected) as exc:
        run_simulation(SimConfig(**{**COMMON, **settings}, rounds=1, output=out), demo)
    assert "\n" not in str(exc.value)
    assert not out.exists()


def test_norm_stats_takes_local_or_average():
    assert SimConfig(norm_stats="average").dispfl_params().norm_stats == "average"
    with pytest.raises(ConfigError, match="norm stats 'mean' must be one of local, average"):
        SimConfig(norm_stats="mean")


def test_average_sends_the_statistics_and_averages_them(tmp_path, demo):
    local = _records(run_simulation(SimConfig(**COMMON, rounds=2, output=tmp_path / "local"), demo))
    out = run_simulation(SimConfig(**COMMON, rounds=2, norm_stats="average", output=tmp_path / "average"), demo)
    records = _records(out)
    assert [r["norm_stats"] for r in records] == ["average", "average"]
    # round 0: nobody has trained, no statistics travel; round 1: each published model carries its 17 values
    assert per_node(records[0], "bytes_in") == per_node(local[0], "bytes_in")
    assert per_node(records[1], "bytes_in") > per_node(local[1], "bytes_in")
    assert per_node(records[0], "acc_after") == per_node(local[0], "acc_after")
    assert per_node(records[1], "acc_before") != per_node(local[1], "acc_before")
    a, b = load_checkpoint(out / CHECKPOINT_NAME, torch.device("cpu"))["buffers"]
    assert int(a["norm.num_batches_tracked"]) == int(b["norm.num_batches_tracked"]) == 2 * 4  # max(4, 4) + 4


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (dict(model="tests.plugin_factories:gn_conv"), "norm_stats average: model tests.plugin_factories:gn_conv"
                                                       " has no running statistics"),
        (dict(method="local"), "norm_stats average is not implemented for method local"),
    ],
)  # fmt: skip
def test_average_is_refused_before_writing(tmp_path, demo, settings, expected):
    out = tmp_path / "refused"
    with pytest.raises(ConfigError, match=expected) as exc:
        run_simulation(SimConfig(**{**COMMON, **settings}, norm_stats="average", rounds=1, output=out), demo)
    assert "\n" not in str(exc.value)
    assert not out.exists()
