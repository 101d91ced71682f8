"""Data factories: any labelled samples by ``package.module:function``, partitioned and batched like built-ins."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_node.data import client_slice, load_dataset
from edge_node.data.batches import ClientData, ImagePool
from edge_node.errors import DataError

P = "tests.plugin_factories"


def test_feature_rows_become_a_float_dataset_with_classes_from_the_labels():
    ds = load_dataset(f"{P}:blobs")
    assert (ds.train_x.shape, ds.test_x.shape) == ((240, 12), (60, 12))
    assert ds.train_x.dtype == np.float32 and not ds.is_image and ds.input_shape == (12,)
    assert ds.num_classes == 3 and ds.mean == () and ds.std == ()


def test_feature_batches_are_the_samples_as_given_no_augmentation():
    ds = load_dataset(f"{P}:blobs")
    data = ClientData.from_indices(ImagePool.from_dataset(ds), np.arange(240), np.arange(60))
    seen = []
    for x, y in data.train_batches(1, torch.Generator().manual_seed(0), 64):
        rows = torch.as_tensor(ds.train_x)
        matches = (rows.unsqueeze(0) == x.unsqueeze(1)).all(-1)  # each batch row is one training row, unchanged
        assert matches.any(1).all()
        seen += matches.float().argmax(1).tolist()
        assert torch.equal(y, torch.as_tensor(ds.train_y)[matches.float().argmax(1)])
    assert sorted(seen) == list(range(240))  # one epoch: every sample once
    (x, _), *_ = list(data.eval_batches(1000))
    assert torch.equal(x, torch.as_tensor(ds.test_x))


def test_uint8_rgb_samples_are_images_and_get_the_image_recipe():
    ds = load_dataset(f"{P}:rgb_images")
    assert ds.is_image and ds.input_shape == (3, 32, 32) and len(ds.mean) == 3
    data = ClientData.from_indices(ImagePool.from_dataset(ds), np.arange(16), np.arange(4))
    x, _ = next(data.train_batches(1, torch.Generator().manual_seed(0), 16))
    assert x.dtype == torch.float32 and x.shape == (16, 3, 32, 32)  # normalised, cropped and flipped


@pytest.mark.parametrize("partition", ["dir:0.3", "path:2", "dir-balanced:0.5", "path-balanced:2"])
def test_the_partitioners_split_a_factorys_data(partition):
    ds = load_dataset(f"{P}:blobs")
    parts = [client_slice(ds.train_y, ds.test_y, ds.num_classes, partition, 4, i, 0) for i in range(4)]
    assert all(len(train) > 0 and len(test) > 0 for train, test in parts)
    if partition.startswith("path"):  # two classes per client
        assert all(len(np.unique(ds.train_y[train])) <= 2 for train, _ in parts)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"{P}:ragged", "train sample 1 has shape (5,), sample 0 (4,)"),
        (f"{P}:text_labels", "train label 0 is 'cat', not a number or a 1-D vector"),
        (f"{P}:one_split", "must return (train, test), got a list"),
        (f"{P}:data_raises", "raised OSError: sensor log not found"),
        (f"{P}:nothing_here", "has no attribute 'nothing_here'"),
        ("no_such_package.data:rows", "no module 'no_such_package'"),
    ],
)
def test_a_broken_data_factory_is_one_line(name, expected):
    with pytest.raises(DataError) as exc:
        load_dataset(name)
    assert expected in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_a_factory_without_a_split_is_split_by_content_and_refused_when_one_side_is_empty(monkeypatch):
    from edge_node.data.content_split import is_test_sample
    from edge_node.data.factory import load_factory_dataset
    from tests import plugin_factories

    monkeypatch.setitem(plugin_factories.GROWING, "rows", 60)
    ds = load_factory_dataset("tests.plugin_factories:growing_blobs", test_fraction=0.25)
    assert len(ds.train_y) + len(ds.test_y) == 60 and all(is_test_sample(x.tobytes(), 0.25) for x in ds.test_x)
    assert not any(is_test_sample(x.tobytes(), 0.25) for x in ds.train_x)
    monkeypatch.setitem(plugin_factories.GROWING, "rows", 1)
    with pytest.raises(DataError, match=r"all 1 samples fell on the .* side of the content split"):
        load_factory_dataset("tests.plugin_factories:growing_blobs")
