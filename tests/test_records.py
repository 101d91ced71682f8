"""The round-record schema (edge_node.records): node entries, the fleet's means built from them, old runs read
under today's names, and the one table of docs/API.md that documents every key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from edge_node.errors import CheckpointError
from edge_node.records import (
    DAEMON_KEYS,
    DAEMON_OPTIONAL_KEYS,
    DIVERGED_KEYS,
    NODE_KEYS,
    OLD_NAMES,
    OLD_PER_CLIENT_LISTS,
    SIM_KEYS,
    node_entry,
    node_means,
    per_node,
    read_records,
    upgrade_record,
)

API_MD = Path(__file__).resolve().parents[1] / "docs" / "API.md"


class _Score(float):
    """A headline value with every metric attached (as edge_node.algorithm.tasks.Score, without torch)."""

    metrics: dict[str, float]


def _score(value: float, **metrics: float) -> float:
    made = _Score(value)
    made.metrics = metrics
    return made


def test_a_node_entry_has_the_schemas_keys_and_the_headline_sides_metrics():
    after = _score(0.5, mae=0.5, r2=0.25)
    entry = node_entry("n0", 0.75, after, 10, 20, headline="after")
    assert tuple(entry) == NODE_KEYS and entry["metrics"] == {"mae": 0.5, "r2": 0.25}
    assert node_entry("n0", after, None, 0, 0, headline="before")["metrics"] == {"mae": 0.5, "r2": 0.25}
    assert node_entry("n0", 0.75, 0.5, 0, 0, headline="after")["metrics"] is None  # a plain number: none


def test_the_means_are_numpys_over_the_entries_and_unknown_where_an_entry_lacks_the_value():
    before = [0.1, 0.2, 0.7, 0.3, 0.9, 0.6, 0.05, 0.33, 0.41]  # 9 values: numpy's pairwise sum, not a plain one
    entries = [node_entry(f"client-{i}", _score(b, acc=b), None, 3 * i, i, headline="before")
               for i, b in enumerate(before)]  # fmt: skip
    means = node_means(entries)
    assert means["acc_before_mean"] == float(np.mean(before)) and means["acc_after_mean"] is None
    assert means["bytes_in_mean"] == float(np.mean([3 * i for i in range(9)]))
    assert means["metrics_mean"] == {"acc": float(np.mean(before))}
    entries[0]["metrics"] = None
    assert node_means(entries)["metrics_mean"] is None


def test_an_old_simulation_record_reads_under_todays_names_with_its_values():
    old = {
        "round": 3, "acc_mean": 0.4, "acc_metric": "after local training", "acc_before_mean": 0.25,
        "acc_before": [0.2, 0.3], "acc_after": [0.35, 0.45], "bytes_received": [10, 11], "bytes_sent": [12, 13],
        "bytes_received_mean": 10.5, "server_bytes_received": None, "server_bytes_sent": None,
    }  # fmt: skip
    new = upgrade_record(dict(old))
    assert not set(new) & (set(OLD_NAMES) | set(OLD_PER_CLIENT_LISTS))
    assert new["nodes"] == [
        {"node_id": "client-0", "acc_before": 0.2, "acc_after": 0.35, "metrics": None, "bytes_in": 10, "bytes_out": 12},
        {"node_id": "client-1", "acc_before": 0.3, "acc_after": 0.45, "metrics": None, "bytes_in": 11, "bytes_out": 13},
    ]  # fmt: skip
    assert (new["acc_mean_is"], new["bytes_in_mean"], new["server_bytes_in"]) == ("after local training", 10.5, None)
    assert per_node(new, "acc_after") == [0.35, 0.45] and new["acc_before_mean"] == 0.25
    fedavg = upgrade_record({"acc_before": [0.5], "acc_after": None, "bytes_received": [1], "bytes_sent": [2]})
    assert per_node(fedavg, "acc_after") == [None]
    before_methods = upgrade_record({"acc_before_mean": 0.1, "acc_after_mean": 0.3})
    assert before_methods["acc_mean"] == 0.3  # its headline was the accuracy after local training


def test_todays_records_come_back_as_they_are():
    daemon = {"round": 0, "node_id": "n0", "acc_before": 0.1, "acc_after": 0.2, "bytes_in": 1, "bytes_out": 2}
    sim = {"round": 0, "acc_mean": 0.2, "acc_after_mean": 0.2, "nodes": [daemon]}
    assert upgrade_record(daemon) is daemon and upgrade_record(sim) is sim


def test_the_reader_upgrades_every_line_and_names_a_bad_one(tmp_path):
    (tmp_path / "rounds.jsonl").write_text(json.dumps({"round": 0, "acc_before": [0.5], "acc_mean": 0.5}) + "\n\n")
    (record,) = read_records(tmp_path)
    assert per_node(record, "acc_before") == [0.5]
    (tmp_path / "rounds.jsonl").write_text("{}\nnot json\n")
    with pytest.raises(CheckpointError, match=r"rounds.jsonl:2 is not valid JSON"):
        read_records(tmp_path)
    with pytest.raises(CheckpointError, match="not a run directory"):
        read_records(tmp_path / "nowhere")


def test_the_record_keys_table_of_api_md_documents_every_key_once():
    text = API_MD.read_text()
    section = text[text.index("## Round records") :]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    table = section[: section.index("### Records of older versions")]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    documented = [key for row in rows for key in re.findall(r"`([a-z_0-9]+)`", row.split("|")[1])]
    keys = {*SIM_KEYS, *DAEMON_KEYS, *DAEMON_OPTIONAL_KEYS, *DIVERGED_KEYS}
    assert set(NODE_KEYS) <= set(DAEMON_KEYS)  # the daemon's record is one node entry
    assert sorted(k for k in keys if k not in documented) == []
    assert sorted(k for k in documented if documented.count(k) > 1) == []
    assert set(documented) <= keys, sorted(set(documented) - keys)
    for old, new in {**OLD_NAMES, **{k: f"nodes[].{v}" for k, v in OLD_PER_CLIENT_LISTS.items()}}.items():
        assert re.search(rf"\| `{old}`[^|]*\| `{re.escape(new)}` \|", section), (old, new)
