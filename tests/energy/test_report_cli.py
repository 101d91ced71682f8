"""`edge-node energy DIR` on logs written by the accountant: table, --json, --plot, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from edge_node.cli import main
from edge_node.energy import EnergyAccountant, EstimateMeter, modelled_energy


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.fixture
def measured_run(tmp_path: Path, scripted_meter, fake_clock) -> Path:
    """Three measured rounds: 10 J train + 2 J communicate + 1 J idle each, 4 s per round."""
    run = tmp_path / "run"
    with EnergyAccountant(scripted_meter, run / "energy.jsonl", clock=fake_clock) as acct:
        for r in range(3):
            with acct.phase("train"):
                fake_clock.t_s += 2
                scripted_meter.energy_j += 10
            with acct.phase("communicate"):
                fake_clock.t_s += 1
                scripted_meter.energy_j += 2
            fake_clock.t_s += 1
            scripted_meter.energy_j += 1
            acct.close_round(r, modelled=modelled_energy(1e9, 1000, 1000).to_dict())
    return run


@pytest.fixture
def estimated_run(tmp_path: Path, fake_clock) -> Path:
    cpu_s = [0.0]
    run = tmp_path / "est"
    meter = EstimateMeter(10.0, cpu_seconds=lambda: cpu_s[0], clock=fake_clock)
    with EnergyAccountant(meter, run / "energy.jsonl", clock=fake_clock) as acct:
        for r in range(2):
            with acct.phase("train"):
                cpu_s[0] += 1.0
                fake_clock.t_s += 2
            acct.close_round(r)
    return run


def test_table_shows_rounds_phases_power_and_source(measured_run: Path, capsys) -> None:
    code, out, err = _run(["energy", str(measured_run)], capsys)
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("round"))
    for column in ("total J", "train J", "aggregate J", "communicate J", "idle J", "mean W", "modelled J"):
        assert column in header
    rows = [line.split() for line in lines if line.split()[:1] in (["1"], ["2"], ["3"])]
    assert len(rows) == 3  # rounds 1..3 for people (the records' 0-based 0..2)
    assert rows[0][:8] == ["1", "measured", "fake-counter", "13.0", "10.0", "0.0", "2.0", "1.0"]
    assert rows[0][9] == "3.25"  # mean power: 13 J / 4 s
    assert "total MEASURED (fake-counter): 39.0 J over 3 round(s), 12.0 s, mean 3.25 W" in out
    assert "MODELLED (not measured)" in out
    assert "NO energy measurement" not in out


def test_json_output(measured_run: Path, capsys) -> None:
    code, out, _ = _run(["energy", str(measured_run), "--json"], capsys)
    assert code == 0
    summary = json.loads(out)
    assert summary["measured"] is True and summary["estimated"] is False
    assert summary["totals"]["measured"]["total_j"] == pytest.approx(39.0)
    assert summary["totals"]["measured"]["joules"]["train"] == pytest.approx(30.0)
    assert [row["round"] for row in summary["rows"]] == [0, 1, 2]
    assert summary["modelled"]["label"] == "modelled"
    assert summary["modelled"]["total_j"] == pytest.approx(3 * modelled_energy(1e9, 1000, 1000).total_j)


def test_plot_writes_a_png(measured_run: Path, tmp_path: Path, capsys) -> None:
    png = tmp_path / "plots" / "energy.png"
    code, out, _ = _run(["energy", str(measured_run), "--plot", str(png)], capsys)
    assert code == 0 and f"plot written to {png}" in out
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 200


def test_estimated_run_says_no_measurement(estimated_run: Path, tmp_path: Path, capsys) -> None:
    code, out, _ = _run(["energy", str(estimated_run), "--plot", str(tmp_path / "e.png")], capsys)
    assert code == 0
    assert "NO energy measurement was available" in out.splitlines()[2]  # right under the file line
    assert "total ESTIMATED (estimate): 20.0 J" in out
    assert "MEASURED" not in out
    code, out, _ = _run(["energy", str(estimated_run), "--json"], capsys)
    summary = json.loads(out)
    assert summary["measured"] is False and summary["estimated"] is True
    assert "measured" not in summary["totals"]


def test_missing_log_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    code, out, err = _run(["energy", str(tmp_path)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("edge-node: error: no energy log at")
    code, _, err = _run(["energy", str(tmp_path / "nope")], capsys)
    assert code == 2 and err.count("\n") == 1 and "nope does not exist" in err


def test_corrupt_line_is_one_line_exit_2(measured_run: Path, capsys) -> None:
    log = measured_run / "energy.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    code, _, err = _run(["energy", str(measured_run)], capsys)
    assert code == 2 and err.count("\n") == 1 and "line 2 is not JSON" in err


def test_record_without_label_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "energy.jsonl").write_text(json.dumps({"round": 0, "total_j": 1.0}) + "\n")
    code, _, err = _run(["energy", str(tmp_path)], capsys)
    assert code == 2 and "'label' is None" in err


def test_last_line_cut_by_a_kill_is_skipped_with_a_note(measured_run: Path, capsys) -> None:
    log = measured_run / "energy.jsonl"
    with log.open("a") as handle:
        handle.write('{"round": 3, "joules": {"tra')
    code, out, _ = _run(["energy", str(measured_run)], capsys)
    assert code == 0
    assert "3 record(s)" in out and "line 4 is incomplete" in out


def test_modelled_j_number_is_shown_apart(tmp_path: Path, scripted_meter, fake_clock, capsys) -> None:
    """The simulation attaches ``modelled_j=<float>``; it shows as its own column and total."""
    with EnergyAccountant(scripted_meter, tmp_path / "energy.jsonl", clock=fake_clock) as acct:
        fake_clock.t_s, scripted_meter.energy_j = 1.0, 5.0
        acct.close_round(0, modelled_j=0.25)
    code, out, _ = _run(["energy", str(tmp_path)], capsys)
    assert code == 0 and "modelled J" in out
    assert "total MODELLED (not measured): 0.250 J over 1 round(s)" in out
    assert "total MEASURED (fake-counter): 5.0 J" in out  # not summed with the modelled joules
