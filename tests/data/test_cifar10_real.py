"""The real CIFAR-10 image-folder tarball (../shared/datasets/cifar10-jpeg.tar.gz), decoded once per session."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from edge_node.data import load_dataset

pytestmark = pytest.mark.cifar


def test_real_cifar10_tarball(cifar10_tgz: Path, session_cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    ds = load_dataset("cifar10", cifar10_tgz, cache_dir=session_cache_dir)
    assert ds.train_x.shape == (50_000, 3, 32, 32) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (10_000, 3, 32, 32)
    assert ds.num_classes == 10
    assert ds.class_names == ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    assert np.bincount(ds.train_y).tolist() == [5000] * 10
    assert np.bincount(ds.test_y).tolist() == [1000] * 10
    # The published CIFAR-10 statistics; the JPEG copy differs a little.
    assert ds.mean == pytest.approx((0.4914, 0.4822, 0.4465), abs=0.01)
    assert ds.std == pytest.approx((0.2470, 0.2435, 0.2616), abs=0.01)
    caplog.set_level(logging.INFO, logger="edge_node.data")
    caplog.clear()  # the first load's records are captured too when another test left INFO logging on
    again = load_dataset("cifar10", cifar10_tgz, cache_dir=session_cache_dir)
    assert any("from cache" in r.getMessage() for r in caplog.records)
    assert not any("decoded" in r.getMessage() for r in caplog.records)
    assert np.array_equal(again.test_x, ds.test_x)
