import math

import pytest
import torch

from edge_node.algorithm import learning_rate, prune_rate, update_masks
from edge_node.errors import ConfigError


def test_cosine_prune_schedule_and_lr_decay():
    assert prune_rate(0, 30) == pytest.approx(0.5)
    assert prune_rate(15, 30) == pytest.approx(0.25)
    assert prune_rate(30, 30) == pytest.approx(0.0)
    assert prune_rate(10, 30, alpha=0.4) == pytest.approx(0.2 * (1 + math.cos(math.pi / 3)))
    assert learning_rate(0) == pytest.approx(0.1)
    assert learning_rate(100) == pytest.approx(0.1 * 0.998**100)


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = {"a": torch.randn(20, 10, generator=g), "b": torch.randn(7, generator=g)}
    masks = {"a": torch.rand(20, 10, generator=g) < 0.4, "b": torch.ones(7, dtype=torch.bool)}
    w = {k: v * masks[k] for k, v in w.items()}
    return w, masks


@pytest.mark.parametrize("rule", ["random", "gradient"])
def test_counts_preserved_dense_stays_dense(rule):
    w, masks = _setup()
    grads = {k: torch.randn(v.shape) for k, v in w.items()}
    new = update_masks(w, masks, 0.3, rule, gradients=grads, generator=torch.Generator().manual_seed(3))
    assert int(new["a"].sum()) == int(masks["a"].sum())
    assert torch.equal(new["b"], masks["b"])
    assert not torch.equal(new["a"], masks["a"])


def test_prunes_smallest_magnitudes_and_regrows_largest_gradients():
    w = {"a": torch.tensor([0.1, -5.0, 0.2, 3.0, 0.0, 0.0])}
    mask = {"a": torch.tensor([1, 1, 1, 1, 0, 0], dtype=torch.bool)}
    grads = {"a": torch.tensor([9.0, 0.0, 0.0, 0.0, -4.0, 1.0])}
    # ceil(0.5 * 4) = 2 pruned: |0.1| and |0.2|; regrow 2 by |g| among {0, 2, 4, 5}: 0 (9) and 4 (4).
    new = update_masks(w, mask, 0.5, "gradient", gradients=grads)
    assert new["a"].tolist() == [True, True, False, True, True, False]


def test_random_regrowth_is_reproducible_and_rate_zero_changes_nothing():
    w, masks = _setup(1)
    a = update_masks(w, masks, 0.5, "random", generator=torch.Generator().manual_seed(5))
    b = update_masks(w, masks, 0.5, "random", generator=torch.Generator().manual_seed(5))
    assert torch.equal(a["a"], b["a"])
    same = update_masks(w, masks, 0.0, "random", generator=torch.Generator())
    assert torch.equal(same["a"], masks["a"])


def test_bad_arguments_are_refused():
    w, masks = _setup()
    with pytest.raises(ConfigError, match="regrow rule"):
        update_masks(w, masks, 0.2, "magnitude")
    with pytest.raises(ConfigError, match="gradients"):
        update_masks(w, masks, 0.2, "gradient")
    with pytest.raises(ConfigError, match="prune rate"):
        update_masks(w, masks, 1.5, "random", generator=torch.Generator())


def test_select_k_breaks_exact_ties_by_lower_index():
    from edge_node.algorithm.prune_regrow import select_k

    score = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.0, 3.0, 0.0])
    assert sorted(select_k(score, 3, largest=False).tolist()) == [0, 2, 4]  # four zeros tie: lowest three
    assert sorted(select_k(score, 3, largest=True).tolist()) == [1, 3, 5]
    assert sorted(select_k(score, 1, largest=True).tolist()) == [1]  # 3.0 at 1 and 5: the lower index
    g = torch.Generator().manual_seed(0)
    distinct = torch.randn(10_000, generator=g)
    for largest in (False, True):  # without ties it is exactly topk's set
        want = set(torch.topk(distinct, 777, largest=largest).indices.tolist())
        assert set(select_k(distinct, 777, largest=largest).tolist()) == want
    with pytest.raises(ValueError, match="k=0"):
        select_k(score, 0, largest=True)
    with pytest.raises(ValueError, match="k=8"):
        select_k(score, 8, largest=True)


def test_select_k_by_sort_picks_the_set_of_the_kth_value():
    """The GPU's way (a stable sort, run here on the CPU) and the CPU's (the k-th value, then ties by index)
    pick the same set, on scores full of ties, -0.0 beside 0.0, and the infinities masks fill in."""
    from edge_node.algorithm.prune_regrow import _select_by_kth, _select_by_sort, select_k

    g = torch.Generator().manual_seed(1)
    for trial in range(40):
        n = int(torch.randint(1, 3000, (1,), generator=g))
        score = torch.randint(-3, 4, (n,), generator=g).float() / 2  # few distinct values: ties everywhere
        score[torch.rand(n, generator=g) < 0.1] = float("inf")
        score[torch.rand(n, generator=g) < 0.1] = float("-inf")
        score[torch.rand(n, generator=g) < 0.2] = -0.0
        if trial % 4 == 0:
            score = torch.rand(n, generator=g)  # distinct values
        for largest in (False, True):
            for k in {1, n, int(torch.randint(1, n + 1, (1,), generator=g))}:
                want = set(_select_by_kth(score, k, largest=largest).tolist())
                got = _select_by_sort(score, k, largest=largest)
                assert len(got) == k and set(got.tolist()) == want, (trial, largest, k)
                assert set(select_k(score, k, largest=largest).tolist()) == want


def test_tied_zero_weights_prune_the_same_positions_every_time():
    """Regrown weights start at 0: pruning among those ties must not depend on the backend's topk."""
    w = {"a": torch.tensor([0.0, 0.0, 0.5, 0.0, 0.0, 2.0, 0.0, 0.0])}
    mask = {"a": torch.tensor([1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.bool)}
    grads = {"a": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])}  # the other regrowth scores tie at 0
    new = update_masks(w, mask, 0.5, "gradient", gradients=grads)
    # prune ceil(0.5 * 6) = 3 of the four zeros at 0, 1, 3, 4 -> 0, 1, 3;
    # regrow 3 among {0, 1, 3, 6, 7}: 6 (score 1), then the tied zeros 0 and 1
    assert new["a"].tolist() == [True, True, True, False, True, True, True, False]


def test_nan_weights_are_pruned_first_and_counts_hold():
    w = {"a": torch.tensor([float("nan"), 0.3, 0.2, 1.0, 0.0, 0.0])}
    mask = {"a": torch.tensor([1, 1, 1, 1, 0, 0], dtype=torch.bool)}
    grads = {"a": torch.tensor([0.0, 0.0, 0.0, 0.0, float("nan"), 1.0])}
    new = update_masks(w, mask, 0.25, "gradient", gradients=grads)  # prune 1: the NaN; regrow 1: position 5
    assert new["a"].tolist() == [False, True, True, True, False, True]


def test_drop_smallest_removes_exactly_k_active_positions_of_smallest_magnitude():
    from edge_node.algorithm.prune_regrow import drop_smallest

    weight = torch.tensor([[0.5, -0.1, 3.0], [0.05, 2.0, -0.2]])
    mask = torch.tensor([[True, True, True], [False, True, True]])  # 0.05 is inactive: never picked
    assert drop_smallest(weight, mask, 2).tolist() == [[True, False, True], [False, True, False]]
    assert torch.equal(drop_smallest(weight, mask, 0), mask) and drop_smallest(weight, mask, 0) is not mask
    assert int(drop_smallest(weight, mask, 5).sum()) == 0
