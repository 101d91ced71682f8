"""Tasks (edge_node.algorithm.tasks): losses, metrics, label contracts, and a tiny run of each new task."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from edge_node.algorithm.tasks import CLASSIFICATION, MultiLabel, Regression, Score, evaluate, resolve_task
from edge_node.algorithm.training import count_correct
from edge_node.data import load_dataset
from edge_node.errors import ConfigError, DataError
from edge_node.sim.config import SimConfig
from edge_node.sim.report import summarize
from edge_node.sim.runner import run_simulation

F = "tests.task_factories"


class Fixed(nn.Module):
    """Returns the outputs it was given, batch by batch (for metric checks)."""

    def __init__(self, outputs: torch.Tensor) -> None:
        super().__init__()
        self.outputs, self.at = outputs, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.outputs[self.at : self.at + x.shape[0]]
        self.at += x.shape[0]
        return out


def _batches(targets: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.zeros(len(t), 1), t) for t in targets.split(size)]


def test_classification_is_cross_entropy_and_top1_accuracy_as_before():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(50, 4, generator=g), torch.randint(0, 4, (50,), generator=g)
    assert torch.equal(CLASSIFICATION.loss(logits, y), nn.functional.cross_entropy(logits, y))
    assert torch.equal(CLASSIFICATION.loss(logits, y, "sum"), nn.functional.cross_entropy(logits, y, reduction="sum"))
    got = evaluate(Fixed(logits), _batches(y, 16), CLASSIFICATION)
    correct, total = count_correct(Fixed(logits), _batches(y, 16))
    assert got == {"accuracy": correct / total} and 0 < correct < total


def test_regression_mae_and_r2_over_batches():
    g = torch.Generator().manual_seed(1)
    t = torch.randn(37, 2, generator=g) * 5 + 10
    out = t + torch.randn(37, 2, generator=g)
    got = evaluate(Fixed(out), _batches(t, 10), Regression())
    e, tn = (out - t).double().numpy(), t.double().numpy()
    assert got["mae"] == pytest.approx(np.abs(e).mean(), rel=1e-9)
    assert got["r2"] == pytest.approx(1 - (e**2).sum() / ((tn - tn.mean()) ** 2).sum(), rel=1e-9)
    mean_loss = Regression().loss(out, t)
    assert torch.allclose(Regression().loss(out, t, "sum") / 37, mean_loss)
    assert torch.allclose(mean_loss, nn.functional.mse_loss(out, t))


def test_multilabel_micro_f1_and_subset_accuracy():
    t = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=torch.float32)
    logits = torch.tensor([[2.0, -1, 3], [-1, 1, -2], [1, -1, -1], [-3, 2, 2]])  # rows 0, 3 exact
    got = evaluate(Fixed(logits), _batches(t, 3), MultiLabel())
    tp, fp, fn = 5, 1, 1  # predicted: {0,2} {1} {0} {1,2}
    assert got["micro_f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert got["subset_accuracy"] == pytest.approx(2 / 4)
    expected = nn.functional.binary_cross_entropy_with_logits(logits, t)
    assert torch.allclose(MultiLabel().loss(logits, t), expected)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_tensordataset_labels_of_any_integer_dtype_are_classes(dtype, monkeypatch):
    import tests.task_factories as factories

    original = factories.int32_classes

    def cast() -> tuple[object, object]:
        train, test = original()
        return [(x, y.to(dtype)) for x, y in train], [(x, y.to(dtype)) for x, y in test]

    monkeypatch.setattr(factories, "int32_classes", cast)
    ds = load_dataset(f"{F}:int32_classes")
    assert ds.num_classes == 3 and ds.train_y.dtype == np.int64 and ds.train_t is None


def test_numpy_and_python_integer_labels_are_classes():
    ds = load_dataset(f"{F}:int32_classes")  # 0-dim int32 tensors, as TensorDataset gives them
    labels = ds.train_y
    task = resolve_task("classification")
    from_numpy = task.labels(labels.astype(np.int16), labels[:10].astype(np.uint8), "x")
    assert from_numpy.num_keys == 3 and np.array_equal(from_numpy.train_keys, labels)


@pytest.mark.parametrize(
    ("factory", "task", "expected"),
    [
        ("linear_target", "classification", "not an integer class; for numeric targets use --task regression"),
        ("int32_classes", "regression", "not a float target; regression needs float targets"),
        ("sign_labels", "classification", "not a class number; for 0/1 label vectors use --task multilabel"),
        ("rounded_targets", "classification", "398 classes for 80 training samples"),
        ("nan_target", "regression", "train label 7 is nan, not finite"),
        ("ragged_label_vectors", "multilabel", "test label vectors have 2 entries, training ones 3"),
        ("linear_target", "multilabel", "not a 0/1 label vector"),
    ],
)
def test_labels_a_task_cannot_read_are_one_line(factory, task, expected):
    with pytest.raises(DataError) as exc:
        load_dataset(f"{F}:{factory}", task=task)
    message = str(exc.value)
    assert expected in message and "\n" not in message, message
    if factory == "rounded_targets":
        assert "--task regression" in message


def test_a_builtin_data_set_is_classification_only():
    with pytest.raises(DataError, match="needs a data factory"):
        load_dataset("demo", task="regression")


def test_regression_keys_are_quantile_bins_and_multilabel_keys_label_sets():
    reg = load_dataset(f"{F}:linear_target", task="regression")
    assert reg.num_outputs == 1 and reg.train_t is not None and reg.train_t.dtype == np.float32
    counts = np.bincount(reg.train_y)
    assert len(counts) == 10 and counts.min() >= 20 and counts.max() <= 28  # 240 samples in ten quantile bins
    multi = load_dataset(f"{F}:sign_labels", task="multilabel")
    assert multi.num_outputs == 3 and multi.num_classes == 8  # all 2^3 label sets occur
    sets = {tuple(row) for row in multi.train_t[multi.train_y == 0]}
    assert len(sets) == 1
    assert load_dataset(f"{F}:two_targets", task="regression").num_outputs == 2


def test_an_unknown_task_and_a_method_that_cannot_run_it_are_refused():
    with pytest.raises(ConfigError, match="task='ordinal' must be one of classification, regression, multilabel"):
        SimConfig(task="ordinal")
    with pytest.raises(ConfigError, match="sub-fedavg keeps a prune by test accuracy"):
        SimConfig(task="regression", method="sub-fedavg", dataset=f"{F}:linear_target", model=f"{F}:mlp")


def _tiny_run(tmp_path, task: str, factory: str, lr: float = 0.05) -> list[dict]:
    config = SimConfig(
        task=task, dataset=f"{F}:{factory}", model=f"{F}:mlp", clients=2, neighbours=1, rounds=2, epochs=2,
        batch_size=16, lr=lr, progress=False, energy_backend="estimate", output=tmp_path / task.replace(":", "-"),
    )  # fmt: skip
    out = run_simulation(config, load_dataset(config.dataset, task=task))  # a factory task reads labels too
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]


def test_a_regression_run_records_mae_r2_and_its_direction(tmp_path):
    records = _tiny_run(tmp_path, "regression", "linear_target")
    last = records[-1]
    assert (last["task"], last["metric"], last["metric_higher_is_better"]) == ("regression", "mae", False)
    assert set(last["metrics_mean"]) == {"mae", "r2"} and last["metrics_mean"]["mae"] == last["acc_mean"]
    assert records[-1]["acc_mean"] < records[0]["acc_before_mean"]  # the error falls
    summary = summarize(records)
    assert summary["acc_best"] == min(r["acc_mean"] for r in records)  # best is lowest for an error


def test_a_multilabel_run_records_micro_f1_and_subset_accuracy(tmp_path):
    records = _tiny_run(tmp_path, "multilabel", "sign_labels", lr=0.2)
    last = records[-1]
    assert (last["metric"], last["metric_higher_is_better"]) == ("micro_f1", True)
    assert set(last["metrics_mean"]) == {"micro_f1", "subset_accuracy"}
    assert last["acc_mean"] > records[0]["acc_before_mean"] + 0.2  # measured: 0.19 before, 0.64 after round 2


def test_score_is_a_float_that_keeps_every_metric_through_pickling():
    import pickle

    s = Score(0.25, {"mae": 0.25, "r2": 0.5})
    again = pickle.loads(pickle.dumps(s))
    assert again == 0.25 and again.metrics == {"mae": 0.25, "r2": 0.5} and json.dumps([s]) == "[0.25]"


def test_a_label_the_task_cannot_read_is_exit_2_before_anything_is_written(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "edge_node", "simulate", "--task", "regression", "--dataset", f"{F}:int32_classes",
         "--model", f"{F}:mlp", "--output", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a float target" in lines[0], done.stderr
    assert not out.exists()


def test_a_task_of_ones_own_trains_and_names_itself(tmp_path):
    task = resolve_task(f"{F}:huber")
    assert isinstance(task, Regression) and task.name == "huber-regression"
    last = _tiny_run(tmp_path, f"{F}:huber", "linear_target")[-1]
    assert (last["task"], last["metric"]) == ("huber-regression", "mae")
    with pytest.raises(ConfigError, match="returned a str, not an edge_node Task"):
        resolve_task(f"{F}:not_a_task")
