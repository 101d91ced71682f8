"""DisPFL's per-round mask update: magnitude pruning, then regrowth of as many positions.

Per tensor remove the ``ceil(rate * nnz)`` active weights of smallest ``|w|`` and regrow the same
number among the inactive positions (just-pruned ones included), by the largest dense-gradient
magnitude (``gradient``, RigL-style, as in the paper) or uniformly at random (``random``, what the
reference implementation's shipped scripts run). Per-tensor active counts never change; dense
tensors stay dense.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from edge_node.errors import ConfigError

REGROW_RULES = ("gradient", "random")


def select_k(score: torch.Tensor, k: int, *, largest: bool) -> torch.Tensor:
    """Indices of the ``k`` largest (or smallest) entries of 1-D ``score`` (no NaN); exact ties go to the lower
    index. The indices come in no particular order: callers use them as a set.

    ``torch.topk`` leaves the choice among tied scores to the backend, so CPU and CUDA could prune or
    regrow different positions from the same scores (ties are common: weights regrown at 0, zero
    gradients of dead units). Breaking ties by index makes the mask a function of the scores alone. Both
    ways below pick that same set: on a CPU the k-th value and the entries beyond it (cheap there); on a GPU a
    stable sort's first ``k`` (kthvalue on one long row is slow on CUDA, and its two ``nonzero`` wait for the
    device: 18 s of a 52 s ResNet18 round on an H100 went to mask updates that way).
    """
    n = score.numel()
    if not 0 < k <= n:
        raise ValueError(f"k={k} must be in [1, {n}]")
    if score.is_cuda:
        return _select_by_sort(score, k, largest=largest)
    return _select_by_kth(score, k, largest=largest)


def _select_by_kth(score: torch.Tensor, k: int, *, largest: bool) -> torch.Tensor:
    """:func:`select_k` by the k-th value: those strictly beyond it, then its ties in index order."""
    n = score.numel()
    kth = torch.kthvalue(score, n - k + 1 if largest else k).values
    beyond = score > kth if largest else score < kth
    tied = (score == kth).nonzero().squeeze(1)
    strict = beyond.nonzero().squeeze(1)
    return torch.cat([strict, tied[: k - strict.numel()]])


def _select_by_sort(score: torch.Tensor, k: int, *, largest: bool) -> torch.Tensor:
    """:func:`select_k` by a stable sort (equal scores keep their index order), with no host round trip.

    ``+ 0.0`` turns -0.0 into 0.0: a radix sort on the bits may order the two apart; the comparisons above do not.
    """
    return torch.sort(score + 0.0, descending=largest, stable=True).indices[:k]


def drop_smallest(weight: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    """``mask`` (a new tensor) without its ``k`` active positions of smallest ``|weight|``.

    Inactive positions can never be picked; a NaN weight (diverged training) ranks below every
    magnitude, so it is dropped first. ``k`` must be in [0, active count].
    """
    flat_mask = mask.reshape(-1)
    new_mask = flat_mask.clone()
    if k <= 0:
        return new_mask.view_as(mask)
    magnitude = weight.detach().reshape(-1).abs().float().nan_to_num(nan=-1.0).masked_fill(~flat_mask, float("inf"))
    new_mask[select_k(magnitude, k, largest=False)] = False
    return new_mask.view_as(mask)


def _regrow_count(nnz: int, numel: int, rate: float) -> int:
    """How many positions a tensor with ``nnz`` of ``numel`` active prunes and regrows (0: left as it is)."""
    return 0 if nnz == numel else math.ceil(rate * nnz)


def random_regrow_plan(masks: Mapping[str, torch.Tensor], rate: float) -> list[tuple[str, int]]:
    """The tensors ``random`` regrowth draws scores for, in order, with their sizes (one host read for all).

    A caller may draw them ahead (:func:`draw_regrow_scores`, on another thread while the model trains): the
    draws are the generator's alone, so drawing them early changes nothing.
    """
    names = list(masks)
    if not names:
        return []
    counts = torch.stack([masks[n].sum() for n in names]).tolist()
    return [(n, masks[n].numel()) for n, nnz in zip(names, counts, strict=True)
            if _regrow_count(int(nnz), masks[n].numel(), rate)]  # fmt: skip


def draw_regrow_scores(plan: list[tuple[str, int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Uniform scores (on the CPU generator's device) for each tensor of ``plan``, drawn in its order."""
    return {name: torch.rand(numel, generator=generator) for name, numel in plan}


def _update_tensor(
    weight: torch.Tensor,
    mask: torch.Tensor,
    rate: float,
    gradient: torch.Tensor | None,
    random_score: torch.Tensor | None,
) -> torch.Tensor:
    flat_mask = mask.reshape(-1)
    k = _regrow_count(int(flat_mask.sum()), flat_mask.numel(), rate)
    if k == 0:
        return mask.clone()
    new_mask = drop_smallest(weight, mask, k).reshape(-1)
    # Regrow: k positions among all inactive ones now (just-pruned included).
    if gradient is not None:
        score = gradient.detach().reshape(-1).abs().float().nan_to_num(nan=-1.0)  # NaN: regrown last
    else:
        assert random_score is not None, "the plan drew no score for a tensor that regrows"
        score = random_score.to(weight.device)
    return _grow(new_mask, score, k).view_as(mask)


def _grow(flat_mask: torch.Tensor, score: torch.Tensor, k: int) -> torch.Tensor:
    """``flat_mask`` (changed in place) with the ``k`` inactive positions of largest ``score`` made active."""
    flat_mask[select_k(score.masked_fill(flat_mask, float("-inf")), k, largest=True)] = True
    return flat_mask


def update_masks(
    weights: Mapping[str, torch.Tensor],
    masks: Mapping[str, torch.Tensor],
    rate: float,
    rule: str,
    *,
    gradients: Mapping[str, torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
    random_scores: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Prune and regrow every tensor; returns new bool masks (inputs untouched).

    Args:
        weights: trained weights (their magnitudes decide pruning).
        masks: the masks the weights were trained with.
        rate: prune fraction in [0, 1] (see ``schedules.prune_rate``).
        rule: ``gradient`` (needs ``gradients``: dense gradients of one mini-batch) or ``random``
            (needs a CPU ``generator``, so a seed gives the same masks on any device).
        random_scores: ``random``'s scores drawn ahead from that generator
            (``draw_regrow_scores(random_regrow_plan(masks, rate), generator)``), instead of ``generator``.
    """
    if rule not in REGROW_RULES:
        raise ConfigError(f"regrow rule {rule!r} must be one of {', '.join(REGROW_RULES)}")
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"prune rate={rate} must be in [0, 1]")
    if rule == "gradient" and gradients is None:
        raise ConfigError("regrow rule 'gradient' needs the dense gradients of one mini-batch")
    if rule == "random" and random_scores is None:
        if generator is None:
            raise ConfigError("regrow rule 'random' needs a torch.Generator")
        random_scores = draw_regrow_scores(random_regrow_plan(masks, rate), generator)
    return {
        name: _update_tensor(
            weights[name],
            mask,
            rate,
            gradients.get(name) if rule == "gradient" and gradients is not None else None,  # frozen: none
            random_scores.get(name) if rule == "random" and random_scores is not None else None,
        )
        for name, mask in masks.items()
    }


def retier_masks(
    weights: Mapping[str, torch.Tensor],
    masks: Mapping[str, torch.Tensor],
    counts: Mapping[str, int],
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """``masks`` moved to the per-tensor active ``counts`` of another tier: a tensor with too many active positions
    drops its smallest ``|w|`` (:func:`drop_smallest`), one with too few regrows positions drawn uniformly at random
    among its inactive ones (in ``masks``' order, from the CPU ``generator``), as the mask update regrows. Tensors not
    in ``counts`` are kept as they are; inputs are untouched."""
    moved: dict[str, torch.Tensor] = {}
    for name, mask in masks.items():
        target = counts.get(name)
        active = int(mask.sum())
        if target is None or target == active:
            moved[name] = mask.clone()
        elif target < active:
            moved[name] = drop_smallest(weights[name], mask, active - target)
        else:
            score = torch.rand(mask.numel(), generator=generator).to(mask.device)
            moved[name] = _grow(mask.reshape(-1).clone(), score, target - active).view_as(mask)
    return moved
