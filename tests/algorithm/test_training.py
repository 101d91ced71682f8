import pytest
import torch

from edge_node.algorithm import SGDConfig, count_correct, init_masks, load_weights, read_weights, train_masked
from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.errors import ConfigError
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


def _reference_steps(model, masks, batches, lr, weight_decay, clip_norm):
    """The DisPFL authors' local step (my_model_trainer.py, train): torch's SGD with weight decay and no
    momentum, the gradient norm clipped over every parameter, then the weights multiplied by the mask."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0, weight_decay=weight_decay)
    model.train()
    for x, y in batches:
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.mul_(masks[name])


@pytest.mark.parametrize("input_scale", [1.0, 50.0])  # 50: every step is clipped
def test_masked_sgd_takes_the_reference_codes_steps(input_scale):
    model = build_model("cnn", seed=3)
    masks = init_masks(read_weights(model), 0.5, torch.Generator().manual_seed(3))
    start = {n: w * masks[n] for n, w in read_weights(model).items()}  # a model arrives on its mask
    batches = [(x * input_scale, y) for x, y in _toy_batches(n_batches=4, seed=3)]
    reference = build_model("cnn", seed=3)
    load_weights(reference, start)
    _reference_steps(reference, masks, batches, lr=0.1, weight_decay=5e-4, clip_norm=10.0)
    load_weights(model, start)
    train_masked(model, masks, batches, SGDConfig(lr=0.1, weight_decay=5e-4, clip_norm=10.0))
    ours, theirs = read_weights(model), read_weights(reference)
    moved = max(float((theirs[n] - start[n]).abs().max()) for n in start)
    assert moved > 1e-3  # the steps did something
    for name in ours:
        assert torch.allclose(ours[name], theirs[name], rtol=0, atol=1e-6 * max(moved, 1.0)), name


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


def test_micro_batches_take_the_same_step_as_the_whole_batch():
    """Slices of 7 and 32 (uneven last slice) give the whole batch's loss and weights, up to float rounding."""
    toy = _toy_batches(6)
    batches = [(torch.cat([toy[i][0], toy[i + 1][0]]), torch.cat([toy[i][1], toy[i + 1][1]])) for i in (0, 2, 4)]
    results = {}
    for micro in (0, 7, 32, 64):
        model = build_model("cnn", seed=0)
        masks = init_masks(read_weights(model), 0.5, torch.Generator().manual_seed(0))
        stats = train_masked(model, masks, batches, SGDConfig(lr=0.05, micro_batch=micro))
        results[micro] = (stats, read_weights(model))
    whole_stats, whole = results[0]
    initial = read_weights(build_model("cnn", seed=0))
    assert max(float((whole[n] - initial[n]).abs().max()) for n in whole) > 1e-3  # the steps moved the weights
    assert whole_stats.steps == 3 and whole_stats.samples == 3 * 64
    assert torch.equal(torch.cat([w.flatten() for w in results[64][1].values()]),
                       torch.cat([w.flatten() for w in whole.values()]))  # fmt: skip  # slice >= batch: the same code
    for micro in (7, 32):
        stats, weights = results[micro]
        assert (stats.steps, stats.samples) == (whole_stats.steps, whole_stats.samples)
        assert abs(stats.mean_loss - whole_stats.mean_loss) < 1e-5
        diff = max(float((weights[n] - whole[n]).abs().max()) for n in whole)
        assert diff < 1e-5, (micro, diff)


def test_micro_batch_must_be_a_count():
    assert DisPFLParams(micro_batch=32).sgd(0).micro_batch == 32
    with pytest.raises(ConfigError, match="micro_batch=-1 must be an integer >= 0"):
        DisPFLParams(micro_batch=-1)


def test_a_proximal_term_pulls_the_weights_towards_its_anchor_and_lambda_zero_changes_nothing():
    """Ditto's personal step: ``lam * (w - anchor)`` added to each gradient; a larger ``lam`` ends closer."""
    batches = _toy_batches(10)
    anchor = read_weights(build_model("cnn", seed=1))
    dense = {n: torch.ones_like(w, dtype=torch.bool) for n, w in anchor.items()}

    def trained(proximal) -> dict[str, torch.Tensor]:
        model = build_model("cnn", seed=0)
        train_masked(model, dense, batches, SGDConfig(lr=0.05), proximal=proximal)
        return read_weights(model)

    def distance(weights: dict[str, torch.Tensor]) -> float:
        return float(sum(torch.linalg.vector_norm(w - anchor[n]) ** 2 for n, w in weights.items()) ** 0.5)

    plain, zero, pulled = trained(None), trained((anchor, 0.0)), trained((anchor, 5.0))
    assert all(torch.equal(plain[n], zero[n]) for n in plain)
    assert distance(pulled) < 0.5 * distance(plain)


def test_a_batchnorm_layer_whose_parameters_are_frozen_keeps_its_statistics_and_the_rest_train_theirs():
    from edge_node.algorithm.frozen import freeze

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.Conv2d(4, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3),
    )  # fmt: skip
    freeze(model, ("3.*", "4.*", "6.*"))  # the first conv and its BatchNorm are frozen
    start = {k: v.clone() for k, v in model.state_dict().items()}
    masks = {n: torch.ones_like(p, dtype=torch.bool) for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 3, 8, 8, generator=g) * 3 + 1, torch.randint(0, 3, (8,), generator=g)) for _ in range(3)]
    train_masked(model, masks, batches, DisPFLParams(micro_batch=0).sgd(0))
    after = model.state_dict()
    for name in ("1.running_mean", "1.running_var", "1.num_batches_tracked", "0.weight", "1.weight"):
        assert torch.equal(after[name], start[name]), name  # frozen whole: statistics as started
    for name in ("4.running_mean", "4.running_var", "4.weight"):
        assert not torch.equal(after[name], start[name]), name  # a trainable BatchNorm learns its statistics
    assert int(after["4.num_batches_tracked"]) == 3
