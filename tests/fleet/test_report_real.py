"""``edge-node report`` on real runs: a daemon's state directory and a loopback fleet's output."""

from __future__ import annotations

import json
import os
from pathlib import Path

from edge_node.exit_codes import ExitCode
from tests.daemons import run_cli
from tests.run_dirs import write_node_dir

PNG = b"\x89PNG\r\n\x1a\n"


def test_a_state_dir_that_stopped_early_is_reported_as_such(tmp_path: Path):
    node = write_node_dir(tmp_path / "state", "pi-1", 3, planned=5)
    result = run_cli(["report", str(node)])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "**Stopped early** (accuracies are the last recorded, not final): pi-1 3 of 5 rounds done." in out, out
    assert "| pi-1 | 0.6 | 3 of 5 rounds done: stopped early | 30.0% -> 50.0% | 3.00 | 6.00 |" in out, out
    assert "| busy 2 | other_fleet 1 | 60.0 (estimated) |" in out, out
    report = json.loads((node / "report" / "run-report.json").read_text())  # inside the run, not the cwd
    assert report["stopped_early"] == ["pi-1"] and report["nodes"][0]["rounds"] == 3
    assert (node / "report" / "run-report.png").read_bytes()[:8] == PNG


def test_a_finished_node_says_complete_and_one_without_a_plan_counts_rounds(tmp_path: Path):
    done = write_node_dir(tmp_path / "done", "a", 2, planned=2)
    forever = write_node_dir(tmp_path / "forever", "b", 1, planned=0)
    result = run_cli(["report", str(done), str(forever), "--output", str(tmp_path / "r")])
    assert result.returncode == 0, result.stderr
    assert "| a | 0.6 | 2 of 2 rounds done |" in result.stdout and "| b | 0.6 | 1 round done |" in result.stdout
    assert "Stopped early" not in result.stdout


def test_a_loopback_output_is_one_table_with_the_fleet_mean_per_round(tmp_path: Path):
    fleet = tmp_path / "fleet"
    for i, rounds in enumerate((3, 3, 2)):
        write_node_dir(fleet / f"node{i}", f"node{i}", rounds, planned=3)
    (fleet / "fleet-summary.json").write_text(json.dumps({"fleet": {"nodes": 3, "rounds": 3}}))
    result = run_cli(["report", str(fleet)])  # from the checkout: nothing may land in it
    assert result.returncode == 0, result.stderr
    assert "node2 2 of 3 rounds done" in result.stdout
    assert "1: 30.0% (3 nodes), 2: 40.0% (3 nodes), 3: 50.0% (2 nodes)" in result.stdout, result.stdout
    rows = (fleet / "report" / "run-report.csv").read_text().splitlines()
    assert len(rows) == 4 and rows[0].startswith("node_id,tiers,rounds,rounds_planned,complete")
    assert not (Path(os.getcwd()) / "report" / "run-report.md").exists()


def test_mixing_a_simulation_with_a_node_or_a_stranger_is_one_line_exit_2(tmp_path: Path):
    node = write_node_dir(tmp_path / "state", "pi-1", 1)
    sim = tmp_path / "sim"
    sim.mkdir()
    (sim / "config.json").write_text("{}")
    (sim / "rounds.jsonl").write_text("")
    for args in ([str(node), str(sim)], [str(node), str(tmp_path / "empty")]):
        (tmp_path / "empty").mkdir(exist_ok=True)
        result = run_cli(["report", *args, "--output", str(tmp_path / "r")])
        assert result.returncode == int(ExitCode.BAD_INPUT), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "report apart" in result.stderr
    assert not (tmp_path / "r").exists()
