"""DP-SGD's pieces: per-sample clipping, noise only on active coordinates, the private gradient of a batch,
and the spent epsilon as Opacus's own RDP accountant gives it."""

from __future__ import annotations

import pytest
import torch

from edge_node.algorithm.dp import (
    DPConfig,
    clip_and_noise,
    looped_clipped_sum,
    noise_multiplier_for,
    private_gradients,
    spent_epsilon,
    vmap_clipped_sum,
)
from edge_node.algorithm.training import _loss_and_gradients
from edge_node.errors import ConfigError
from edge_node.models import build_model


def test_each_sample_is_clipped_to_c_before_summing_and_noise_lands_only_on_active_coordinates():
    per_sample = [torch.tensor([[3.0, 4.0], [0.3, 0.4]]), torch.zeros(2, 1)]  # norms 5 and 0.5
    masks = [torch.tensor([True, False]), torch.tensor([True])]
    config = DPConfig(clip=1.0, noise_multiplier=0.5)
    out = clip_and_noise(per_sample, masks, config, torch.Generator().manual_seed(0))
    noise = torch.Generator().manual_seed(0)
    n0, n1 = torch.randn(2, generator=noise), torch.randn(1, generator=noise)
    clipped_sum = torch.tensor([0.6 + 0.3, 0.8 + 0.4])  # 5 -> 1 (scaled by 1/5), 0.5 kept
    assert out[0].tolist() == pytest.approx((clipped_sum + 0.5 * n0 * torch.tensor([1.0, 0.0])).tolist())
    assert out[0][1].item() == pytest.approx(1.2)  # inactive: no noise
    assert out[1].tolist() == pytest.approx((0.5 * n1).tolist())


def test_private_gradient_with_no_clipping_and_negligible_noise_is_the_plain_mean_gradient():
    model = build_model("cnn", 10, seed=0)
    x, y = torch.randn(6, 3, 32, 32), torch.randint(0, 10, (6,))
    params = list(model.parameters())
    masks = [torch.ones_like(p, dtype=torch.bool) for p in params]
    loss, grads = private_gradients(model, x, y, masks, DPConfig(1e9, 1e-15), torch.Generator().manual_seed(0), 4)
    plain_loss, plain = _loss_and_gradients(model, params, x, y, 0)
    assert loss.item() == pytest.approx(plain_loss.item(), rel=1e-5)
    for a, b in zip(grads, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_cpu_loop_and_the_gpu_vmap_give_the_same_clipped_sum():
    model = build_model("cnn", 10, seed=1)
    x, y = torch.randn(5, 3, 32, 32), torch.randint(0, 10, (5,))
    for clip in (1e-3, 1e9):  # every sample clipped; none
        loop_loss, looped = looped_clipped_sum(model, x, y, clip)
        vmap_loss, mapped = vmap_clipped_sum(model, x, y, clip, micro_batch=2)
        assert loop_loss.item() == pytest.approx(vmap_loss.item(), rel=1e-5)
        for a, b in zip(looped, mapped, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    norm = torch.sqrt(sum(g.pow(2).sum() for g in looped_clipped_sum(model, x, y, 1e-3)[1]))
    assert norm.item() <= 5 * 1e-3 * (1 + 1e-5)  # 5 samples of norm <= C each


def test_spent_epsilon_grows_with_steps_and_is_opacus_rdp_accountants_own_figure():
    from opacus.accountants import RDPAccountant

    z, q, delta = 1.1, 32 / 500, 1e-5
    accountant = RDPAccountant()
    previous = 0.0
    for steps in range(1, 61):
        accountant.step(noise_multiplier=z, sample_rate=q)
        ours = spent_epsilon(z, q, steps, delta)
        assert ours > previous
        assert ours == pytest.approx(accountant.get_epsilon(delta), rel=1e-9)
        previous = ours
    assert spent_epsilon(z, q, 0, delta) == 0.0


def test_calibrated_noise_spends_at_most_the_budget_by_the_last_step():
    z = noise_multiplier_for(4.0, 1e-5, 0.1, 200)
    assert 3.5 < spent_epsilon(z, 0.1, 200, 1e-5) <= 4.0
    assert spent_epsilon(z, 0.1, 100, 1e-5) < 4.0


def test_dp_config_refuses_non_positive_values():
    with pytest.raises(ConfigError):
        DPConfig(clip=0.0, noise_multiplier=1.0)
