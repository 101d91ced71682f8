"""A daemon's round records and state directory as ``edge-node start`` writes them (for report and metrics tests).

The record has every key the daemon writes (``edge_node/node/daemon.py``, ``run_round``); values are given
by round so that sums are easy to check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def node_record(node_id: str, t: int, *, start_unix: float = 1_700_000_000.0, label: str = "estimated",
                refusals: dict[str, int] | None = None,
                retries: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """Round ``t`` (0-based) of ``node_id``: accuracy 0.3 + 0.1 t after training, 1 MB in, 2 MB out, 10 s, 20 J."""
    return {
        "round": t, "node_id": node_id, "time_unix": start_unix + 10.0 * (t + 1), "tier": "0.6", "density": 0.6,
        "lockstep": False, "peers_asked": ["a", "b"], "peers_answered": ["a"], "peer_rounds": {"a": t},
        "peers_refused": {k: {"kind": k, "detail": "x"} for k in (refusals or {})}, "refusals": dict(refusals or {}),
        "pull_retries": dict(retries or {}),
        "bytes_in": 1_000_000, "bytes_out": 2_000_000, "streams_served": 2, "server_refusals": {"busy": t},
        "discovery_refusals": {"other_fleet": 1}, "acc_before": 0.1 + 0.1 * t, "acc_after": 0.3 + 0.1 * t,
        "train_loss": 1.0, "samples": 600, "lr": 0.1, "seconds": {"communicate": 1.0, "aggregate": 0.5, "train": 8.0,
        "idle": 0.5}, "joules": {"communicate": 2.0, "aggregate": 1.0, "train": 16.0, "idle": 1.0},
        "energy_total_j": 20.0, "energy_label": label, "energy_source": "estimate" if label == "estimated" else "rapl",
    }  # fmt: skip


def write_node_dir(path: Path, node_id: str, rounds: int, *, planned: int = 0) -> Path:
    """A state dir after ``rounds`` rounds of a node started with ``--rounds planned`` (0: until stopped)."""
    path.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(node_record(node_id, t)) for t in range(rounds)]
    (path / "rounds.jsonl").write_text("".join(line + "\n" for line in lines))
    (path / "node-config.toml").write_text(f'node_id = "{node_id}"\nfleet = "lab"\nrounds = {planned}\n')
    return path
