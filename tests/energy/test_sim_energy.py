"""A real `edge-node simulate` run with the default meter choice, then `edge-node energy` on its directory.

On a machine without a meter (this one, CI): the run says once that none was found and what it uses
instead, no record claims to be measured, and `edge-node energy` says so and shows the modelled joules
apart. On a machine with a meter the same run must be measured throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_node.cli import main

TINY_RUN = ["--dataset", "demo", "--clients", "2", "--neighbours", "1", "--rounds", "2", "--epochs", "1",
            "--samples-per-client", "40", "--batch-size", "20", "--no-progress", "--cache-dir"]  # fmt: skip
NO_METER = "no energy meter found"


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(run directory, stderr) of a two-round simulation in a child process, as a user runs it."""
    root = tmp_path_factory.mktemp("sim-energy")
    out = root / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "edge_node", "simulate", *TINY_RUN, str(root / "cache"), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out, done.stderr


def _energy_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(["energy", *argv])
    out, err = capsys.readouterr()
    assert info.value.code in (0, None), err
    return out


def test_simulation_energy_is_labelled_and_reported_honestly(sim_run: tuple[Path, str], capsys) -> None:  # noqa: ANN001
    run, stderr = sim_run
    records = [json.loads(line) for line in (run / "energy.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [0, 1]
    assert all(isinstance(r.get("modelled_j"), float) and r["modelled_j"] > 0 for r in records)
    table = _energy_cli([str(run)], capsys)
    summary = json.loads(_energy_cli([str(run), "--format", "json"], capsys))
    if NO_METER in stderr:  # this machine and CI
        assert stderr.count(NO_METER) == 1, stderr  # said once, not per round
        (line,) = [x for x in stderr.splitlines() if NO_METER in x]
        assert "WARNING" in line and "using an ESTIMATE of CPU time" in line and "labelled estimated" in line
        for record in records:
            assert record["measured"] is False and record["label"] == "estimated" and record["source"] == "estimate"
        assert table.splitlines()[2].startswith("NO energy measurement was available")
        assert "total ESTIMATED (estimate)" in table and "MEASURED" not in table
        assert summary["measured"] is False and summary["estimated"] is True
    else:  # a machine with a meter (the GPU machine: nvml)
        for record in records:
            assert record["measured"] is True and record["label"] == "measured" and record["source"] != "estimate"
        assert "NO energy measurement" not in table and "total MEASURED" in table
        assert summary["measured"] is True and summary["estimated"] is False
    # The modelled figure is shown apart, labelled, and never added to the metered joules.
    assert "total MODELLED (not measured)" in table and "modelled J" in table
    assert summary["modelled"]["label"] == "modelled"
    assert summary["modelled"]["total_j"] == pytest.approx(sum(r["modelled_j"] for r in records))
    metered = next(iter(summary["totals"].values()))
    assert metered["total_j"] == pytest.approx(sum(r["total_j"] for r in records), abs=1e-3)
