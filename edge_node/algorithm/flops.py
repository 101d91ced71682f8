"""FLOP counting for sparse training (DisPFL's accounting convention), by torch's own counter.

``F(nnz)`` counts 2 FLOPs per *active* multiply-add of a weight on one input sample: each weight's
non-zero count times the number of output positions it is applied at, plus the FLOPs of counted ops
that consume no parameter (attention's ``q @ k^T`` and ``attn @ v``), which are dense. Per client per
round: ``E * n_i * 3 * F(nnz)`` (forward + two backward products) plus, for gradient regrowth,
``B * 3 * F(dense)``. Check values (ResNet18, 32x32): 3 F(dense) = 3.3325e9, ERK d=0.5 2.6533e9.

The count is :class:`torch.utils.flop_counter.FlopCounterMode`'s, run on one forward pass of a CPU copy
of the model: it counts the matrix products torch dispatches (``mm``, ``addmm``, ``bmm``, ``baddbmm``,
convolutions of any dimension, including transposed and grouped ones, and attention kernels), each as
2 FLOPs per multiply-add, after decomposing the ops it has no formula for. Each counted op's FLOPs
are attributed to the parameter tensor it multiplies (found by storage, so ``weight.t()`` and slices
count for ``weight``): a weight's *positions* = its FLOPs / (2 * numel), which ``F`` scales by the
weight's non-zero count. So Conv1d/Conv2d/Conv3d, Linear, the input and hidden matmuls of
RNN/GRU/LSTM at every time step, and attention (its projections sparse, its ``q @ k^T`` and
``attn @ v`` dense) are counted.

Not counted (FlopCounterMode has no formula for them; they are the same for sparse and dense models):
biases, normalisation (batch/layer/group norm), activations, pooling, softmax and every other
elementwise op, embedding look-ups. Two fused CPU kernels it cannot see are counted in their
decomposed form instead, with the same matrix products: oneDNN's LSTM/GRU kernel (``mkldnn_rnn_layer``;
the count runs with oneDNN off, so they fall back to ``addmm`` per step) and the fused CPU attention
kernel (the count runs with scaled-dot-product attention's math backend, ``bmm``s). The copy stays in
training mode, so the eval-only fused ``nn.MultiheadAttention``/``nn.TransformerEncoderLayer`` fast
paths are not taken. Where the figure cannot be made (the forward on zeros of ``(1, *input_shape)``
fails, or an op that does matrix work without a counter formula runs, e.g. a custom fused kernel),
:func:`weight_positions` returns ``None``: the FLOPs are unknown, never a wrong number.
"""

from __future__ import annotations

import copy
import logging
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

_LOGGER = logging.getLogger(__name__)

# Leaf ops that do matrix work but which the counter has no formula for: their FLOPs would be left out.
_UNCOUNTED_HEAVY = re.compile(r"mm|conv|linear|matmul|einsum|rnn|lstm|gru|attention|transformer")
# Per op, the argument positions that are added, not multiplied (addmm's ``self``, a convolution's bias).
_ADDED_ARGS: dict[str, tuple[int, ...]] = {"addmm": (0,), "baddbmm": (0,), "addbmm": (0,)}
_CONV_BIAS = 2


class WeightPositions(dict[str, float]):
    """Per weight (by parameter name), the number of output positions per input sample it is applied at.

    ``unattributed`` holds the FLOPs per sample of counted ops that multiply no parameter (attention's
    ``q @ k^T``): :func:`forward_flops` adds them dense.
    """

    def __init__(self, positions: Mapping[str, float] | None = None, unattributed: float = 0.0) -> None:
        super().__init__(positions or {})
        self.unattributed = float(unattributed)


def _op_name(func: Any) -> str:
    return str(getattr(func, "__name__", func)).split(".")[-1]


class _LeafOps(TorchDispatchMode):
    """Records the ops that run (below the counter's decompositions) with no counter formula and matrix work."""

    def __init__(self, registry: Mapping[Any, Any]) -> None:
        super().__init__()
        self.registry = registry
        self.uncounted: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        packet = getattr(func, "_overloadpacket", func)
        if packet not in self.registry and _UNCOUNTED_HEAVY.search(str(packet).removeprefix("aten.")):
            self.uncounted.add(str(packet))
        return func(*args, **(kwargs or {}))


def _attributing_mapping(
    model: nn.Module, flops_by_weight: dict[str, float], unattributed: list[float]
) -> dict[Any, Callable[..., int]]:
    """The counter's own formulas, wrapped to credit each op's FLOPs to the parameter it multiplies."""
    by_storage: dict[int, list[tuple[str, torch.Tensor]]] = {}
    for name, p in model.named_parameters():
        by_storage.setdefault(p.untyped_storage().data_ptr(), []).append((name, p))

    def owner(t: torch.Tensor) -> tuple[str, int] | None:
        entries = by_storage.get(t.untyped_storage().data_ptr(), [])
        if len(entries) > 1:  # parameters sharing one buffer: the one the view starts in
            entries = [(n, p) for n, p in entries if p.data_ptr() <= t.data_ptr() < p.data_ptr() + p.nbytes]
        return (entries[0][0], entries[0][1].numel()) if entries else None

    def wrap(packet: Any, formula: Callable[..., int]) -> Callable[..., int]:
        name = _op_name(packet)
        added = _ADDED_ARGS.get(name, (_CONV_BIAS,) if "conv" in name else ())

        def counted(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
            flops = formula(*args, out_val=out_val, **kwargs)
            owners = [
                o
                for i, a in enumerate(args)
                if i not in added and isinstance(a, torch.Tensor) and (o := owner(a)) is not None
            ]
            if owners:  # two parameters multiplied together: credited to the larger one
                weight = max(owners, key=lambda o: o[1])[0]
                flops_by_weight[weight] = flops_by_weight.get(weight, 0.0) + flops
            else:
                unattributed[0] += flops
            return int(flops)

        counted._get_raw = True  # type: ignore[attr-defined]  # the counter passes tensors, not shapes
        return counted

    return {packet: wrap(packet, formula) for packet, formula in flop_counter.flop_registry.items()}


def weight_positions(model: nn.Module, input_shape: Sequence[int]) -> WeightPositions | None:
    """For each weight an op multiplies, the number of output positions per input sample it is applied at.

    Runs one forward pass of a CPU copy of ``model`` (training mode, no grad) on zeros of
    ``(1, *input_shape)`` under :class:`~torch.utils.flop_counter.FlopCounterMode` (the model itself is
    not touched). ``None`` where the count cannot be made (see the module docstring): FLOPs unknown.
    """
    flops_by_weight: dict[str, float] = {}
    unattributed = [0.0]
    try:
        clone = copy.deepcopy(model).cpu().train()
        mapping = _attributing_mapping(clone, flops_by_weight, unattributed)
        leaves = _LeafOps(mapping)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # oneDNN's TF32 notice on toggling it
            with (
                torch.no_grad(),
                torch.backends.mkldnn.flags(enabled=False),
                torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH),
                leaves,
                FlopCounterMode(display=False, custom_mapping=mapping) as counter,
            ):
                clone(torch.zeros((1, *input_shape)))
    except Exception as exc:  # noqa: BLE001 - any failure of a user's forward means "unknown", not a crash
        _LOGGER.warning("FLOPs unknown: the model's forward could not be counted (%s: %s)", type(exc).__name__, exc)
        return None
    if leaves.uncounted:
        _LOGGER.warning("FLOPs unknown: ops with no FLOP formula ran: %s", ", ".join(sorted(leaves.uncounted)))
        return None
    total = counter.get_total_flops()
    if total != sum(flops_by_weight.values()) + unattributed[0]:  # every counted op was seen by the mapping
        _LOGGER.warning("FLOPs unknown: counter total %d differs from the attributed FLOPs", total)
        return None
    sizes = {name: p.numel() for name, p in clone.named_parameters()}
    positions = {}
    for name, flops in flops_by_weight.items():
        pos = flops / (2 * sizes[name])
        positions[name] = int(pos) if pos.is_integer() else pos
    return WeightPositions(positions, unattributed[0])


@overload
def forward_flops(positions: Mapping[str, float], nnz: Mapping[str, int]) -> float: ...
@overload
def forward_flops(positions: None, nnz: Mapping[str, int]) -> None: ...
def forward_flops(positions: Mapping[str, float] | None, nnz: Mapping[str, int]) -> float | None:
    """``F``: 2 FLOPs per active multiply-add of every counted weight, one input sample, plus the dense
    FLOPs of counted ops that multiply no parameter; ``None`` (unknown) when ``positions`` is."""
    if positions is None:
        return None
    dense_part = getattr(positions, "unattributed", 0.0)
    return float(sum(2 * nnz[name] * count for name, count in positions.items()) + dense_part)


def dense_nnz(model: nn.Module) -> dict[str, int]:
    return {name: p.numel() for name, p in model.named_parameters()}


@overload
def round_training_flops(
    positions: Mapping[str, float],
    nnz: Mapping[str, int],
    dense: Mapping[str, int],
    *,
    epochs: int,
    samples: int,
    regrow_batch: int = 0,
) -> float: ...
@overload
def round_training_flops(
    positions: None,
    nnz: Mapping[str, int],
    dense: Mapping[str, int],
    *,
    epochs: int,
    samples: int,
    regrow_batch: int = 0,
) -> None: ...
def round_training_flops(
    positions: Mapping[str, float] | None,
    nnz: Mapping[str, int],
    dense: Mapping[str, int],
    *,
    epochs: int,
    samples: int,
    regrow_batch: int = 0,
) -> float | None:
    """One client's training FLOPs in one round: ``E*n*3*F(nnz)`` + ``B*3*F(dense)`` (gradient regrowth);
    ``None`` (unknown) when ``positions`` is."""
    if positions is None:
        return None
    return epochs * samples * 3 * forward_flops(positions, nnz) + regrow_batch * 3 * forward_flops(positions, dense)
