"""The worked example ``examples/digits_tabular``, installed as a user would (outside edge-node), trained by
``edge-node simulate`` and by a 3-node ``edge-node loopback`` fleet with the README's commands, small."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytest.importorskip("sklearn", reason="scikit-learn (the test extra) ships the example's data set")

EXAMPLE = REPO_ROOT / "examples" / "digits_tabular"
EDGE_NODE = [sys.executable, "-m", "edge_node"]

# loopback's settings off the demo set when these fleets were written (its defaults are the shared table's now)
FLEET = ["--epochs", "1", "--capacity", "0.6", "--threads", "1"]


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The example installed into a target folder (not the venv): on PYTHONPATH, its entry point visible."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(EXAMPLE)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO_ROOT)])}


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EDGE_NODE, *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_simulate_trains_the_plugin_and_its_accuracy_rises(plugin_env, tmp_path: Path):
    out = tmp_path / "run"
    done = run(["simulate", "--model", "digits-mlp", "--dataset", "digits_tabular:digits", "--clients", "4",
                "--neighbours", "2", "--rounds", "4", "--epochs", "1", "--batch-size", "32", "--output", str(out),
                "--no-progress", "--energy-backend", "estimate"], plugin_env, tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    accuracy = [r["acc_mean"] for r in records]
    assert len(accuracy) == 4 and accuracy[-1] > accuracy[0] + 0.1 and accuracy[-1] > 0.5, accuracy
    config = json.loads((out / "config.json").read_text())
    assert (config["model"], config["dataset"]) == ("digits-mlp", "digits_tabular:digits")


def test_a_three_node_loopback_fleet_trains_the_plugin(plugin_env, tmp_path: Path):
    out = tmp_path / "fleet"
    done = run(["loopback", "--nodes", "3", "--rounds", "4", "--lockstep", *FLEET, "--model", "digits_tabular:mlp",
                "--dataset", "digits_tabular:digits", "--batch-size", "32", "--output", str(out), "--no-progress"],
               plugin_env, tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for node in ("node0", "node1", "node2"):
        rounds = [json.loads(line) for line in (out / node / "rounds.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rounds] == [0, 1, 2, 3], node
    summary = json.loads((out / "fleet-summary.json").read_text())
    assert (summary["fleet"]["model"], summary["fleet"]["outcome"]) == ("digits_tabular:mlp", "done")
    means = [r["acc_after_mean"] for r in summary["rounds"]]  # lock-step: deterministic, as the simulation
    assert len(means) == 4 and means[-1] > means[0] + 0.1, means


def test_the_regression_example_trains_in_a_three_node_fleet(plugin_env, tmp_path: Path):
    out = tmp_path / "diabetes"
    done = run(["loopback", "--nodes", "3", "--rounds", "2", "--lockstep", *FLEET, "--task", "regression", "--model",
                "digits_tabular:mlp", "--dataset", "digits_tabular:diabetes", "--batch-size", "32", "--output",
                str(out), "--no-progress"], plugin_env, tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = done.stdout.replace("fleet-accuracy.png", "")  # the plot's file name is the same for every task
    assert "mae" in said and "accuracy" not in said.lower(), done.stdout
    for node in ("node0", "node1", "node2"):
        rounds = [json.loads(line) for line in (out / node / "rounds.jsonl").read_text().splitlines()]
        assert [(r["round"], r["metric"], set(r["metrics"])) for r in rounds] == [
            (0, "mae", {"mae", "r2"}), (1, "mae", {"mae", "r2"})
        ], node  # fmt: skip
        assert rounds[-1]["acc_after"] < rounds[0]["acc_before"], node  # the error falls
    summary = json.loads((out / "fleet-summary.json").read_text())
    assert (summary["metric"], summary["metric_higher_is_better"]) == ("mae", False)


def test_the_multilabel_example_trains_in_simulation(plugin_env, tmp_path: Path):
    out = tmp_path / "traits"
    done = run(["simulate", "--task", "multilabel", "--model", "digits_tabular:mlp", "--dataset",
                "digits_tabular:digit_traits", "--clients", "3", "--neighbours", "2", "--rounds", "2", "--epochs",
                "1", "--batch-size", "32", "--output", str(out), "--no-progress", "--energy-backend", "estimate"],
               plugin_env, tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "micro_f1 (final)" in done.stdout and "accuracy (final)" not in done.stdout, done.stdout
    records = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [set(r["metrics_mean"]) for r in records] == [{"micro_f1", "subset_accuracy"}] * 2
    assert records[-1]["acc_mean"] > 0.5  # micro-F1 of three traits learnt from the pixels
