"""Sparse mask initialisation: Erdos-Renyi-Kernel (ERK) with clipping, uniform, and magnitude.

ERK (Evci et al., RigL, ICML 2020) as used by DisPFL (Dai et al., ICML 2022): tensor l gets density
``eps * p_l`` with ``p_l = sum(shape) / prod(shape)``; ``eps`` solves the global budget
``d * N``; while some ``eps * p_l > 1`` the tensors with the largest ``p_l`` become dense and
``eps`` is solved again. Every tensor (biases and norm affine parameters included) is masked.

``magnitude`` keeps ERK's per-tensor counts but, instead of drawing positions at random, keeps each
tensor's largest ``|w|`` (exact ties to the lower index): the first masks of a pretrained start
(``--init-weights``) keep what the pretraining made large. It draws nothing from the generator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from edge_node import protocol
from edge_node.errors import ConfigError

Shape = Sequence[int]
MASK_METHODS = ("erk", "uniform", "magnitude")


def check_density(density: float) -> float:
    """Return ``density`` as float or raise ConfigError quoting it (``protocol.check_density``: 0 < d <= 1)."""
    try:
        return protocol.check_density(density)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _raw_score(shape: Shape) -> float:
    return float(sum(shape)) / float(math.prod(shape))


def erk_densities(shapes: Mapping[str, Shape], density: float) -> dict[str, float]:
    """Per-tensor densities of ERK with clipping for a whole-model target ``density``."""
    density = check_density(density)
    if density == 1.0:
        return {name: 1.0 for name in shapes}
    numel = {name: math.prod(shape) for name, shape in shapes.items()}
    score = {name: _raw_score(shape) for name, shape in shapes.items()}
    dense: set[str] = set()
    while True:
        sparse = [name for name in shapes if name not in dense]
        if not sparse:
            break
        budget = density * sum(numel[n] for n in sparse) - (1.0 - density) * sum(numel[n] for n in dense)
        eps = budget / sum(score[n] * numel[n] for n in sparse)
        max_score = max(score[n] for n in sparse)
        if max_score * eps <= 1.0:
            return {name: 1.0 if name in dense else eps * score[name] for name in shapes}
        dense.update(n for n in sparse if score[n] == max_score)  # all ties at once
    return {name: 1.0 for name in shapes}


def uniform_densities(shapes: Mapping[str, Shape], density: float) -> dict[str, float]:
    """Every tensor at the same density ``density``."""
    density = check_density(density)
    return {name: density for name in shapes}


def active_counts(shapes: Mapping[str, Shape], densities: Mapping[str, float]) -> dict[str, int]:
    """``floor(d_l * n_l)`` active positions per tensor (at least 1 so no tensor vanishes)."""
    counts = {}
    for name, shape in shapes.items():
        n = math.prod(shape)
        counts[name] = n if densities[name] >= 1.0 else max(1, math.floor(densities[name] * n))
    return counts


def random_mask(shape: Shape, active: int, generator: torch.Generator) -> torch.Tensor:
    """A bool mask of ``shape`` with exactly ``active`` positions chosen uniformly at random."""
    n = math.prod(shape)
    if active >= n:
        return torch.ones(tuple(shape), dtype=torch.bool)
    positions = torch.randperm(n, generator=generator)[:active]
    mask = torch.zeros(n, dtype=torch.bool)
    mask[positions] = True
    return mask.view(tuple(shape))


def magnitude_mask(weight: torch.Tensor, active: int) -> torch.Tensor:
    """A bool mask of ``weight``'s shape keeping its ``active`` largest ``|w|`` (exact ties: lower index first)."""
    from edge_node.algorithm.prune_regrow import select_k  # prune_regrow's tie rule, CPU and CUDA alike

    n = weight.numel()
    if active >= n:
        return torch.ones(weight.shape, dtype=torch.bool, device=weight.device)
    score = weight.detach().reshape(-1).abs().float().nan_to_num(nan=-1.0)
    mask = torch.zeros(n, dtype=torch.bool, device=weight.device)
    mask[select_k(score, active, largest=True)] = True
    return mask.view(weight.shape)


def mask_counts(shapes: Mapping[str, Shape], density: float, method: str = "erk") -> dict[str, int]:
    """Active positions per tensor at whole-model ``density``: ``uniform``'s densities, else ERK's (``erk`` and
    ``magnitude``)."""
    rule = uniform_densities if method == "uniform" else erk_densities
    return active_counts(shapes, rule(shapes, density))


def init_masks(
    weights: Mapping[str, torch.Tensor],
    density: float,
    generator: torch.Generator,
    method: str = "erk",
) -> dict[str, torch.Tensor]:
    """Masks for ``weights`` at whole-model ``density``: random positions at ERK or uniform per-tensor densities,
    or ``magnitude``: each tensor's largest ``|w|`` at ERK's counts.

    Random positions are drawn on the CPU from ``generator`` so a seed gives the same masks on any device;
    masks are returned on each weight's device.
    """
    if method not in MASK_METHODS:
        raise ConfigError(f"mask method {method!r} must be one of {', '.join(MASK_METHODS)}")
    shapes = {name: tuple(w.shape) for name, w in weights.items()}
    counts = mask_counts(shapes, density, method)
    if method == "magnitude":
        return {name: magnitude_mask(weights[name], counts[name]) for name in weights}
    return {name: random_mask(shapes[name], counts[name], generator).to(weights[name].device) for name in weights}


def mask_density(masks: Mapping[str, torch.Tensor]) -> float:
    """Fraction of active positions over all tensors."""
    active = sum(int(m.sum()) for m in masks.values())
    return active / sum(m.numel() for m in masks.values())


def nnz_per_tensor(masks: Mapping[str, torch.Tensor]) -> dict[str, int]:
    return {name: int(m.sum()) for name, m in masks.items()}
