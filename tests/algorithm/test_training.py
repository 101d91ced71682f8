import torch

from edge_node.algorithm import SGDConfig, count_correct, init_masks, load_weights, read_weights, train_masked
from edge_node.models import build_model


def _toy_batches(n_batches=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        y = torch.randint(0, 10, (32,), generator=g)
        x = torch.randn(32, 3, 32, 32, generator=g) * 0.1
        for i, label in enumerate(y.tolist()):
            x[i, :, 3 * label : 3 * label + 3, :] += 2.0  # a learnable, class-dependent stripe
        out.append((x, y))
    return out


def test_inactive_weights_stay_zero_and_training_learns():
    model = build_model("cnn", seed=0)
    masks = init_masks(read_weights(model), 0.5, torch.Generator().manual_seed(0))
    batches = _toy_batches()
    before, _ = count_correct(model, batches)
    stats = train_masked(model, masks, batches * 3, SGDConfig(lr=0.05))
    after, total = count_correct(model, batches)
    weights = read_weights(model)
    assert all(torch.count_nonzero(weights[n][~m]) == 0 for n, m in masks.items())
    assert stats.steps == 90 and stats.samples == 90 * 32
    assert after > before and after / total > 0.5


def test_gradient_norm_clipping_bounds_a_step():
    model = build_model("cnn", seed=0)
    dense = {n: torch.ones_like(p, dtype=torch.bool) for n, p in model.named_parameters()}
    start = read_weights(model)
    x = torch.randn(8, 3, 32, 32) * 100.0  # huge inputs -> huge gradients
    y = torch.zeros(8, dtype=torch.long)
    train_masked(model, dense, [(x, y)], SGDConfig(lr=1.0, weight_decay=0.0, clip_norm=1.0))
    step = torch.sqrt(sum(((read_weights(model)[n] - start[n]) ** 2).sum() for n in start))
    assert 0 < float(step) <= 1.0 + 1e-4


def test_load_weights_copies_in_place():
    model = build_model("cnn", seed=0)
    ptr = model.fc1.weight.data_ptr()
    w = {n: torch.full_like(p, 0.5) for n, p in model.named_parameters()}
    load_weights(model, w)
    assert model.fc1.weight.data_ptr() == ptr and float(model.fc1.weight.detach()[0, 0]) == 0.5


def test_all_finite_spots_nan_and_inf_anywhere():
    from edge_node.algorithm import all_finite

    ok = {"a": torch.ones(3), "b": torch.zeros(2, 2)}
    assert all_finite(ok)
    assert not all_finite({**ok, "b": torch.tensor([[0.0, float("nan")], [0.0, 0.0]])})
    assert not all_finite({**ok, "a": torch.tensor([1.0, float("-inf"), 0.0])})
