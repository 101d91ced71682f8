"""The tasks' names and how their metrics are written, without torch (foundations layer).

What reads records or config files only (the loopback supervisor, the fleet view, ``status``, reports) must
not import torch; the tasks themselves (losses, label contracts, metrics) are in edge_node.algorithm.tasks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from edge_node.errors import ConfigError
from edge_node.plugins import is_factory_path

TASK_NAMES = ("classification", "regression", "multilabel")  # edge_node.algorithm.tasks.TASKS' keys
# Built-in metrics shown as percentages (where only a metric's name is known: a Prometheus series).
FRACTION_METRICS = frozenset({"accuracy", "micro_f1", "subset_accuracy"})


def check_task_name(name: object) -> None:
    """Refuse a task name that is neither built in nor a factory ``package.module:function`` (no import)."""
    if not isinstance(name, str) or not (name in TASK_NAMES or is_factory_path(name)):
        raise ConfigError(f"task={name!r} must be one of {', '.join(TASK_NAMES)}, or a factory package.module:function")


def format_metric(value: float | None, *, fraction: bool, digits: int = 1) -> str:
    """``61.4%`` for a fraction (accuracy, F1; ``digits`` decimals), ``12.34`` (4 significant digits) for an
    error; None or NaN: unknown."""
    if value is None or math.isnan(value):
        return "unknown"
    return f"{100 * value:.{digits}f}%" if fraction else f"{value:.4g}"


def metric_label(record: Mapping[str, object]) -> str:
    """The short name of a record's headline metric: ``acc`` for accuracy (and records older than tasks)."""
    metric = record.get("metric") or "accuracy"
    return "acc" if metric == "accuracy" else str(metric)


def format_record_metric(record: Mapping[str, object], key: str, digits: int = 1) -> str:
    """A record's ``acc_*`` value ``key`` as its task shows it (records older than tasks: accuracy)."""
    value = record.get(key)
    fraction = bool(record.get("metric_is_fraction", True))
    return format_metric(value if isinstance(value, (int, float)) else None, fraction=fraction, digits=digits)
