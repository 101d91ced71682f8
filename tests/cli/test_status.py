"""``edge-node status`` as a person reads it: rounds counted one way, no "None", the records' names."""

from __future__ import annotations

from edge_node.cli.status import format_status
from edge_node.node.status import round_label, rounds_done_text

LIVE = {
    "source": "live", "healthy": True, "pid": 42, "node_id": "vm", "fleet": "lab", "port": 7878, "model": "cnn",
    "tier": "0.6", "density": 0.6, "rounds_done": 1, "rounds_planned": 5, "phase": "train", "acc_after": 0.5,
    "peers": [
        {"node_id": "a", "last_result": "ok", "last_round": 3, "backoff_s": 0},
        {"node_id": "b", "last_result": "unreachable", "last_round": None, "backoff_s": 2.5},
        {"node_id": "c", "last_result": "", "last_round": None, "backoff_s": 0},
    ],
}  # fmt: skip


def test_rounds_are_counted_from_one_and_pluralised():
    assert round_label(0) == "round 1" and round_label(2, 8) == "round 3/8" and round_label(2, 0) == "round 3"
    assert rounds_done_text(1) == "1 round done" and rounds_done_text(0) == "0 rounds done"
    assert rounds_done_text(3) == "3 rounds done" and rounds_done_text(3, 5) == "3 of 5 rounds done"


def test_status_says_rounds_done_of_planned_and_the_last_accuracy():
    text = format_status(LIVE)
    assert "1 of 5 rounds done, phase train" in text, text
    assert "50.0% after local training" in text, text
    assert "1 rounds" not in format_status({**LIVE, "rounds_planned": None}), text


def test_a_peer_that_never_answered_shows_no_round_none():
    text = format_status(LIVE)
    assert "None" not in text, text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert "ok, its snapshot: 3 rounds done" in lines["a"]
    assert lines["b"].split(None, 1)[1] == "unreachable, backoff 2.5 s"
    assert lines["c"].split(None, 1)[1] == "not asked yet"


def test_status_text_shows_the_samples_and_the_tier_moves():
    text = format_status({**LIVE, "train_samples": 600, "test_samples": 120, "data_refresh": "round",
                          "samples_arrived": 6, "data_refused": {"undecodable": 1},
                          "capacity": {"source": "remeasured", "decided_by": "density 1 breaks: round 9 s > 5 s"},
                          "tier_moves": {"down": 1, "up": 0}})  # fmt: skip
    assert "600 training, 120 test samples; re-read every round: 6 arrived last, refused undecodable 1" in text
    assert "remeasured: density 1 breaks: round 9 s > 5 s; moved down 1x" in text
    plain = format_status({**LIVE, "train_samples": 600, "test_samples": 120}).splitlines()
    assert [line.split(None, 1)[1] for line in plain if line.startswith("data ")] == ["600 training, 120 test samples"]
