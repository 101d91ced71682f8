"""``edge-node report``: a known set of run directories renders to a known table; the mask analysis of a run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_node.cli import main
from edge_node.errors import CheckpointError
from edge_node.sim.checkpoint import save_checkpoint
from edge_node.sim.masks import hamming_matrix, mask_report, write_mask_report
from edge_node.sim.table import build_table, caption, read_run, write_report

PNG = b"\x89PNG\r\n\x1a\n"


def _write_run(root: Path, name: str, method: str, partition: str, accs: list[float], busiest: list[float],
               paper_mb: float, flops: float) -> Path:  # fmt: skip
    run = root / name
    run.mkdir(parents=True)
    config = {"method": method, "partition": partition, "partition_variant": "reference", "setting": "i",
              "density": 0.5 if method.startswith("dispfl") else 1.0, "dataset": "cifar10", "model": "cnn",
              "clients": 20, "epochs": 2}  # fmt: skip
    (run / "config.json").write_text(json.dumps(config))
    records = [
        {
            "round": t,
            "acc_mean": a,
            "acc_before_mean": a,
            "busiest_node_bytes": b,
            "paper_comm_mb_busiest": paper_mb,
            "flops_per_client_mean": flops,
            "wall_s": 10.0,
        }  # fmt: skip
        for t, (a, b) in enumerate(zip(accs, busiest, strict=True))
    ]
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    return [
        _write_run(tmp_path, "a", "dispfl", "dir:0.3", [0.40, 0.50], [2e6, 4e6], 10.0, 1e9),
        _write_run(tmp_path, "b", "dispfl", "path:2", [0.60, 0.80], [3e6, 3e6], 10.0, 1e9),
        _write_run(tmp_path, "c", "fedavg", "dir:0.3", [0.20, 0.30], [8e6, 8e6], 20.0, 2e9),
        _write_run(tmp_path, "d", "local", "path:2", [0.70, 0.75], [0.0, 0.0], 0.0, 2e9),
    ]


EXPECTED = """\
| method | Dir(0.3) acc (%) | Path(2) acc (%) | busiest node MB/round (encoded) | busiest node MB/round (paper conv.) \
| FLOPs/client/round | rounds to 40.0% (Dir(0.3)) | rounds to 64.0% (Path(2)) |
|---|---|---|---|---|---|---|---|
| Local | - | 75.00 | 0.00 | 0.00 | 2e+09 | - | 1 |
| FedAvg | 30.00 | - | 8.00 | 20.00 | 2e+09 | not reached | - |
| DisPFL (d=0.5) | 50.00 | 80.00 | 3.00 | 10.00 | 1e+09 | 1 | 2 |
"""


def test_known_runs_render_to_the_known_table(runs: list[Path]):
    """Rounds to target default to 80 % of each partition's best final accuracy: Dir 0.8 * 50 = 40 (FedAvg's
    20, 30 never get there), Path 0.8 * 80 = 64 (Local's 70 in round 1, DisPFL's 80 in round 2)."""
    table = build_table([read_run(r) for r in runs])
    assert table.markdown() == EXPECTED
    assert table.targets == pytest.approx({"Dir(0.3)": 40.0, "Path(2)": 64.0})
    assert table.csv().splitlines()[3] == "DisPFL (d=0.5),50.00,80.00,3.00,10.00,1e+09,1,2"
    assert build_table([read_run(r) for r in runs], target_acc=45.0).rows[2][-2:] == ["2", "1"]
    assert build_table([read_run(r) for r in runs], target_acc=25.0).rows[1][-2] == "2"  # FedAvg: 20, then 30
    assert "80% of the best final accuracy" in caption(table, None) and "Dir(0.3): 40.0%" in caption(table, None)
    assert "45% (--target-acc)" in caption(table, 45.0)


def test_a_cell_of_several_runs_says_how_many_reached_the_target(tmp_path: Path):
    a = _write_run(tmp_path, "a", "dispfl", "dir:0.3", [0.30, 0.50], [1e6, 1e6], 1.0, 1e9)
    b = _write_run(tmp_path, "b", "dispfl", "dir:0.3", [0.10, 0.20], [1e6, 1e6], 1.0, 1e9)
    table = build_table([read_run(a), read_run(b)])  # target 0.8 * 50 = 40: run a in round 2, run b never
    assert table.rows[0][1:2] == ["35.00 (n=2)"] and table.rows[0][-1] == "2 (1 of 2 reached)"


def test_report_command_prints_the_table_and_writes_files_and_plots(runs: list[Path], tmp_path: Path, capsys):
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exc:
        main(["report", *map(str, runs), "--out", str(out)])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith(EXPECTED) and "Rounds to target" in printed[len(EXPECTED) :]
    assert (out / "table.md").read_text() == printed
    assert "paper MB = 4 B per active received parameter" in (out / "table.md").read_text()
    assert "80% of the best final accuracy among each partition's runs" in (out / "table.md").read_text()
    assert len((out / "runs.csv").read_text().splitlines()) == 5
    for name in ("accuracy.png", "communication.png", "accuracy_vs_communication.png"):
        assert (out / name).read_bytes()[:8] == PNG, name


def test_report_of_a_directory_that_is_no_run_is_one_line_exit_2(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tmp_path), "--out", str(tmp_path / "r")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edge-node: error:") and "config.json" in err and len(err.splitlines()) == 1
    with pytest.raises(CheckpointError):
        write_report([], tmp_path / "r")


def test_hamming_matrix_counts_differing_positions():
    a = {"x": torch.tensor([[1, 1], [0, 0]], dtype=torch.bool), "y": torch.tensor([1, 0], dtype=torch.bool)}
    b = {"x": torch.tensor([[1, 0], [0, 1]], dtype=torch.bool), "y": torch.tensor([1, 0], dtype=torch.bool)}
    np.testing.assert_allclose(hamming_matrix([a, b, a]), [[0, 2 / 6, 0], [2 / 6, 0, 2 / 6], [0, 2 / 6, 0]])


def _masks_run(root: Path, method: str = "dispfl", dense: bool = False) -> Path:
    """Six clients: three mostly class 0 with masks near mask A, three mostly class 1 with masks near B."""
    run = root / method
    run.mkdir()
    g = torch.Generator().manual_seed(0)
    base = [torch.rand(400, generator=g) < 0.5, torch.rand(400, generator=g) < 0.5]
    masks, counts = [], []
    for i in range(6):
        group = i // 3
        flip = torch.rand(400, generator=g) < 0.05
        m = torch.ones(400, dtype=torch.bool) if dense else base[group] ^ flip
        masks.append({"w": m.view(20, 20)})
        counts.append([50, 5 + i] if group == 0 else [4 + i, 60])
    weights = [{"w": torch.zeros(20, 20)} for _ in masks]
    save_checkpoint(run / "checkpoint.pt", round_index=3, config={"method": method}, weights=weights,
                    train_masks=masks, next_masks=masks)  # fmt: skip
    clients = {"clients": [{"train_class_counts": c} for c in counts]}
    (run / "clients.json").write_text(json.dumps(clients))
    return run


def test_masks_of_clients_with_similar_data_are_closer(tmp_path: Path):
    report = mask_report(_masks_run(tmp_path))
    assert report.pearson < -0.9 and report.spearman < -0.5
    assert report.hamming[0, 1] < report.hamming[0, 4]
    out = tmp_path / "out"
    files = write_mask_report(report, out)
    assert (out / "masks.png").read_bytes()[:8] == PNG
    assert len((out / "masks.csv").read_text().splitlines()) == 1 + 15  # one row per pair
    for name, matrix in (("masks_hamming.csv", report.hamming), ("masks_label_cosine.csv", report.cosine)):
        rows = list(csv.reader((out / name).read_text().splitlines()))
        assert rows[0] == ["client", "0", "1", "2", "3", "4", "5"], name
        assert [r[0] for r in rows[1:]] == ["0", "1", "2", "3", "4", "5"], name
        values = np.array([[float(v) for v in r[1:]] for r in rows[1:]])
        np.testing.assert_allclose(values, matrix, atol=1e-6)
        np.testing.assert_allclose(values, values.T, atol=1e-6)
    hamming = np.loadtxt(out / "masks_hamming.csv", delimiter=",", skiprows=1)[:, 1:]
    cosine = np.loadtxt(out / "masks_label_cosine.csv", delimiter=",", skiprows=1)[:, 1:]
    assert np.diag(hamming).tolist() == [0.0] * 6 and np.allclose(np.diag(cosine), 1.0)
    assert hamming[0, 1] < hamming[0, 4] and cosine[0, 1] > cosine[0, 4]  # clients 0, 1 share data and masks
    assert len(files) == 4


def test_report_masks_command_and_dense_runs(tmp_path: Path, capsys):
    run = _masks_run(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["report", "--masks", str(run)])
    assert exc.value.code == 0
    assert "Pearson" in capsys.readouterr().out and (run / "masks.png").is_file()
    with pytest.raises(SystemExit) as exc:
        main(["report", "--masks", str(_masks_run(tmp_path, "local", dense=True))])
    assert exc.value.code == 2
    assert "dense" in capsys.readouterr().err
