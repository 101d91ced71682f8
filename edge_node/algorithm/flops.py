"""FLOP counting for sparse training (DisPFL's accounting convention).

``F(nnz)`` counts 2 FLOPs per non-zero multiply-add of conv and linear layers on one input: a
weight's active count times the number of output positions it is applied at. Per client per round:
``E * n_i * 3 * F(nnz)`` (forward + two backward products) plus, for gradient regrowth,
``B * 3 * F(dense)``. Check values (ResNet18, 32x32): 3 F(dense) = 3.3325e9, ERK d=0.5 2.6533e9.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn


def weight_positions(model: nn.Module, input_shape: Sequence[int]) -> dict[str, int]:
    """For each conv/linear weight, the number of output positions per input sample it is applied at.

    Runs one forward pass on zeros of ``(1, *input_shape)`` with hooks (on the model's device).
    """
    positions: dict[str, int] = {}
    handles = []
    for module_name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            key = f"{module_name}.weight" if module_name else "weight"

            def hook(_m: nn.Module, _inp: object, out: torch.Tensor, key: str = key) -> None:
                positions[key] = int(out[0].numel() // out.shape[1]) if out.dim() == 4 else 1

            handles.append(module.register_forward_hook(hook))
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model(torch.zeros((1, *input_shape), device=device))
    finally:
        for h in handles:
            h.remove()
    return positions


def forward_flops(positions: Mapping[str, int], nnz: Mapping[str, int]) -> float:
    """``F``: 2 FLOPs per active multiply-add of every conv/linear weight, one input sample."""
    return float(sum(2 * nnz[name] * count for name, count in positions.items()))


def dense_nnz(model: nn.Module) -> dict[str, int]:
    return {name: p.numel() for name, p in model.named_parameters()}


def round_training_flops(
    positions: Mapping[str, int],
    nnz: Mapping[str, int],
    dense: Mapping[str, int],
    *,
    epochs: int,
    samples: int,
    regrow_batch: int = 0,
) -> float:
    """One client's training FLOPs in one round: ``E*n*3*F(nnz)`` + ``B*3*F(dense)`` (gradient regrowth)."""
    return epochs * samples * 3 * forward_flops(positions, nnz) + regrow_batch * 3 * forward_flops(positions, dense)
