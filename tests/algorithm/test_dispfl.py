"""One client's round (edge_node.algorithm.dispfl): the steps the simulation and the daemon share."""

import math
import threading
from contextlib import contextmanager

import pytest
import torch

from edge_node.algorithm import read_weights
from edge_node.algorithm.dispfl import (
    ClientState,
    DisPFLParams,
    RoundHooks,
    aggregate_peers,
    client_round,
    published,
    retier,
    start,
    train_local,
    update_mask,
)
from edge_node.errors import ConfigError, TrainingDiverged
from edge_node.models import build_model


def _batches(epochs, generator, n=96, batch=32):
    """Toy local data: a class-dependent stripe; shuffled from the round's generator."""
    g = torch.Generator().manual_seed(7)
    y = torch.randint(0, 10, (n,), generator=g)
    x = torch.randn(n, 3, 32, 32, generator=g) * 0.1
    for i, label in enumerate(y.tolist()):
        x[i, :, 3 * label : 3 * label + 3, :] += 2.0
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for s in range(0, n, batch):
            yield x[order[s : s + batch]], y[order[s : s + batch]]


def _nnz(masks):
    return {k: int(v.sum()) for k, v in masks.items()}


@pytest.fixture(scope="module")
def init():
    return read_weights(build_model("cnn", seed=3))


def test_start_shares_weights_but_not_masks(init):
    a = start(init, 0.5, seed=1, client=0)
    b = start(init, 0.5, seed=1, client=1)
    again = start(init, 0.5, seed=1, client=0)
    assert all(torch.equal(a.train_mask[k], again.train_mask[k]) for k in init)  # a function of (seed, client)
    assert any(not torch.equal(a.train_mask[k], b.train_mask[k]) for k in init)  # own positions
    assert _nnz(a.train_mask) == _nnz(b.train_mask)  # same ERK counts at the same density
    for state in (a, b):
        assert all(torch.equal(state.weights[k], init[k] * state.train_mask[k]) for k in init)
        assert state.next_mask == state.train_mask
        assert state.mask_density == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ConfigError, match="density=1.5"):
        start(init, 1.5, seed=1, client=0)


def test_aggregate_peers_of_other_densities_lands_on_next_mask(init):
    me = start(init, 0.4, seed=0, client=0)
    sparse = start(init, 0.2, seed=0, client=1)
    dense = start(init, 1.0, seed=0, client=2)
    out = aggregate_peers(me, [published(sparse), published(dense)])
    assert out.train_mask is me.next_mask and out.next_mask is me.next_mask
    for k in init:
        assert torch.count_nonzero(out.weights[k][~me.next_mask[k]]) == 0
        # Everyone starts from the same weights, so any holder's mean is the initial weight.
        assert torch.allclose(out.weights[k], init[k] * me.next_mask[k])
    alone = aggregate_peers(me, [])
    assert all(torch.equal(alone.weights[k], me.weights[k]) for k in init)
    assert all(torch.equal(me.weights[k], init[k] * me.train_mask[k]) for k in init)  # input untouched


def test_train_then_update_keeps_counts_and_is_reproducible(init):
    params = DisPFLParams(epochs=2, batch_size=32, lr=0.05, planned_rounds=10, regrow="random")
    model = build_model("cnn", seed=3)
    state = start(init, 0.5, seed=0, client=4)
    first = train_local(state, model, _batches, 0, params, seed=0, client=4)
    second = train_local(state, model, _batches, 0, params, seed=0, client=4)
    assert first.stats.steps == 6 and math.isfinite(first.stats.mean_loss)
    assert all(torch.equal(first.state.weights[k], second.state.weights[k]) for k in init)
    assert first.lr == pytest.approx(0.05) and first.gradients is None
    for k in init:  # trained on the training mask only; the input state is untouched
        assert torch.count_nonzero(first.state.weights[k][~state.train_mask[k]]) == 0
        assert torch.equal(state.weights[k], init[k] * state.train_mask[k])
    updated = update_mask(first.state, 0, params, seed=0, client=4)
    assert _nnz(updated.next_mask) == _nnz(state.train_mask)
    assert updated.train_mask is first.state.train_mask
    moved = sum(int((updated.next_mask[k] != updated.train_mask[k]).sum()) for k in init)
    assert moved > 0  # prune rate 0.25 at round 0
    again = update_mask(first.state, 0, params, seed=0, client=4)
    assert all(torch.equal(updated.next_mask[k], again.next_mask[k]) for k in init)


def test_gradient_regrowth_takes_one_more_batch(init):
    params = DisPFLParams(epochs=1, batch_size=32, lr=0.05, planned_rounds=10, regrow="gradient")
    model = build_model("cnn", seed=3)
    trained = train_local(start(init, 0.5, seed=0, client=0), model, _batches, 2, params, seed=0, client=0)
    assert trained.gradients is not None and set(trained.gradients) == set(init)
    assert trained.lr == pytest.approx(0.05 * 0.998**2)
    updated = update_mask(trained.state, 2, params, seed=0, client=0, gradients=trained.gradients)
    assert _nnz(updated.next_mask) == _nnz(trained.state.train_mask)


def test_divergence_raises_and_leaves_the_state(init):
    params = DisPFLParams(epochs=1, batch_size=32, lr=1e20, planned_rounds=10)
    state = start(init, 0.5, seed=0, client=0)
    with pytest.raises(TrainingDiverged, match=r"training diverged in round 4: client 0 has loss"):
        train_local(state, build_model("cnn", seed=3), _batches, 3, params, seed=0, client=0)
    assert all(torch.equal(state.weights[k], init[k] * state.train_mask[k]) for k in init)


@pytest.mark.parametrize(
    ("field", "value"),
    [("epochs", 0), ("lr", float("nan")), ("regrow", "magic"), ("prune_alpha", 2.0), ("weight_decay", -1.0)],
)
def test_params_are_checked_once(field, value):
    with pytest.raises(ConfigError, match=field):
        DisPFLParams(**{field: value})


def test_state_is_a_plain_record(init):
    state = start(init, 0.5, seed=0, client=0)
    assert isinstance(state, ClientState) and state.density == 0.5
    weights, mask = published(state)
    assert weights is state.weights and mask is state.train_mask


def _hooks(log, **more):
    """Hooks that record the order in which the round calls them."""

    @contextmanager
    def phase(name):
        log.append(f"enter {name}")
        yield
        log.append(f"exit {name}")

    def evaluate(model):
        log.append("evaluate")
        return 0.5

    def batches(epochs, generator):
        log.append("batches")
        return _batches(epochs, generator)

    return RoundHooks(batches, evaluate, phase, **more)


def test_client_round_is_the_steps_in_their_order(init):
    """The one round both drivers call: screen, aggregate, evaluate, train, evaluate, update the mask; the
    result equals the steps composed by hand, bitwise, and the hooks are called in that order."""
    params = DisPFLParams(epochs=1, batch_size=32, lr=0.05, planned_rounds=10, regrow="gradient")
    me, peer = start(init, 0.5, seed=0, client=0), start(init, 0.3, seed=0, client=1)
    log: list[str] = []
    hooks = _hooks(log, screened=lambda accepted, refused: log.append(f"screened {accepted} {refused}"))
    done = client_round(me, [("p", *published(peer))], build_model("cnn", seed=3), 2, params, seed=0, client=0,
                        hooks=hooks)  # fmt: skip
    assert log[:3] == ["enter aggregate", "screened ['p'] {}", "exit aggregate"]
    assert log[3:5] == ["enter train", "evaluate"] and log[-2:] == ["evaluate", "exit train"]
    assert done.accepted == ["p"] and done.refused == {} and done.acc_before == done.acc_after == 0.5
    aggregated = aggregate_peers(me, [published(peer)])
    trained = train_local(aggregated, build_model("cnn", seed=3), _batches, 2, params, seed=0, client=0)
    by_hand = update_mask(trained.state, 2, params, seed=0, client=0, gradients=trained.gradients)
    for k in init:
        assert torch.equal(done.state.weights[k], by_hand.weights[k])
        assert torch.equal(done.state.train_mask[k], by_hand.train_mask[k])
        assert torch.equal(done.state.next_mask[k], by_hand.next_mask[k])


def test_client_round_screens_out_a_hostile_model_and_keeps_what_the_hook_keeps(init):
    params = DisPFLParams(epochs=1, batch_size=32, lr=0.05, planned_rounds=10)
    me, peer = start(init, 0.5, seed=0, client=0), start(init, 0.5, seed=0, client=1)
    weights, mask = published(peer)
    hostile = {k: w * 1e6 for k, w in weights.items()}
    offers = [("good", weights, mask), ("bad", hostile, mask)]
    zeroed = []

    def keep(trained: ClientState) -> ClientState:
        zeroed.append(True)
        return ClientState({k: torch.zeros_like(w) for k, w in trained.weights.items()}, trained.train_mask,
                           trained.next_mask, trained.density)  # fmt: skip

    done = client_round(me, offers, build_model("cnn", seed=3), 0, params, seed=0, client=0,
                        hooks=_hooks([], keep=keep))  # fmt: skip
    assert done.accepted == ["good"] and set(done.refused) == {"bad"}
    assert zeroed == [True] and not any(bool(w.any()) for w in done.state.weights.values())  # kept, then published
    unscreened = client_round(me, offers, build_model("cnn", seed=3), 0, params, seed=0, client=0,
                              hooks=_hooks([]), screen=False)  # fmt: skip
    assert unscreened.accepted == ["good", "bad"] and unscreened.refused == {}


def test_random_regrowth_drawn_ahead_on_a_thread_gives_the_same_round(init):
    """The simulation on a GPU draws random regrowth's scores on a thread while the client trains: the round
    is bitwise the one that draws them in update_mask (several rounds, so the prune rate and masks move)."""
    from edge_node.sim.methods.base import run_ahead

    params = DisPFLParams(epochs=1, batch_size=32, lr=0.05, planned_rounds=10, regrow="random")
    jobs: list[int] = []

    def ahead(job):
        jobs.append(1)
        return run_ahead(job)

    inline = ahead_state = start(init, 0.5, seed=0, client=0)
    peer = start(init, 0.3, seed=0, client=1)
    for t in range(3):
        offers = [("p", *published(peer))]
        inline = client_round(inline, offers, build_model("cnn", seed=3), t, params, seed=0, client=0,
                              hooks=_hooks([])).state  # fmt: skip
        ahead_state = client_round(ahead_state, offers, build_model("cnn", seed=3), t, params, seed=0, client=0,
                                   hooks=_hooks([], ahead=ahead)).state  # fmt: skip
        assert any(not torch.equal(inline.next_mask[k], inline.train_mask[k]) for k in init)  # masks moved
        for k in init:
            assert torch.equal(inline.next_mask[k], ahead_state.next_mask[k])
            assert torch.equal(inline.weights[k], ahead_state.weights[k])
    assert len(jobs) == 3
    kept = client_round(ahead_state, [], build_model("cnn", seed=3), 3, params, seed=0, client=0,
                        hooks=_hooks([], ahead=ahead, keep=lambda s: s))  # fmt: skip
    assert len(jobs) == 3 and kept.state.next_mask  # a keep hook may change the mask: drawn in update_mask


def test_jobs_run_ahead_on_one_thread_hand_back_their_result_or_error():
    from edge_node.sim.methods.base import run_ahead

    assert run_ahead(lambda: 7)() == 7

    def fails():
        raise ValueError("the job's own error")

    wait = run_ahead(fails)
    with pytest.raises(ValueError, match="the job's own error"):
        wait()
    ran_on = {run_ahead(threading.get_ident)() for _ in range(3)}
    assert len(ran_on) == 1 and threading.get_ident() not in ran_on  # one worker thread, not this one


def test_retier_moves_the_next_mask_to_another_tiers_counts_and_keeps_what_was_published(init):
    """capacity auto's move at a round boundary: down prunes the smallest |w|, up regrows random positions (zero
    until the next aggregation); the counts are the ones start() gives the new density; train_mask stays."""
    state = start(init, 0.6, seed=1, client=0)
    down = retier(state, 0.2, 4, seed=1, client=0)
    assert _nnz(down.next_mask) == _nnz(start(init, 0.2, seed=1, client=0).train_mask) and down.density == 0.2
    assert down.train_mask is state.train_mask and down.weights is state.weights  # published with the weights
    for name, mask in down.next_mask.items():
        assert not (mask & ~state.next_mask[name]).any()  # only pruned
        kept, dropped = state.weights[name][mask].abs(), state.weights[name][state.next_mask[name] & ~mask].abs()
        if kept.numel() and dropped.numel():
            assert dropped.max() <= kept.min()  # the smallest magnitudes went
    up = retier(down, 1.0, 5, seed=1, client=0)
    assert all(bool(m.all()) for m in up.next_mask.values()) and up.density == 1.0
    mid = retier(down, 0.6, 5, seed=1, client=0)
    assert _nnz(mid.next_mask) == _nnz(state.next_mask)
    assert all(not (down.next_mask[k] & ~mid.next_mask[k]).any() for k in init)  # only regrown
    again = retier(down, 0.6, 5, seed=1, client=0)
    assert all(torch.equal(mid.next_mask[k], again.next_mask[k]) for k in init)  # seeded by (client, round)
    aggregated = aggregate_peers(mid, [])
    assert aggregated.mask_density == pytest.approx(0.6, abs=0.01)  # the next round trains on the new tier
    with pytest.raises(ConfigError, match="density=0"):
        retier(state, 0.0, 4, seed=1, client=0)


def test_retier_leaves_frozen_parameters_dense(init):
    frozen = {next(iter(init))}
    state = start(init, 0.6, seed=1, client=0, frozen=frozen)
    down = retier(state, 0.2, 1, seed=1, client=0, frozen=frozen)
    assert all(bool(down.next_mask[name].all()) for name in frozen)
    assert _nnz({k: v for k, v in down.next_mask.items() if k not in frozen}) == _nnz(
        {k: v for k, v in start(init, 0.2, seed=1, client=0, frozen=frozen).train_mask.items() if k not in frozen}
    )
