"""BatchNorm under DisPFL (edge_node.algorithm.norm_stats): FedBN's ``local`` running statistics per client."""

import pytest
import torch

from edge_node.algorithm import read_weights
from edge_node.algorithm.dispfl import DisPFLParams, RoundHooks, client_round, published, start, train_local
from edge_node.algorithm.norm_stats import (
    batch_normalised,
    has_running_stats,
    load_buffers,
    read_buffers,
    trainable,
)
from edge_node.models import build_checked_model, build_model
from tests.plugin_factories import TinyBNConv

SHAPE = (3, 8, 8)


def _batches(offset, last=1):
    """Toy images of mean ``offset``, 2 batches of 8 then one of ``last`` samples per epoch."""

    def source(epochs, generator):
        for _ in range(epochs):
            for size in (8, 8, last):
                x = torch.randn(size, *SHAPE, generator=generator) + offset
                yield x, torch.randint(0, 3, (size,), generator=generator)

    return source


def _model():
    return build_checked_model("tests.plugin_factories:bn_conv", 3, SHAPE, seed=0)


def test_only_batchnorm_models_have_statistics_and_fitted_params():
    bn, plain = _model(), build_model("cnn", 10)
    assert batch_normalised(bn) and has_running_stats(bn)
    assert not batch_normalised(plain) and not has_running_stats(plain) and read_buffers(plain) == {}
    params = DisPFLParams(micro_batch=16)
    assert params.fitted(bn).micro_batch == 0  # statistics of the whole batch, never of slices
    assert params.fitted(plain) is params  # any other model: bit for bit as before


def test_a_batch_of_one_sample_is_dropped():
    batches = [(torch.zeros(n, 2), torch.zeros(n)) for n in (4, 1, 2)]
    assert [int(y.shape[0]) for _, y in trainable(batches)] == [4, 2]


def test_empty_buffers_reset_the_shared_model_to_new_statistics():
    model = _model()
    model.train()(torch.randn(4, *SHAPE) + 3)
    assert int(model.norm.num_batches_tracked) == 1
    load_buffers(model, {})
    assert torch.equal(model.norm.running_mean, torch.zeros(8)) and int(model.norm.num_batches_tracked) == 0


def test_each_client_trains_and_evaluates_its_own_statistics():
    """Two clients of different data through one shared model: own buffers, kept, loaded for evaluation."""
    model = _model()
    init = read_weights(model)
    params = DisPFLParams(epochs=2, batch_size=8, lr=0.05, regrow="gradient")
    states = [start(init, 0.8, seed=1, client=i) for i in range(2)]
    seen = []

    def hooks(i):
        def evaluate(m):
            seen.append((i, m.norm.running_mean.clone()))
            return 0.5

        return RoundHooks(_batches(offset=3.0 * i), evaluate)

    for t in range(2):
        offers = [[("c1", *published(states[1]))], [("c0", *published(states[0]))]]
        states = [
            client_round(states[i], offers[i], model, t, params, seed=1, client=i, hooks=hooks(i)).state
            for i in range(2)
        ]
    a, b = (s.buffers for s in states)
    assert set(a) == {"norm.running_mean", "norm.running_var", "norm.num_batches_tracked"}
    assert int(a["norm.num_batches_tracked"]) == 8  # 2 rounds x 2 epochs x 2 batches: the batches of one dropped
    assert not torch.allclose(a["norm.running_mean"], b["norm.running_mean"])  # never averaged
    # round 1: each client's evaluation before training saw its own statistics of round 0, not the other's
    (_, before_a), (_, before_b) = seen[4], seen[6]
    assert not torch.allclose(before_a, before_b)
    # and the evaluation after training saw what the client keeps
    assert torch.equal(seen[-1][1], b["norm.running_mean"])


def test_training_from_the_same_state_is_reproducible_and_unchanged_in_place():
    model = TinyBNConv(3, 3)
    state = start(read_weights(model), 1.0, seed=0, client=0)
    params = DisPFLParams(epochs=1, batch_size=8, lr=0.05)
    one = train_local(state, model, _batches(1.0), 0, params, seed=0, client=0)
    two = train_local(one.state, model, _batches(1.0), 1, params, seed=0, client=0)
    again = train_local(one.state, model, _batches(1.0), 1, params, seed=0, client=0)
    assert state.buffers == {}
    assert int(one.state.buffers["norm.num_batches_tracked"]) == 2
    assert all(torch.equal(two.state.buffers[k], again.state.buffers[k]) for k in two.state.buffers)
    assert one.stats.samples == 16  # the last batch of one sample was not trained on


@pytest.mark.parametrize("last", [1, 3])
def test_the_last_batch_is_trained_unless_it_is_one_sample(last):
    model = _model()
    state = start(read_weights(model), 1.0, seed=0, client=0)
    done = train_local(state, model, _batches(0.0, last), 0, DisPFLParams(epochs=1, batch_size=8), seed=0, client=0)
    assert done.stats.samples == 16 + (last if last > 1 else 0)


@pytest.mark.parametrize("policy", ["local", "average"])
def test_average_evaluates_and_trains_on_the_mean_of_the_round_start_statistics(policy):
    """Under average a client aggregates its running statistics with the peers' (their mean, the largest count)."""
    model = _model()
    init = read_weights(model)
    params = DisPFLParams(epochs=1, batch_size=8, lr=0.05, norm_stats=policy)
    states = [start(init, 0.8, seed=1, client=i) for i in range(2)]
    seen = {}

    def hooks(i, t):
        def evaluate(m):
            seen.setdefault((t, i), read_buffers(m))
            return 0.5

        return RoundHooks(_batches(offset=3.0 * i), evaluate)

    for t in range(2):
        offers = [[("c1", *published(states[1]))], [("c0", *published(states[0]))]]
        buffers = [{"c1": states[1].buffers}, {"c0": states[0].buffers}]
        states = [
            client_round(states[i], offers[i], model, t, params, seed=1, client=i, hooks=hooks(i, t),
                         peer_buffers=buffers[i]).state
            for i in range(2)
        ]  # fmt: skip
        if t == 0:
            round_start = [s.buffers for s in states]
    a, b = seen[1, 0], seen[1, 1]  # what each client was evaluated with in round 1, before training
    if policy == "local":
        assert all(torch.equal(a[k], round_start[0][k]) for k in a)
        assert not torch.equal(a["norm.running_mean"], b["norm.running_mean"])
        return
    for name in ("norm.running_mean", "norm.running_var"):
        mean = (round_start[0][name] + round_start[1][name]) / 2
        assert torch.equal(a[name], mean) and torch.equal(b[name], mean)
    assert int(a["norm.num_batches_tracked"]) == int(b["norm.num_batches_tracked"]) == 2
    assert not torch.equal(states[0].buffers["norm.running_mean"], states[1].buffers["norm.running_mean"])  # trained
