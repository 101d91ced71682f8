"""``edge-node simulate`` end to end on the built-in demo set: outputs, accounting, resume, bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edge_node.cli import main

SMALL = [
    "simulate",
    "--dataset",
    "demo",
    "--clients",
    "6",
    "--neighbours",
    "2",
    "--epochs",
    "1",
    "--samples-per-client",
    "150",
    "--no-progress",
    "--energy-backend",
    "estimate",
]


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(args)
    return int(exc.value.code or 0)


def rounds(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def strip_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in records]


@pytest.fixture(scope="module")
def two_round_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "run"
    assert run_cli([*SMALL, "--rounds", "2", "--output", str(out)]) == 0
    return out


def test_run_writes_reports_with_consistent_accounting(two_round_run: Path):
    records = rounds(two_round_run)
    assert [r["round"] for r in records] == [0, 1]
    for r in records:
        assert len(r["acc_after"]) == 6 and all(0.0 <= a <= 1.0 for a in r["acc_after"])
        assert sum(r["bytes_sent"]) == sum(r["bytes_received"]) > 0  # every pulled byte was served
        assert r["busiest_node_bytes"] == max(s + v for s, v in zip(r["bytes_sent"], r["bytes_received"], strict=True))
        assert r["modelled_energy"]["label"] == "modelled"
        # 2 neighbours x ~half of the cnn's 797,962 parameters x 4 bytes
        assert r["paper_comm_mb_mean"] == pytest.approx(2 * 0.5 * 797_962 * 4 / 1e6, rel=0.01)
    assert records[1]["acc_after_mean"] > 0.15  # above chance (0.1) after two rounds on the demo set
    for name in ("summary.json", "config.json", "accuracy.png", "communication.png", "energy.jsonl"):
        assert (two_round_run / name).is_file(), name
    assert (two_round_run / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    energy = [json.loads(line) for line in (two_round_run / "energy.jsonl").read_text().splitlines()]
    assert len(energy) == 2 and not any(e["measured"] for e in energy)
    summary = json.loads((two_round_run / "summary.json").read_text())
    assert set(summary["machine_energy"]) == {"estimated"}  # no meter here: never called measured
    assert summary["machine_energy"]["estimated"]["total_j"] == pytest.approx(sum(e["total_j"] for e in energy))


def test_resume_continues_exactly_where_it_stopped(two_round_run: Path, tmp_path: Path):
    out = tmp_path / "resumed"
    assert run_cli([*SMALL, "--rounds", "1", "--planned-rounds", "2", "--output", str(out)]) == 0
    assert len(rounds(out)) == 1
    assert run_cli([*SMALL, "--rounds", "2", "--planned-rounds", "2", "--output", str(out)]) == 0
    straight = json.loads((two_round_run / "config.json").read_text())
    assert straight["rounds"] == 2
    assert strip_timing(rounds(out)) == strip_timing(rounds(two_round_run))


def test_resume_with_other_settings_is_refused(two_round_run: Path, capsys):
    before = (two_round_run / "rounds.jsonl").read_text()
    assert run_cli([*SMALL, "--rounds", "3", "--seed", "9", "--output", str(two_round_run)]) == 2
    assert "seed" in capsys.readouterr().err
    assert (two_round_run / "rounds.jsonl").read_text() == before


def test_fresh_with_invalid_settings_keeps_the_old_run(two_round_run: Path, capsys):
    before = {f.name: f.read_bytes() for f in two_round_run.iterdir()}
    # 6 clients x 5000 samples exceed the demo set: refused after --fresh was asked, before it acts
    args = [*SMALL, "--rounds", "1", "--fresh", "--output", str(two_round_run), "--samples-per-client", "5000"]
    assert run_cli(args) == 2
    assert "samples_per_client=5000" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in two_round_run.iterdir()} == before


def test_setting_ii_with_gradient_regrowth(tmp_path: Path):
    out = tmp_path / "ii"
    assert run_cli([*SMALL, "--rounds", "1", "--setting", "ii", "--regrow", "gradient", "--output", str(out)]) == 0
    (record,) = rounds(out)
    # gradient regrowth adds B * 3 * F(dense) to each client's FLOPs
    assert record["flops_per_client_max"] > 1 * 150 * 3 * 0.2 * record["forward_flops_dense"]
    assert record["densities_target"] == [0.2, 0.4, 0.6, 0.8, 1.0]
    # clients 0..5 get tiers 0.2, 0.4, 0.6, 0.8, 1.0, 0.2
    assert record["density_mean"] == pytest.approx((0.2 + 0.4 + 0.6 + 0.8 + 1.0 + 0.2) / 6, abs=0.01)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--model", "resnet50"], "unknown model 'resnet50'"),
        (["--density", "1.5"], "density=1.5"),
        (["--density", "0"], "density=0.0"),
        (["--neighbours", "6"], "neighbours=6"),
        (["--dataset", "cifar10", "--data-dir", "/nonexistent/cifar"], "/nonexistent/cifar"),
        (["--partition", "zipf:2"], "zipf"),
        (["--density", "0.3", "--setting", "ii"], "--setting ii"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, capsys, extra, needle):
    out = tmp_path / "never"
    assert run_cli([*SMALL, "--rounds", "1", "--output", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edge-node: error:") and needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_cuda_without_a_gpu_is_refused_before_any_data_is_decoded(tmp_path: Path, capsys, monkeypatch):
    import torch

    import edge_node.cli.simulate as simulate_cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(simulate_cli, "load_dataset", lambda *a, **k: pytest.fail("data decoded before the check"))
    out = tmp_path / "never"
    assert run_cli([*SMALL, "--rounds", "1", "--device", "cuda", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edge-node: error:") and "cuda" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_corrupt_dataset_archive_is_refused(tmp_path: Path):
    bad = tmp_path / "cifar.tar.gz"
    bad.write_bytes(b"this is not a gzip file")
    out = tmp_path / "never"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_node",
            *SMALL,
            "--rounds",
            "1",
            "--dataset",
            "cifar10",
            "--data-dir",
            str(bad),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "cifar.tar.gz" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_a_diverging_run_stops_with_exit_5_keeping_earlier_rounds(tmp_path: Path, capsys):
    """lr=1e20: the loss turns NaN within a round or two. No accuracy of a NaN model is ever recorded."""
    out = tmp_path / "nan"
    assert run_cli([*SMALL, "--rounds", "3", "--lr", "1e20", "--output", str(out)]) == 5
    err = capsys.readouterr().err.strip().splitlines()[-1]
    found = re.match(r"edge-node: error: training diverged in round (\d+): client \d+ has loss nan", err)
    assert found and "lower --lr" in err, err
    diverged = int(found.group(1))
    recorded = rounds(out) if (out / "rounds.jsonl").exists() else []
    assert [r["round"] for r in recorded] == list(range(diverged))
