"""The built-in demo set: deterministic, the right shape, balanced, and learnable but not trivial."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_node.data import DATASET_NAMES, load_dataset
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


def test_demo_is_learnable_but_not_by_colour_alone(demo) -> None:  # noqa: ANN001
    """A linear probe on per-channel mean colour beats chance, but far from perfectly: shapes matter."""
    def features(x: np.ndarray) -> torch.Tensor:
        f = torch.from_numpy(x).float().div(255)
        return torch.cat([f.mean(dim=(2, 3)), f.std(dim=(2, 3))], dim=1)

    xtr, xte = features(demo.train_x), features(demo.test_x)
    mu, sd = xtr.mean(0), xtr.std(0)
    xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    ytr, yte = torch.from_numpy(demo.train_y), torch.from_numpy(demo.test_y)
    torch.manual_seed(0)
    model = torch.nn.Linear(xtr.shape[1], 10)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=100)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xtr), ytr)
        loss.backward()
        return loss

    opt.step(closure)
    acc = (model(xte).argmax(1) == yte).float().mean().item()
    assert 0.2 < acc < 0.7, f"colour-statistics probe accuracy {acc:.3f}"


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(DataError, match="cifar10, cifar100, tiny-imagenet, demo"):
        load_dataset("mnist")
    assert DATASET_NAMES == ("cifar10", "cifar100", "tiny-imagenet", "demo")
