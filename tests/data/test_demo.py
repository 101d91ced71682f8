"""The built-in demo set: deterministic, the right shape, balanced, and learnable but not trivial."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_node.data import DATASET_NAMES, load_dataset, normalize_batch
from edge_node.errors import DataError


@pytest.fixture(scope="module")
def demo():  # noqa: ANN201 -- a Dataset
    return load_dataset("demo")


def test_demo_shapes_and_balance(demo) -> None:  # noqa: ANN001
    assert demo.name == "demo" and demo.num_classes == 10 and len(demo.class_names) == 10
    assert demo.train_x.shape == (6000, 3, 32, 32) and demo.train_x.dtype == np.uint8
    assert demo.test_x.shape == (1000, 3, 32, 32)
    assert np.bincount(demo.train_y).tolist() == [600] * 10
    assert np.bincount(demo.test_y).tolist() == [100] * 10
    assert all(0.2 < m < 0.8 for m in demo.mean) and all(0.1 < s < 0.5 for s in demo.std)


def test_demo_is_deterministic_and_ignores_data_dir(demo, tmp_path) -> None:  # noqa: ANN001
    again = load_dataset("demo", tmp_path / "ignored")
    assert np.array_equal(demo.train_x, again.train_x) and np.array_equal(demo.test_y, again.test_y)
    assert not (tmp_path / "ignored").exists()
    assert not np.array_equal(demo.train_x[:100], demo.test_x[:100])


def test_demo_is_learnable_by_a_small_cnn_but_not_solved_at_once(demo) -> None:  # noqa: ANN001
    """A 3-layer CNN after one pass over half the training set: far above chance (10%), yet not solved."""
    x = normalize_batch(torch.from_numpy(demo.train_x), demo.mean, demo.std)
    y = torch.from_numpy(demo.train_y)
    xt = normalize_batch(torch.from_numpy(demo.test_x), demo.mean, demo.std)
    yt = torch.from_numpy(demo.test_y)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        nn = torch.nn
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(32, 10),
        )  # fmt: skip
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for idx in torch.randperm(len(y))[: len(y) // 2].split(64):
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    assert 0.3 < acc < 0.98, f"test accuracy after one epoch: {acc:.3f}"


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(DataError, match="cifar10, cifar100, tiny-imagenet, demo"):
        load_dataset("mnist")
    assert DATASET_NAMES == ("cifar10", "cifar100", "tiny-imagenet", "demo")
