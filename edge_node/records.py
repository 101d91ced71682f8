"""The round record: one schema for the daemon's and the simulation's ``rounds.jsonl`` (docs/API.md, "Round records").

A *node entry* is what one node (a daemon, or one client of a simulation) did in one round, under the same
names in both (:data:`NODE_KEYS`, built by :func:`node_entry`). The daemon's record is one such entry plus the
round, the task's metric names (:data:`TASK_KEYS`) and what only a device knows (peers, refusals, measured
energy). The simulation's record holds one entry per client under ``nodes``, beside the fleet's aggregates
built from them (:func:`node_means`, the ``_mean`` of an entry's key) and what only a simulation knows (the
method, the busiest node, paper MB, FLOPs, modelled energy).

Records written before this schema (the simulation's per-client lists ``acc_before``, ``bytes_received``, ...)
are read through :func:`upgrade_record`, the one place that maps old key names to new ones; every reader of
``rounds.jsonl`` goes through :func:`read_records` (or, reading a log as it grows, :func:`upgrade_record`).

Foundations layer: no torch, importable by node/, sim/ and fleet/ alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge_node.errors import CheckpointError

ROUNDS_LOG = "rounds.jsonl"  # a simulation's run directory's and a node's state directory's

# One node's round, under the same names in the daemon's record and in each of the simulation's ``nodes``.
NODE_KEYS = ("node_id", "acc_before", "acc_after", "metrics", "bytes_in", "bytes_out")
# What the ``acc_*`` values and ``metrics`` measure: the task and its headline metric (every record carries them).
TASK_KEYS = ("task", "metric", "metric_higher_is_better", "metric_is_fraction")
# What a record written before tasks existed measured (readers' defaults where a record lacks TASK_KEYS).
TASK_DEFAULTS = {"task": "classification", "metric": "accuracy", "metric_higher_is_better": True,
                 "metric_is_fraction": True}  # fmt: skip
# The fleet's aggregates of the entries, in the simulation's record (:func:`node_means`).
MEAN_KEYS = ("acc_before_mean", "acc_after_mean", "bytes_in_mean", "metrics_mean")

# The privacy fields of a DP run (both kinds; a daemon's also says whether its budget allows another round).
PRIVACY_KEYS = ("privacy", "dp_epsilon_spent", "dp_epsilon_target", "dp_delta", "dp_noise_multiplier")
# Every key of the simulation's round record, whatever the method (null where one does not apply).
SIM_KEYS = (
    "round", "method", "partition", "partition_variant", "lr", "prune_rate", "acc_mean", "acc_mean_is",
    "acc_before_is", "acc_after_is", *TASK_KEYS, *MEAN_KEYS, "nodes", "train_loss_mean", "trained_clients",
    "server_bytes_in", "server_bytes_out", "busiest_node", "busiest_node_bytes", "paper_comm_mb_mean",
    "paper_comm_mb_busiest", "flops_per_client_mean", "flops_per_client_max", "density_mean", "densities_target",
    "forward_flops_dense", "s2s_pruned", "s2s_start_round", "s2s_stable_fraction", "s2s_stability_median",
    "screen", "screen_refusals", "screen_refused", "norm_stats", *PRIVACY_KEYS, "modelled_energy", "wall_s",
)  # fmt: skip
# Every key of the daemon's round record: a node entry, the task, and what a device knows.
DAEMON_KEYS = (
    "round", *NODE_KEYS, *TASK_KEYS, "time_unix", "tier", "density", "lockstep", "peers_asked", "peers_answered",
    "peer_rounds", "peers_refused", "refusals", "pull_retries", "streams_served", "server_refusals",
    "discovery_refusals", "train_loss", "samples", "test_samples", "samples_arrived", "data_refused", "lr", "seconds",
    "joules", "energy_total_j", "energy_label", "energy_source",
)  # fmt: skip
# Keys a daemon's record carries only when they apply (FedBN statistics, DP-SGD, a catch-up, peers far ahead, a
# tier move of capacity auto at this round's start, a poisoned loopback fleet's attackers).
DAEMON_OPTIONAL_KEYS = (
    "norm_stats", *PRIVACY_KEYS, "dp_budget_left", "caught_up_from", "caught_up_to", "ahead_not_followed",
    "tier_move", "attackers", "attack", "tier_mode", "width",
)  # fmt: skip
# A daemon's record of a round that diverged (rolled back, nothing published).
DIVERGED_KEYS = (
    "round", "node_id", "time_unix", "diverged", "reason", "peers_asked", "peers_answered", "peers_refused",
    "refusals", "pull_retries", "server_refusals", "discovery_refusals", "seconds", "joules", "energy_label",
)  # fmt: skip

# Records written before this schema: a simulation's record held its per-client values as lists (old name ->
# node entry key) and named some aggregates otherwise (old name -> new name).
OLD_PER_CLIENT_LISTS = {"acc_before": "acc_before", "acc_after": "acc_after", "bytes_received": "bytes_in",
                        "bytes_sent": "bytes_out"}  # fmt: skip
OLD_NAMES = {
    "bytes_received_mean": "bytes_in_mean",
    "server_bytes_received": "server_bytes_in",
    "server_bytes_sent": "server_bytes_out",
    "acc_metric": "acc_mean_is",
}


class TaskNames(Protocol):
    """What :func:`task_fields` reads of a task (edge_node.algorithm.tasks.Task)."""

    name: str
    metric: str
    higher_is_better: bool
    metric_is_fraction: bool


def task_fields(task: TaskNames) -> dict[str, Any]:
    """The :data:`TASK_KEYS` of ``task``: how to read a record's (or a status's) ``acc_*`` values and ``metrics``."""
    return dict(zip(TASK_KEYS, (task.name, task.metric, task.higher_is_better, task.metric_is_fraction), strict=True))


def client_id(index: int) -> str:
    """A simulation client's ``node_id`` in records (``client-3``)."""
    return f"client-{index}"


def metrics_of(value: object) -> dict[str, float] | None:
    """Every metric of the task a headline value carries (an ``algorithm.tasks.Score``); None for a plain number."""
    metrics = getattr(value, "metrics", None)
    return None if metrics is None else {k: float(v) for k, v in metrics.items()}


def node_entry(
    node_id: str, acc_before: float | None, acc_after: float | None, bytes_in: int, bytes_out: int, *, headline: str,
) -> dict[str, Any]:  # fmt: skip
    """One node's round under :data:`NODE_KEYS`.

    Args:
        node_id: the daemon's node id, or :func:`client_id` of a simulation client.
        acc_before, acc_after: the task's headline metric (accuracy for classification) on the node's local test
            data before and after its local training (None: not measured this round).
        bytes_in, bytes_out: encoded model bytes received from and sent to others this round.
        headline: ``"before"`` or ``"after"``: whose evaluation ``metrics`` holds every metric of.
    """
    return {
        "node_id": node_id,
        "acc_before": acc_before,
        "acc_after": acc_after,
        "metrics": metrics_of(acc_after if headline == "after" else acc_before),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
    }


def node_means(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The fleet's :data:`MEAN_KEYS` over ``entries`` (node entries of one round); a mean is None where an entry
    lacks the value (``acc_after`` not measured; ``metrics`` of a plain number)."""

    def mean(key: str) -> float | None:
        values = [e.get(key) for e in entries]
        known: list[Any] = [v for v in values if v is not None]  # as they are: ints stay ints (np.mean's sum)
        return float(np.mean(known)) if values and len(known) == len(values) else None

    metrics = [m for m in (e.get("metrics") for e in entries) if isinstance(m, Mapping)]
    metrics_mean = None
    if metrics and len(metrics) == len(entries):
        names = [k for k in metrics[0] if all(k in m for m in metrics)]
        metrics_mean = {k: float(np.mean([m[k] for m in metrics])) for k in names}
    return {
        "acc_before_mean": mean("acc_before"),
        "acc_after_mean": mean("acc_after"),
        "bytes_in_mean": mean("bytes_in"),
        "metrics_mean": metrics_mean,
    }


def per_node(record: Mapping[str, Any], key: str) -> list[Any]:
    """``key`` of each of a simulation record's node entries, in client order."""
    return [entry.get(key) for entry in record["nodes"]]


def upgrade_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` under today's names (the one place old names are mapped): a simulation record written before
    node entries gets ``nodes`` from its per-client lists, renamed aggregates get their new names, and one
    written before methods gets ``acc_mean`` (then the accuracy after local training). A record of today comes
    back unchanged (the same dict)."""
    old_lists = "nodes" not in record and isinstance(record.get("acc_before"), list)
    before_methods = record.get("acc_mean") is None and record.get("acc_after_mean") is not None
    if not (old_lists or before_methods or any(k in record for k in OLD_NAMES)):
        return record
    upgraded = {OLD_NAMES.get(k, k): v for k, v in record.items() if not (old_lists and k in OLD_PER_CLIENT_LISTS)}
    if before_methods:  # a simulation before methods: its headline was the accuracy after local training
        upgraded["acc_mean"] = record["acc_after_mean"]
    if old_lists:
        n = len(record["acc_before"])
        columns = {new: record.get(old) or [None] * n for old, new in OLD_PER_CLIENT_LISTS.items()}
        columns["node_id"] = [client_id(i) for i in range(n)]
        columns["metrics"] = [None] * n  # not recorded per client then
        upgraded["nodes"] = [{k: columns[k][i] for k in NODE_KEYS} for i in range(n)]
    return upgraded


def parse_records(lines: Iterable[str], where: str) -> list[dict[str, Any]]:
    """Records of JSON ``lines`` (blank ones skipped), upgraded; CheckpointError naming ``where`` and the line."""
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(upgrade_record(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{where}:{number} is not valid JSON: {exc.msg}") from exc
    return records


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """The round records of a run directory or a node's state directory (its ``rounds.jsonl``), in today's names."""
    path = run_dir / ROUNDS_LOG
    if not path.is_file():
        raise CheckpointError(
            f"{path} not found: not a run directory (a simulation's output, a node's state dir or a loopback"
            " fleet's output)"
        )
    return parse_records(path.read_text().splitlines(), str(path))
