"""Clients trained together (edge_node.algorithm.batched, the simulation's ``--batch-clients``): each client's
model equals ``train_local``'s one-at-a-time model up to float rounding, whatever its number of batches; the
refusals; the grouping."""

from __future__ import annotations

import pytest
import torch

from edge_node.algorithm import init_masks, read_weights
from edge_node.algorithm.batched import groups_by_steps, train_local_batched
from edge_node.algorithm.dispfl import ClientState, DisPFLParams, train_local
from edge_node.errors import TrainingDiverged
from edge_node.models import build_model

SEED = 7
# Float rounding of a vmap'd (grouped) convolution and of the weighted mean loss against the plain step: 7.5e-09
# measured after 2-6 steps of lr 0.05 here (2 threads, torch 2.13 CPU), while those steps move weights by
# 0.015-0.043; another shuffle of the same data moves them by 5.8e-04 (the second test).
TOLERANCE = 1e-6


def _source(samples: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(samples, 3, 32, 32, generator=g), torch.randint(0, 10, (samples,), generator=g)

    def batches(epochs: int, generator: torch.Generator):
        for _ in range(epochs):
            order = torch.randperm(samples, generator=generator)
            for start in range(0, samples, 8):
                idx = order[start : start + 8]
                yield x[idx], y[idx]

    return batches


def _clients(sizes: list[int]):
    torch.set_num_threads(1)  # restored by conftest
    model = build_model("cnn", 10, seed=0)
    start = read_weights(model)
    states = []
    for k in range(len(sizes)):
        masks = init_masks(start, 0.5, torch.Generator().manual_seed(10 + k))
        weights = {n: w * masks[n] * (1.0 + 0.01 * k) for n, w in start.items()}  # each client its own start
        states.append(ClientState(weights, masks, dict(masks), 0.5))
    return model, states, [_source(n, 100 + k) for k, n in enumerate(sizes)]


@pytest.mark.parametrize("regrow", ["random", "gradient"])
def test_each_client_trains_as_it_would_alone(regrow):
    sizes = [20, 8, 13, 3]  # 3, 1, 2 and 1 batches an epoch, with last batches of 4, 5 and 3: padding everywhere
    params = DisPFLParams(epochs=2, batch_size=8, lr=0.05, clip_norm=1.0, micro_batch=0, regrow=regrow)
    model, states, sources = _clients(sizes)
    clients = [3, 0, 5, 1]
    together = train_local_batched(states, model, sources, 2, params, seed=SEED, clients=clients)
    for k, (state, source, client) in enumerate(zip(states, sources, clients, strict=True)):
        alone = train_local(state, model, source, 2, params, seed=SEED, client=client)
        got = together[k]
        assert (got.stats.steps, got.stats.samples) == (alone.stats.steps, alone.stats.samples)
        assert got.stats.samples == 2 * sizes[k]
        assert got.stats.mean_loss == pytest.approx(alone.stats.mean_loss, rel=1e-5)
        assert got.lr == alone.lr
        for name, w in alone.state.weights.items():
            assert (got.state.weights[name] - w).abs().max().item() <= TOLERANCE, (k, name)
            assert torch.count_nonzero(got.state.weights[name][~state.train_mask[name]]) == 0
            assert got.state.weights[name].untyped_storage().nbytes() == w.numel() * 4  # not a view of the group
        assert any(not torch.equal(got.state.weights[n], state.weights[n]) for n in state.weights)  # it trained
        if regrow == "gradient":
            assert got.gradients is not None and alone.gradients is not None
            for name, g in alone.gradients.items():
                assert (got.gradients[name] - g).abs().max().item() <= 1e-3, name
        else:
            assert got.gradients is None


def test_a_group_of_one_and_a_changed_step_both_show():
    params = DisPFLParams(epochs=1, batch_size=8, lr=0.05, clip_norm=1.0, micro_batch=0)
    model, states, sources = _clients([16, 16])
    alone = train_local(states[0], model, sources[0], 0, params, seed=SEED, client=0)
    single = train_local_batched(states[:1], model, sources[:1], 0, params, seed=SEED, clients=[0])[0]
    other_seed = train_local_batched(states[:1], model, sources[:1], 0, params, seed=SEED + 1, clients=[0])[0]
    diff = max((single.state.weights[n] - w).abs().max().item() for n, w in alone.state.weights.items())
    moved = max((other_seed.state.weights[n] - w).abs().max().item() for n, w in alone.state.weights.items())
    assert diff <= TOLERANCE < 100 * TOLERANCE < moved  # another shuffle is visible: the check can fail


def test_refusals():
    model, states, sources = _clients([8])
    with pytest.raises(ValueError, match="micro_batch 0"):
        train_local_batched(states, model, sources, 0, DisPFLParams(micro_batch=16), seed=0, clients=[0])
    with pytest.raises(ValueError, match="one state"):
        train_local_batched(states, model, sources, 0, DisPFLParams(micro_batch=0), seed=0, clients=[0, 1])
    nan_state = ClientState(
        {n: torch.full_like(w, float("nan")) for n, w in states[0].weights.items()},
        states[0].train_mask, states[0].next_mask, 0.5,
    )  # fmt: skip
    with pytest.raises(TrainingDiverged, match="client 4"):
        train_local_batched([nan_state], model, sources, 0, DisPFLParams(micro_batch=0, batch_size=8), seed=0,
                            clients=[4])  # fmt: skip


def test_groups_put_clients_of_equal_steps_together():
    assert groups_by_steps([3, 5, 5, 1, 3], 2) == [[1, 2], [0, 4], [3]]
    assert groups_by_steps([], 4) == []
    assert groups_by_steps([2, 2], 8) == [[0, 1]]
    with pytest.raises(ValueError):
        groups_by_steps([1], 0)
