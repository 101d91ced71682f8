"""Batch augmentation on the device that holds the batch: random crop with zero padding and horizontal
flip (the CIFAR recipe of docs/ALGORITHM.md), then per-channel normalisation.

Everything is one gather over a padded copy of the batch, with per-sample offsets drawn from the
caller's ``torch.Generator``; there is no Python loop over samples, so a GPU batch never leaves the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

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
    scale, shift = _affine(tuple(float(m) for m in mean), tuple(float(v) for v in std), x.device)
    # (x / 255 - mean) / std as one multiply-add per element.
    return torch.addcmul(shift, x.to(torch.float32), scale)


@lru_cache(maxsize=16)
def _affine(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and shift of the normalisation, built once per device (no host-to-device copy per batch)."""
    scale = torch.tensor([1.0 / (255.0 * v) for v in std], dtype=torch.float32).view(1, -1, 1, 1)
    shift = torch.tensor([-m / v for m, v in zip(mean, std, strict=True)], dtype=torch.float32).view(1, -1, 1, 1)
    return scale.to(device), shift.to(device)


def draw_crop_flip(
    n: int, generator: torch.Generator, *, crop_padding: int = 4, flip: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (top, left, mirror) for ``n`` samples from ``generator``, on the generator's device.

    Drawing a whole epoch's offsets at once lets a trainer move them to the GPU in one copy.
    """
    if crop_padding < 0:
        raise ValueError(f"crop_padding={crop_padding} must be >= 0")
    device = generator.device
    top = torch.randint(0, 2 * crop_padding + 1, (n,), generator=generator, device=device)
    left = torch.randint(0, 2 * crop_padding + 1, (n,), generator=generator, device=device)
    if flip:
        mirror = torch.randint(0, 2, (n,), generator=generator, device=device).bool()
    else:
        mirror = torch.zeros(n, dtype=torch.bool, device=device)
    return top, left, mirror


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
    top, left, mirror = draw_crop_flip(x.shape[0], generator, crop_padding=crop_padding, flip=flip)
    return normalize_batch(
        crop_flip(x, top.to(x.device), left.to(x.device), mirror.to(x.device), crop_padding), mean, std
    )
