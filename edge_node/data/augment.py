"""Batch augmentation on the device that holds the batch: random crop with zero padding and horizontal
flip (the CIFAR recipe of ALGORITHM.md), then per-channel normalisation.

Everything is one gather over a padded copy of the batch, with per-sample offsets drawn from the
caller's ``torch.Generator``; there is no Python loop over samples, so a GPU batch never leaves the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def _check_batch(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> None:
    if x.dtype != torch.uint8 or x.dim() != 4:
        raise ValueError(f"x must be a uint8 [B, C, H, W] batch, got {x.dtype} {tuple(x.shape)}")
    if len(mean) != x.shape[1] or len(std) != x.shape[1]:
        raise ValueError(f"mean={tuple(mean)} and std={tuple(std)} need one value per channel ({x.shape[1]})")
    if any(s <= 0 for s in std):
        raise ValueError(f"std={tuple(std)} must be positive")


def normalize_batch(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 [B, C, H, W] -> float32 ``(x / 255 - mean) / std``, on x's device, no augmentation."""
    _check_batch(x, mean, std)
    # (x / 255 - mean) / std as one multiply-add per element.
    scale = torch.tensor([1.0 / (255.0 * v) for v in std], dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    shift = torch.tensor([-m / v for m, v in zip(mean, std, strict=True)], dtype=torch.float32, device=x.device)
    return torch.addcmul(shift.view(1, -1, 1, 1), x.to(torch.float32), scale)


def crop_flip(x: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor, padding: int) -> torch.Tensor:
    """Crop each sample of ``x`` (zero-padded by ``padding``) at (top[i], left[i]), mirrored where flip[i].

    Offsets are in padded coordinates, 0..2*padding; (padding, padding) without flip returns ``x``.
    """
    b, c, h, w = x.shape
    xp = F.pad(x, (padding, padding, padding, padding)) if padding else x
    wp = w + 2 * padding
    rows = top.view(b, 1) + torch.arange(h, device=x.device).view(1, h)  # [B, H]
    cols = left.view(b, 1) + torch.arange(w, device=x.device).view(1, w)  # [B, W]
    cols = torch.where(flip.view(b, 1), cols.flip(1), cols)
    flat = (rows.view(b, h, 1) * wp + cols.view(b, 1, w)).view(b, 1, h * w).expand(b, c, h * w)
    return torch.gather(xp.reshape(b, c, -1), 2, flat).view(b, c, h, w)


def augment_batch(
    x: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    generator: torch.Generator,
    *,
    crop_padding: int = 4,
    flip: bool = True,
) -> torch.Tensor:
    """Random crop (zero padding ``crop_padding``) and horizontal flip, then normalise to float32.

    Args:
        x: uint8 [B, C, H, W] on any device.
        generator: the only source of randomness. Offsets are drawn on the generator's device and moved to
            x's device, so a CPU generator gives the same augmentation on CPU and CUDA (the simulation
            relies on this for CPU/CUDA agreement).
    """
    _check_batch(x, mean, std)
    if crop_padding < 0:
        raise ValueError(f"crop_padding={crop_padding} must be >= 0")
    b = x.shape[0]
    gen_device = generator.device
    top = torch.randint(0, 2 * crop_padding + 1, (b,), generator=generator, device=gen_device).to(x.device)
    left = torch.randint(0, 2 * crop_padding + 1, (b,), generator=generator, device=gen_device).to(x.device)
    if flip:
        mirror = torch.randint(0, 2, (b,), generator=generator, device=gen_device).bool().to(x.device)
    else:
        mirror = torch.zeros(b, dtype=torch.bool, device=x.device)
    return normalize_batch(crop_flip(x, top, left, mirror, crop_padding), mean, std)
