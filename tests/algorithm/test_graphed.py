"""The captured step of ``--cuda-graphs`` (edge_node.algorithm.graphed), checked on the CPU: the step function a
CUDA graph captures, run uncaptured from its static buffers, trains as ``train_masked``'s eager step does; only
full batches of the captured shape are replayed; a call the step was not captured for is refused. (Capture
itself needs CUDA: bench/graphs_check.py checks it on a GPU.)"""

from __future__ import annotations

import pytest
import torch

from edge_node.algorithm import SGDConfig, init_masks, load_weights, read_weights, train_masked
from edge_node.algorithm.dp import DPConfig
from edge_node.algorithm.graphed import GraphedStep
from edge_node.models import build_model
from tests.algorithm.steps import RecordingStep

BATCH = 8


def _batches(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in sizes]


def _setup(weight_decay=5e-4):
    torch.set_num_threads(1)  # restored by conftest
    model = build_model("cnn", 10, seed=0)
    start = read_weights(model)
    masks = init_masks(start, 0.5, torch.Generator().manual_seed(1))
    return model, start, masks, SGDConfig(lr=0.05, weight_decay=weight_decay, clip_norm=1.0, micro_batch=0)


def test_the_captured_step_trains_as_the_eager_one_and_only_full_batches_are_replayed():
    model, start, masks, config = _setup()
    batches = _batches([BATCH, BATCH, BATCH, 5])  # an epoch's last, smaller batch takes the eager step
    eager = train_masked(model, masks, batches, config)
    eager_weights = read_weights(model)
    load_weights(model, start)
    step = RecordingStep(model, (BATCH, 3, 32, 32), config)
    graphed = train_masked(model, masks, batches, config, graphs=step)
    assert step.replayed == [BATCH] * 3
    assert (graphed.steps, graphed.samples) == (eager.steps, eager.samples) == (4, 29)
    assert graphed.mean_loss == pytest.approx(eager.mean_loss, rel=1e-6)
    largest = max((w - eager_weights[k]).abs().max().item() for k, w in read_weights(model).items())
    assert largest <= 1e-6  # lr * g rounded once more per step; clipping (norm 1.0) bounds each step
    assert all(torch.count_nonzero(w[~masks[k]]) == 0 for k, w in read_weights(model).items())
    assert any(not torch.equal(w, start[k]) for k, w in read_weights(model).items())  # it did train


def test_the_learning_rate_and_masks_of_each_call_are_used():
    """Two calls with other lr and masks through one captured step: each call's own (a baked lr would differ)."""
    model, start, masks, config = _setup(weight_decay=0.0)
    other = init_masks(start, 0.3, torch.Generator().manual_seed(2))
    batches = _batches([BATCH] * 2, seed=3)
    expected = []
    for lr, m in ((0.05, masks), (0.2, other)):
        train_masked(model, m, batches, SGDConfig(lr=lr, weight_decay=0.0, clip_norm=1.0, micro_batch=0))
        expected.append(read_weights(model))
    load_weights(model, start)
    step = GraphedStep(model, (BATCH, 3, 32, 32), config, capture=False)
    for (lr, m), want in zip(((0.05, masks), (0.2, other)), expected, strict=True):
        train_masked(model, m, batches, SGDConfig(lr=lr, weight_decay=0.0, clip_norm=1.0, micro_batch=0), graphs=step)
        assert max((w - want[k]).abs().max().item() for k, w in read_weights(model).items()) <= 1e-6


def test_only_batches_of_the_captured_shape_dtype_and_device_fit():
    model, _, _, config = _setup()
    step = GraphedStep(model, (BATCH, 3, 32, 32), config, capture=False)
    x, y = _batches([BATCH])[0]
    assert step.fits(x, y) and step.fits(x.transpose(2, 3), y)  # a non-contiguous batch is copied in
    assert not step.fits(x[:5], y[:5]) and not step.fits(x[:, :, :16], y)
    assert not step.fits(x.double(), y) and not step.fits(x, y.int()) and not step.fits(x, y[:5])
    assert not step.fits(x.to("meta"), y)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (dict(dp=DPConfig(clip=1.0, noise_multiplier=1.0)), "DP-SGD"),
        (dict(clip_norm=2.0), "captured with clip_norm"),
        (dict(weight_decay=0.0), "captured with clip_norm"),
        (dict(micro_batch=4), "micro_batch=4"),
    ],
)
def test_a_call_the_step_was_not_captured_for_is_refused_before_training(change, needle):
    model, start, masks, config = _setup()
    step = GraphedStep(model, (BATCH, 3, 32, 32), config, capture=False)
    bad = SGDConfig(**{**vars(config), **change})
    with pytest.raises(ValueError, match=needle):
        train_masked(model, masks, _batches([BATCH]), bad, torch.Generator(), graphs=step)
    assert all(torch.equal(w, start[k]) for k, w in read_weights(model).items())  # nothing was touched


def test_proximal_another_model_or_replaced_parameters_are_refused():
    model, start, masks, config = _setup()
    step = GraphedStep(model, (BATCH, 3, 32, 32), config, capture=False)
    with pytest.raises(ValueError, match="proximal"):
        train_masked(model, masks, _batches([BATCH]), config, proximal=(start, 0.5), graphs=step)
    with pytest.raises(ValueError, match="another model"):
        train_masked(build_model("cnn", 10, seed=0), masks, _batches([BATCH]), config, graphs=step)
    first = next(iter(model.parameters()))
    first.data = first.data.clone()  # a new tensor: the graph would update the old one
    with pytest.raises(ValueError, match="replaced"):
        train_masked(model, masks, _batches([BATCH]), config, graphs=step)


def test_construction_refuses_what_cannot_be_captured():
    model, _, _, config = _setup()
    with pytest.raises(ValueError, match="CUDA device"):
        GraphedStep(model, (BATCH, 3, 32, 32), config)  # capture=True on the CPU
    with pytest.raises(ValueError, match="micro_batch=4"):
        GraphedStep(model, (BATCH, 3, 32, 32), SGDConfig(lr=0.1, micro_batch=4), capture=False)
    with pytest.raises(ValueError, match="DP-SGD"):
        GraphedStep(model, (BATCH, 3, 32, 32), SGDConfig(lr=0.1, dp=DPConfig(1.0, 1.0)), capture=False)
    GraphedStep(model, (BATCH, 3, 32, 32), SGDConfig(lr=0.1, micro_batch=BATCH), capture=False)  # never slices
