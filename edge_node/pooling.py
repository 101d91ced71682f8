"""2x2 max-pooling (stride 2) that is fast on a CPU and gives PyTorch's own results bit for bit.

PyTorch's CPU max-pool kernel for the usual NCHW layout is scalar: on this project's 2-core machine it took
12 ms for the ``cnn``'s first pooling of a batch of 128 (64 x 28 x 28 maps), more than the convolution
before it. Its channels-last kernel is vectorised over channels and takes about 1 ms, and the layout change
costs about 2 ms. :func:`max_pool2x2` pools in channels-last and hands back NCHW; the backward pass scatters
the gradient with the NCHW kernel and the forward pass's indices (flat positions within each map, the same
whatever the layout). Both kernels keep the first maximum of a window in the same scan order, so values,
indices and gradients equal ``torch.max_pool2d(x, 2)``'s exactly (``tests/test_pooling.py``), and every
record of a run stays what it was. On a GPU, in a traced export (ONNX), under torch.func's transforms (the
per-sample gradients of DP) and for inputs other than contiguous 4-d float32 maps, it is ``torch.max_pool2d``
itself.

ReLU commutes with the pool exactly, gradients included, so the models pool first and apply ReLU to a
quarter of the elements. ``relu(pool(x))`` equals ``pool(relu(x))`` (ReLU is monotone and keeps positive
values as they are). Where a window's maximum is positive, both pick the same first position of it; where it
is not (NaN included: ``nan > 0`` is false), ReLU's backward sends zero to every position of the window
either way.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_WINDOW = [2, 2]
_STRIDE = [2, 2]
_PADDING = [0, 0]
_DILATION = [1, 1]


class _ChannelsLastMaxPool(torch.autograd.Function):
    """Forward in channels-last (the vectorised kernel), backward with NCHW's scatter and the forward indices."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out, indices = nn.functional.max_pool2d_with_indices(x.contiguous(memory_format=torch.channels_last), _WINDOW)
        ctx.save_for_backward(x, indices.contiguous())
        return out.contiguous()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        x, indices = ctx.saved_tensors
        return torch.ops.aten.max_pool2d_with_indices_backward(
            grad_out.contiguous(), x, _WINDOW, _STRIDE, _PADDING, _DILATION, False, indices
        )


def _use_channels_last(x: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dim() == 4
        and x.dtype == torch.float32
        and x.is_contiguous()
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
        and not torch._C._are_functorch_transforms_active()  # vmap/grad: a Function would need vmap rules
    )


def max_pool2x2(x: torch.Tensor) -> torch.Tensor:
    """``torch.max_pool2d(x, 2)``, the same bits, by the channels-last kernel on a CPU."""
    if not _use_channels_last(x):
        return torch.max_pool2d(x, 2)
    if torch.is_grad_enabled() and x.requires_grad:
        return _ChannelsLastMaxPool.apply(x)
    return torch.max_pool2d(x.contiguous(memory_format=torch.channels_last), 2).contiguous()


class MaxPool2x2(nn.Module):
    """``nn.MaxPool2d(2)`` by :func:`max_pool2x2` (no parameters, no buffers: a model's state is unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return max_pool2x2(x)
