"""Learning tasks: what a model's outputs are scored against (loss, label contract, headline metric).

A task names its loss, the labels it accepts, its headline metric and that metric's direction, and how the
``dir``/``path`` partitions see its labels (a *partition key* per sample: the class, a quantile bin of a
regression target, a multi-label sample's label set). The training step and the evaluation call the task;
nothing tests a task's name. Built in:

- ``classification``: integer classes ``0..C-1``, cross-entropy, headline ``accuracy`` (top-1), higher is
  better. What edge-node always did, bit for bit.
- ``regression``: float targets (a number, or a vector of fixed width K), the mean squared error, headline
  ``mae`` (mean absolute error over every output), lower is better; ``r2`` (1 - SSE/SST over every output
  pooled) is reported beside it. Partition keys: 10 quantile bins of the first target column.
- ``multilabel``: 0/1 vectors of fixed width L, binary cross-entropy on the logits, headline ``micro_f1``
  (a logit > 0 predicts the label), higher is better; ``subset_accuracy`` (every label right) beside it.
  Partition keys: the distinct label sets.

A user's task is a :class:`Task` subclass instance returned by a factory ``package.module:function`` (no
arguments), named where a built-in name would go (``--task mypkg.tasks:ordinal``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from edge_node.errors import ConfigError, DataError
from edge_node.plugins import load_factory, one_line
from edge_node.task_names import TASK_NAMES, check_task_name

Batch = tuple[torch.Tensor, torch.Tensor]
REGRESSION_BINS = 10  # quantile bins of a regression target that dir/path partitions deal out as classes
# More classes than one in this many training samples is not a classification (rounded regression targets).
SAMPLES_PER_CLASS_MIN = 5


@dataclass(frozen=True)
class Labels:
    """A data set's labels as a task reads them.

    Attributes:
        train_keys, test_keys: int64 partition keys (classes, quantile bins, label sets), ``0..num_keys-1``.
        num_keys: how many keys there are (the partitions' "classes").
        key_names: a name per key (class names; ``bin3``; ``{0,2}``).
        train_targets, test_targets: what the loss compares outputs with, when it is not the key itself
            (float32 ``[N, K]``); None for classification (the key is the target).
        num_outputs: the model's output width.
    """

    train_keys: np.ndarray
    test_keys: np.ndarray
    num_keys: int
    key_names: tuple[str, ...]
    train_targets: np.ndarray | None
    test_targets: np.ndarray | None
    num_outputs: int


class Task(ABC):
    """One learning task: loss, label contract, metrics. Subclass it for a task of your own."""

    name: str = "task"
    metric: str = "metric"  # the headline metric's key in :meth:`finish`'s result
    higher_is_better: bool = True
    metric_is_fraction: bool = False  # shown as a percentage (accuracy) rather than as a number (an error)

    @abstractmethod
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """The training loss of a batch: ``reduction`` "mean" over samples, or "sum" over samples."""

    @abstractmethod
    def metric_sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """A batch's contribution to the metrics, as one 1-D tensor that adds up over batches (on the device)."""

    @abstractmethod
    def finish(self, sums: torch.Tensor, samples: int) -> dict[str, float]:
        """The metrics from the summed :meth:`metric_sums` over ``samples`` samples; the headline included."""

    @abstractmethod
    def labels(self, train: np.ndarray, test: np.ndarray, where: str) -> Labels:
        """Check raw labels (``[N]`` or ``[N, K]`` arrays of the factory's values) and read them.

        Raises:
            DataError: one line naming ``where``, the first bad label and what this task accepts.
        """


def _first_bad(where: str, split: str, index: int, value: object, wanted: str, hint: str = "") -> DataError:
    return DataError(f"{where}: {split} label {index} is {value!r}, {wanted}{hint}")


def _as_2d(values: np.ndarray) -> np.ndarray:
    return values.reshape(values.shape[0], -1) if values.ndim != 1 else values[:, None]


class Classification(Task):
    """Integer classes, cross-entropy, top-1 accuracy (edge-node's task before tasks existed)."""

    name = "classification"
    metric = "accuracy"
    higher_is_better = True
    metric_is_fraction = True

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return nn.functional.cross_entropy(outputs, targets, reduction=reduction)

    def metric_sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(dim=1) == targets).sum().reshape(1)

    def finish(self, sums: torch.Tensor, samples: int) -> dict[str, float]:
        return {"accuracy": int(sums[0]) / max(samples, 1)}

    def labels(self, train: np.ndarray, test: np.ndarray, where: str) -> Labels:
        for split, y in (("train", train), ("test", test)):
            if y.ndim != 1:
                raise _first_bad(where, split, 0, y[0].tolist(), f"a vector of {y[0].size}, not a class number",
                                 "; for 0/1 label vectors use --task multilabel")  # fmt: skip
            if y.dtype.kind not in "iu":
                hint = "; for numeric targets use --task regression" if y.dtype.kind == "f" else ""
                raise _first_bad(where, split, 0, y[0].item(), f"a {y.dtype} value, not an integer class", hint)
            if y.size and int(y.min()) < 0:
                bad = int(np.flatnonzero(y < 0)[0])
                raise _first_bad(where, split, bad, int(y[bad]), "not a class number >= 0")
        keys_train, keys_test = train.astype(np.int64), test.astype(np.int64)
        num_classes = int(max(keys_train.max(), keys_test.max())) + 1
        if num_classes < 2:
            raise DataError(f"{where}: labels name {num_classes} class; at least 2 are needed")
        if num_classes * SAMPLES_PER_CLASS_MIN > len(keys_train):
            raise DataError(
                f"{where}: labels name {num_classes} classes for {len(keys_train)} training samples (fewer than "
                f"{SAMPLES_PER_CLASS_MIN} a class): if they are numbers to predict, use --task regression"
            )
        names = tuple(str(c) for c in range(num_classes))
        return Labels(keys_train, keys_test, num_classes, names, None, None, num_classes)


class Regression(Task):
    """Float targets, mean squared error; MAE is the headline (lower is better), R² beside it."""

    name = "regression"
    metric = "mae"
    higher_is_better = False
    metric_is_fraction = False

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        per_sample = (outputs - targets).square().mean(dim=1)
        return per_sample.mean() if reduction == "mean" else per_sample.sum()

    def metric_sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        error = (outputs - targets).double()
        t = targets.double()
        count = torch.full((), float(t.numel()), dtype=torch.float64, device=t.device)
        return torch.stack([error.abs().sum(), error.square().sum(), t.sum(), t.square().sum(), count])

    def finish(self, sums: torch.Tensor, samples: int) -> dict[str, float]:
        abs_sum, sse, t_sum, t_sq, count = (float(v) for v in sums.cpu())
        elements = max(count, 1.0)
        sst = t_sq - t_sum * t_sum / elements
        r2 = 1.0 - sse / sst if sst > 0 else float("nan")
        return {"mae": abs_sum / elements, "r2": r2}

    def labels(self, train: np.ndarray, test: np.ndarray, where: str) -> Labels:
        width = None
        for split, y in (("train", train), ("test", test)):
            if y.dtype.kind in "iub":
                hint = "; regression needs float targets (float(y)); for classes use --task classification"
                raise _first_bad(where, split, 0, y[0].tolist(), f"an integer ({y.dtype}), not a float target", hint)
            if y.dtype.kind != "f":
                raise _first_bad(where, split, 0, y[0], f"a {y.dtype}, not a number")
            y2 = _as_2d(y)
            if width is not None and y2.shape[1] != width:
                raise DataError(f"{where}: test targets have {y2.shape[1]} values, training targets {width}")
            width = y2.shape[1]
            bad = ~np.isfinite(y2).all(axis=1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise _first_bad(where, split, i, y2[i].tolist() if width > 1 else y2[i, 0].item(), "not finite")
        assert width is not None
        train2, test2 = _as_2d(train).astype(np.float32), _as_2d(test).astype(np.float32)
        edges = np.unique(np.quantile(train2[:, 0], np.linspace(0, 1, REGRESSION_BINS + 1)[1:-1]))
        bins_train = np.searchsorted(edges, train2[:, 0], side="right")
        used, keys_train = np.unique(bins_train, return_inverse=True)
        bins_test = np.searchsorted(edges, test2[:, 0], side="right")
        keys_test = np.clip(np.searchsorted(used, bins_test), 0, len(used) - 1)
        names = tuple(f"bin{int(b)}" for b in used)
        return Labels(keys_train.astype(np.int64), keys_test.astype(np.int64), len(used), names, train2, test2, width)


class MultiLabel(Task):
    """0/1 label vectors, binary cross-entropy on logits; micro-F1 is the headline, subset accuracy beside it."""

    name = "multilabel"
    metric = "micro_f1"
    higher_is_better = True
    metric_is_fraction = True

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        per_sample = nn.functional.binary_cross_entropy_with_logits(outputs, targets, reduction="none").mean(dim=1)
        return per_sample.mean() if reduction == "mean" else per_sample.sum()

    def metric_sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        predicted = outputs > 0
        truth = targets > 0.5
        tp = (predicted & truth).sum()
        fp = (predicted & ~truth).sum()
        fn = (~predicted & truth).sum()
        exact = (predicted == truth).all(dim=1).sum()
        return torch.stack([tp, fp, fn, exact]).double()

    def finish(self, sums: torch.Tensor, samples: int) -> dict[str, float]:
        tp, fp, fn, exact = (float(v) for v in sums.cpu())
        denominator = 2 * tp + fp + fn
        return {"micro_f1": 2 * tp / denominator if denominator else 1.0, "subset_accuracy": exact / max(samples, 1)}

    def labels(self, train: np.ndarray, test: np.ndarray, where: str) -> Labels:
        width = None
        for split, y in (("train", train), ("test", test)):
            if y.ndim != 2:
                raise _first_bad(where, split, 0, y[0].tolist(), "not a 0/1 label vector",
                                 "; for one class per sample use --task classification")  # fmt: skip
            if width is not None and y.shape[1] != width:
                raise DataError(f"{where}: {split} label vectors have {y.shape[1]} entries, training ones {width}")
            width = y.shape[1]
            if y.dtype.kind not in "biuf":
                raise _first_bad(where, split, 0, y[0].tolist(), f"of {y.dtype}, not 0/1 values")
            bad = ~((y == 0) | (y == 1)).all(axis=1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise _first_bad(where, split, i, y[i].tolist(), "not a vector of 0s and 1s")
        assert width is not None
        if width < 1:
            raise DataError(f"{where}: label vectors are empty")
        train2, test2 = train.astype(np.float32), test.astype(np.float32)
        sets, inverse = np.unique(np.concatenate([train2, test2]).astype(np.uint8), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        names = tuple("{" + ",".join(str(j) for j in np.flatnonzero(row)) + "}" for row in sets)
        keys_train, keys_test = inverse[: len(train2)].astype(np.int64), inverse[len(train2) :].astype(np.int64)
        return Labels(keys_train, keys_test, len(sets), names, train2, test2, width)


CLASSIFICATION = Classification()
TASKS: dict[str, Task] = {"classification": CLASSIFICATION, "regression": Regression(), "multilabel": MultiLabel()}
assert tuple(TASKS) == TASK_NAMES, "task_names.TASK_NAMES must list the built-in tasks"


def resolve_task(name: str) -> Task:
    """The task ``name`` stands for: a built-in task's one instance, or what a factory returns.

    Raises:
        ConfigError: an unknown name, or a factory that fails or returns something other than a Task.
    """
    check_task_name(name)
    if name in TASKS:
        return TASKS[name]
    factory = load_factory(name, "task factory", ConfigError)
    try:
        task = factory()
    except Exception as exc:  # the user's code: one line
        raise ConfigError(f"task factory {name} raised {one_line(exc)}") from None
    if not isinstance(task, Task):
        raise ConfigError(f"task factory {name} returned a {type(task).__name__}, not an edge_node Task")
    return task


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Batch], task: Task) -> dict[str, float]:
    """The task's metrics of ``model`` over ``batches`` (summed on the model's device, read once at the end)."""
    model.eval()
    sums: torch.Tensor | None = None
    samples = 0
    for x, y in batches:
        part = task.metric_sums(model(x), y)
        sums = part if sums is None else sums + part
        samples += int(y.shape[0])
    if sums is None:
        return {task.metric: float("nan")}
    return task.finish(sums, samples)


class Score(float):
    """A task's headline metric that carries all of the task's metrics (``metrics``: R² beside MAE, ...).

    A float, so every path that averages, compares and records accuracies takes it unchanged; the record
    builders read ``metrics`` where they can (``edge_node.records.metrics_of``)."""

    metrics: dict[str, float]

    def __new__(cls, value: float, metrics: dict[str, float]) -> Score:
        made = super().__new__(cls, value)
        made.metrics = dict(metrics)
        return made

    def __reduce__(self) -> tuple[object, tuple[float, dict[str, float]]]:  # pickled across torchrun ranks
        return (Score, (float(self), self.metrics))


def score(model: nn.Module, batches: Iterable[Batch], task: Task) -> Score:
    """The task's headline metric of ``model`` over ``batches``, with all its metrics attached."""
    metrics = evaluate(model, batches, task)
    return Score(metrics[task.metric], metrics)
