"""Simulations on tiny fake trees of the other data sets: Tiny-ImageNet (its own layout, 64x64, the paper's
ResNet18 variant) and CIFAR-100 (the authors' python batches, vgg11 with 100 classes)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_node.cli import main

RUN = ["simulate", "--clients", "2", "--neighbours", "1", "--rounds", "1", "--epochs", "1", "--batch-size", "8",
       "--samples-per-client", "8", "--no-progress", "--energy-backend", "estimate"]  # fmt: skip


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(args)
    return int(exc.value.code or 0)


def _tiny_imagenet(root: Path) -> Path:
    """train/<wnid>/images/*.JPEG and val/images + val/val_annotations.txt, 200 classes, one image each."""
    rng = np.random.default_rng(0)
    base = root / "tiny-imagenet-200"
    (base / "val" / "images").mkdir(parents=True)
    ann = []
    for i in range(200):
        wnid = f"n{i:08d}"
        (base / "train" / wnid / "images").mkdir(parents=True)
        for folder, name in ((base / "train" / wnid / "images", f"{wnid}_0.JPEG"), (base / "val" / "images",
                                                                                    f"val_{i}.JPEG")):  # fmt: skip
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(folder / name, format="JPEG")
        ann.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(ann) + "\n")
    return root


def test_tiny_imagenet_with_the_papers_resnet18(tmp_path: Path, capsys):
    data = _tiny_imagenet(tmp_path / "data")
    out = tmp_path / "run"
    common = [*RUN, "--dataset", "tiny-imagenet", "--data-dir", str(data), "--cache-dir", str(tmp_path / "cache")]
    assert run_cli([*common, "--model", "cnn", "--output", str(out)]) == 2
    assert "model cnn takes 32x32 images" in capsys.readouterr().err and not out.exists()
    # vgg11's classifier takes 512 features (a 1x1 map after five pools of 32x32): refused by a probe of the
    # built model on one image, before --fresh removes a previous run and before config.json is written
    previous = tmp_path / "previous"
    previous.mkdir()
    for name in ("config.json", "rounds.jsonl", "checkpoint.pt", "summary.json"):
        (previous / name).write_text(f"the previous run's {name}\n")
    before = {f.name: f.read_bytes() for f in previous.iterdir()}
    assert run_cli([*common, "--model", "vgg11", "--fresh", "--output", str(previous)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("edge-node: error: model vgg11 cannot take this data set's 64x64 images")
    assert "Traceback" not in err and "use resnet18" in err
    assert {f.name: f.read_bytes() for f in previous.iterdir()} == before
    assert run_cli([*common, "--model", "resnet18", "--output", str(out)]) == 0
    (record,) = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert len(record["nodes"]) == 2 and 0.0 <= record["acc_mean"] <= 1.0
    # 64x64: every convolution at 4x the positions of 32x32 (1,111,040,000 FLOPs with a 200-class head)
    assert record["forward_flops_dense"] == 4 * (1_111_040_000 - 2 * 512 * 200) + 2 * 512 * 200 == 4_443_545_600


def test_cifar100_with_vgg11(tmp_path: Path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "data" / "cifar-100-python"
    folder.mkdir(parents=True)
    for split, n in (("train", 200), ("test", 100)):
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"fine_labels": [int(v) for v in rng.integers(0, 100, n)],
                 b"coarse_labels": [int(v) for v in rng.integers(0, 20, n)]}  # fmt: skip
        (folder / split).write_bytes(pickle.dumps(batch, protocol=2))
    out = tmp_path / "run"
    args = [*RUN, "--dataset", "cifar100", "--data-dir", str(tmp_path / "data"), "--cache-dir", str(tmp_path / "c"),
            "--model", "vgg11", "--partition", "path:10", "--output", str(out)]  # fmt: skip
    assert run_cli(args) == 0
    (record,) = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    clients = json.loads((out / "clients.json").read_text())
    assert clients["num_classes"] == 100 and clients["partition_variant"] == "reference"
    assert all(sum(c > 0 for c in client["train_class_counts"]) <= 10 for client in clients["clients"])
    # one neighbour pulled: vgg11 with a 100-class head at density 0.5
    assert record["paper_comm_mb_mean"] == pytest.approx(0.5 * 4 * 9_277_284 / 1e6, rel=0.02)
