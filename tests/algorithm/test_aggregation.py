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
