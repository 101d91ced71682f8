"""Fixtures for the data tests: writers of small data sets in the authors' formats, and a session cache."""

from __future__ import annotations

import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _image(rng: np.random.Generator, size: int = 32) -> np.ndarray:
    return rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)


@pytest.fixture(scope="session")
def session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache folder for the whole session, so the real CIFAR-10 tarball is decoded only once."""
    return tmp_path_factory.mktemp("edge-node-cache")


@pytest.fixture
def write_cifar10_batches() -> Callable[..., dict[str, np.ndarray]]:
    """Write CIFAR-10 python batches as the authors do (dicts pickled with protocol 2) into a folder."""

    def write(folder: Path, per_batch: int = 20, test_n: int = 30, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        folder.mkdir(parents=True, exist_ok=True)
        xs, ys = [], []
        for i in range(1, 6):
            data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
            labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
            batch = {b"batch_label": b"training batch %d of 5" % i, b"labels": labels, b"data": data,
                     b"filenames": [b"img_%d.png" % j for j in range(per_batch)]}  # fmt: skip
            (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch, protocol=2))
            xs.append(data)
            ys += labels
        test_data = rng.integers(0, 256, size=(test_n, 3072), dtype=np.uint8)
        test_labels = [int(v) for v in rng.integers(0, 10, size=test_n)]
        test = {b"batch_label": b"testing batch 1 of 1", b"labels": test_labels, b"data": test_data}
        (folder / "test_batch").write_bytes(pickle.dumps(test, protocol=2))
        meta = {b"label_names": [n.encode() for n in CIFAR10_NAMES], b"num_vis": 3072}
        (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
        return {"train_data": np.concatenate(xs), "train_y": np.array(ys), "test_data": test_data,
                "test_y": np.array(test_labels)}  # fmt: skip

    return write


@pytest.fixture
def write_image_tree() -> Callable[..., dict[str, list[tuple[str, np.ndarray]]]]:
    """Write ``train/<class>/*`` and ``test/<class>/*`` with PNG (lossless) and JPEG files."""

    def write(
        root: Path, classes: list[str] | None = None, n_train: int = 3, n_test: int = 2, size: int = 32, seed: int = 0
    ) -> dict[str, list[tuple[str, np.ndarray]]]:
        rng = np.random.default_rng(seed)
        classes = CIFAR10_NAMES if classes is None else classes
        written: dict[str, list[tuple[str, np.ndarray]]] = {"train": [], "test": []}
        for split, n in (("train", n_train), ("test", n_test)):
            for cls in classes:
                folder = root / split / cls
                folder.mkdir(parents=True, exist_ok=True)
                for j in range(n):
                    img = _image(rng, size)
                    fmt = "png" if j % 2 == 0 else "jpeg"
                    path = folder / f"{j:04d}.{'png' if fmt == 'png' else 'jpg'}"
                    Image.fromarray(img).save(path, format=fmt.upper())
                    written[split].append((cls, img if fmt == "png" else np.asarray(Image.open(path).convert("RGB"))))
        return written

    return write


@pytest.fixture
def make_tarball() -> Callable[[Path, Path], Path]:
    """Pack a folder's contents (its children at the archive's top level) into a .tar.gz."""

    def make(src: Path, dest: Path) -> Path:
        with tarfile.open(dest, "w:gz") as tar:
            for child in sorted(src.iterdir()):
                tar.add(child, arcname=child.name)
        return dest

    return make
