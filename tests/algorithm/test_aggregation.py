import torch

from edge_node.algorithm import aggregate


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def m(*bits):
    return torch.tensor(bits, dtype=torch.bool)


def test_intersection_weighted_average_on_hand_made_masks():
    # coordinates:          0     1     2     3     4
    own_w = {"w": t(1.0, 2.0, 0.0, 0.0, 0.0)}
    own_old = {"w": m(1, 1, 0, 0, 0)}
    own_new = {"w": m(1, 0, 1, 1, 0)}  # pruned 1, regrew 2 and 3
    n1_w, n1_m = {"w": t(3.0, 0.0, 5.0, 0.0, 7.0)}, {"w": m(1, 0, 1, 0, 1)}
    n2_w, n2_m = {"w": t(0.0, 4.0, 9.0, 0.0, 1.0)}, {"w": m(0, 1, 1, 0, 1)}
    before = [x["w"].clone() for x in (own_w, n1_w, n2_w)]
    out = aggregate(own_w, own_old, own_new, [n1_w, n2_w], [n1_m, n2_m])["w"]
    # c0: (1+3)/2 = 2 kept; c1: pruned by the new mask -> 0; c2: regrown, neighbours' mean (5+9)/2 = 7,
    # own 0 not counted; c3: regrown but nobody holds it -> 0 (zero denominator); c4: not in own mask.
    assert torch.equal(out, t(2.0, 0.0, 7.0, 0.0, 0.0))
    assert all(torch.equal(b, x["w"]) for b, x in zip(before, (own_w, n1_w, n2_w), strict=True))


def test_no_neighbours_keeps_own_weights_on_the_new_mask():
    w = {"a": torch.randn(4, 3)}
    mask = {"a": torch.rand(4, 3) > 0.5}
    w["a"] = w["a"] * mask["a"]
    out = aggregate(w, mask, mask, [], [])
    assert torch.allclose(out["a"], w["a"])


def test_weights_outside_a_senders_mask_are_ignored():
    own = {"w": t(2.0)}
    out = aggregate(own, {"w": m(1)}, {"w": m(1)}, [{"w": t(100.0)}], [{"w": m(0)}])
    assert torch.equal(out["w"], t(2.0))


def _stats(mean: float, var: float, tracked: int) -> dict[str, torch.Tensor]:
    return {
        "bn.running_mean": torch.full((3,), mean),
        "bn.running_var": torch.full((3,), var),
        "bn.num_batches_tracked": torch.tensor(tracked),
    }


def test_buffers_average_over_their_holders_and_take_the_largest_count():
    from edge_node.algorithm.aggregation import aggregate_buffers

    own, a, b = _stats(0.0, 1.0, 4), _stats(3.0, 2.0, 9), _stats(6.0, 6.0, 2)
    out = aggregate_buffers(own, [a, {}, b])  # {}: a peer that sent none (norm_stats local) is not counted
    assert torch.equal(out["bn.running_mean"], torch.full((3,), 3.0))
    assert torch.equal(out["bn.running_var"], torch.full((3,), 3.0))
    assert out["bn.num_batches_tracked"].dtype == torch.int64 and int(out["bn.num_batches_tracked"]) == 9
    assert torch.equal(own["bn.running_mean"], torch.zeros(3))  # inputs untouched
    alone = aggregate_buffers(own, [])
    assert alone is not own and all(torch.equal(alone[k], own[k]) for k in own)
    assert aggregate_buffers({}, [{}, {}]) == {}
    late = aggregate_buffers({}, [a, b])  # a client that has not trained: the peers' mean
    assert torch.equal(late["bn.running_mean"], torch.full((3,), 4.5)) and int(late["bn.num_batches_tracked"]) == 9


def test_buffers_of_another_shape_are_refused():
    import pytest

    from edge_node.algorithm.aggregation import aggregate_buffers
    from edge_node.errors import ConfigError

    wrong = _stats(1.0, 1.0, 1) | {"bn.running_var": torch.ones(4)}
    with pytest.raises(ConfigError, match="running_var"):
        aggregate_buffers(_stats(0.0, 1.0, 1), [wrong])


def test_the_buffer_screen_refuses_bad_statistics():
    from edge_node.algorithm.robust import screen_peer_buffers

    own = _stats(0.5, 1.0, 3)
    peers = [
        ("ok", _stats(0.6, 1.2, 3)),
        ("nan", _stats(float("nan"), 1.0, 3)),
        ("negative", _stats(0.5, -1.0, 3)),
        ("shape", _stats(0.5, 1.0, 3) | {"bn.running_mean": torch.zeros(2)}),
        ("huge", _stats(0.5, 1e6, 3)),
        ("ok2", _stats(0.4, 0.9, 5)),
    ]
    result = screen_peer_buffers(own, peers)
    assert result.accepted == ["ok", "ok2"]
    assert list(result.refused) == ["nan", "negative", "shape", "huge"]
    assert "NaN" in result.refused["nan"] and "negative" in result.refused["negative"]
    assert result.refused["huge"].startswith("buffers: tensor 'bn.running_var'")
