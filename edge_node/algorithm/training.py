"""Masked local SGD (DisPFL Alg. 1 lines 7-9): plain SGD whose inactive weights stay exactly zero.

Per step: the task's loss (cross-entropy for classification), gradient-norm clipping, weight decay added
to the gradient (as ``torch.optim.SGD`` does, after clipping), ``w -= lr * g``, then ``w *= mask`` so the gradient of an
inactive weight never lands. Momentum is 0 (DisPFL). The loss is accumulated on the device and read
once at the end: no host round trip per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from edge_node.algorithm.dp import DPConfig, private_gradients
from edge_node.algorithm.frozen import train_mode
from edge_node.algorithm.tasks import CLASSIFICATION, Task

TensorDict = Mapping[str, torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class SGDConfig:
    lr: float
    weight_decay: float = 5e-4
    clip_norm: float = 10.0  # max global L2 norm of the gradient
    # Largest slice of a batch sent through the model at once; 0: the whole batch. Slices' gradients are
    # summed into the batch's gradient (the same step up to float rounding) with a slice's activations
    # in memory instead of the batch's: what keeps a daemon of batch 128 small on a Raspberry Pi.
    micro_batch: int = 0
    # DP-SGD (edge_node.algorithm.dp): per-sample clipping and Gaussian noise instead of the plain gradient;
    # the global-norm clip and weight decay above still apply after it (post-processing).
    dp: DPConfig | None = None
    task: Task = CLASSIFICATION  # its loss is the step's (edge_node.algorithm.tasks)


class StepReplay(Protocol):
    """A captured training step ``train_masked`` replays (edge_node.algorithm.graphed.GraphedStep)."""

    def check(self, model: nn.Module, config: SGDConfig, proximal: bool) -> None: ...

    def load(self, masks: Sequence[torch.Tensor], lr: float) -> None: ...

    def fits(self, x: torch.Tensor, y: torch.Tensor) -> bool: ...

    def replay(self, x: torch.Tensor, y: torch.Tensor) -> None: ...

    @property
    def loss_sum(self) -> torch.Tensor: ...


@dataclass(frozen=True)
class TrainStats:
    steps: int
    samples: int
    mean_loss: float


def load_weights(model: nn.Module, weights: TensorDict) -> None:
    """Copy ``weights`` into ``model``'s parameters in place (no new modules, no deep copies)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(weights[name])


def read_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of ``model``'s parameters, by name."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_masked(
    model: nn.Module,
    masks: TensorDict,
    batches: Iterable[Batch],
    config: SGDConfig,
    noise: torch.Generator | None = None,
    *,
    proximal: tuple[TensorDict, float] | None = None,
    graphs: StepReplay | None = None,
) -> TrainStats:
    """Run masked SGD over ``batches`` on ``model`` in place; returns step/sample counts and mean loss.

    With ``config.dp`` each step's gradient is DP-SGD's, its noise drawn from ``noise`` (required then).
    ``proximal=(anchor, lam)`` adds ``lam * (w - anchor)`` to each clipped gradient, as weight decay is
    added (Ditto's personal update: the gradient of ``lam/2 * ||w - anchor||^2``).
    ``graphs`` (a :class:`~edge_node.algorithm.graphed.GraphedStep` for ``model`` and ``config``) replays each
    batch of its shape as one CUDA graph; other batches (an epoch's last, smaller one) take the eager step.
    It refuses (ValueError) a call it was not captured for: DP-SGD, ``proximal``, other clipping or decay.
    Only parameters with ``requires_grad`` train (frozen ones, edge_node.algorithm.frozen, are left as they are:
    no gradient, no decay, no mask applied).
    """
    if config.dp is not None and noise is None:
        raise ValueError("DP-SGD training needs a noise generator")
    if graphs is not None:
        graphs.check(model, config, proximal is not None)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    params: list[torch.Tensor] = [p for _, p in model.named_parameters() if p.requires_grad]
    mask_values = [masks[name].to(params[i].dtype) for i, name in enumerate(names)]
    anchor = [proximal[0][name].to(params[i].dtype) for i, name in enumerate(names)] if proximal else []
    with torch.no_grad():
        torch._foreach_mul_(params, mask_values)  # start on the mask
    loss_sum = torch.zeros((), device=params[0].device)
    steps = samples = 0
    train_mode(model)  # a frozen BatchNorm layer keeps its start's statistics
    if graphs is not None:
        graphs.load(mask_values, config.lr)
    for x, y in batches:
        steps += 1
        samples += int(y.shape[0])
        if graphs is not None and graphs.fits(x, y):
            graphs.replay(x, y)
            continue
        if config.dp is not None and noise is not None:
            loss, grads = private_gradients(
                model, x, y, mask_values, config.dp, noise, config.micro_batch, task=config.task
            )
        else:
            loss, grads = _loss_and_gradients(model, params, x, y, config.micro_batch, config.task)
        with torch.no_grad():
            masked_update(params, grads, mask_values, config, config.lr, (anchor, proximal[1]) if proximal else None)
            loss_sum += loss.detach() * y.shape[0]
    if graphs is not None:
        loss_sum = loss_sum + graphs.loss_sum
    mean_loss = float(loss_sum) / samples if samples else float("nan")
    return TrainStats(steps=steps, samples=samples, mean_loss=mean_loss)


def masked_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    masks: list[torch.Tensor],
    config: SGDConfig,
    lr: float | torch.Tensor,
    proximal: tuple[list[torch.Tensor], float] | None = None,
) -> None:
    """One step's update of ``params`` in place (``grads`` are overwritten): clip the global gradient norm,
    add weight decay (and the proximal pull toward ``anchor``), ``w -= lr * g``, ``w *= mask``.

    ``lr`` a float is fused into the update; a 0-dim tensor (a CUDA graph's, changed between replays) is
    multiplied in first, which rounds ``lr * g`` once more.
    """
    norms = torch._foreach_norm(grads)
    total_norm = torch.linalg.vector_norm(torch.stack(norms))
    scale = (config.clip_norm / (total_norm + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, scale)
    if config.weight_decay:
        torch._foreach_add_(grads, params, alpha=config.weight_decay)
    if proximal is not None and proximal[1]:
        anchor, lam = proximal
        torch._foreach_add_(grads, torch._foreach_sub(params, anchor), alpha=lam)
    if isinstance(lr, torch.Tensor):
        torch._foreach_mul_(grads, lr)
        torch._foreach_sub_(params, grads)
    else:
        torch._foreach_add_(params, grads, alpha=-lr)
    torch._foreach_mul_(params, masks)


def _loss_and_gradients(
    model: nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, micro_batch: int,
    task: Task = CLASSIFICATION,
) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
    """The task's mean loss over the batch and its gradient, in slices of ``micro_batch`` samples."""
    if not 0 < micro_batch < y.shape[0]:
        loss = task.loss(model(x), y)
        return loss, list(torch.autograd.grad(loss, params))
    total = torch.zeros((), device=x.device)
    grads: list[torch.Tensor] = []
    for xs, ys in zip(x.split(micro_batch), y.split(micro_batch), strict=True):
        part = task.loss(model(xs), ys, reduction="sum") / y.shape[0]
        part_grads = torch.autograd.grad(part, params)
        if grads:
            torch._foreach_add_(grads, part_grads)
        else:
            grads = list(part_grads)
        total += part.detach()
    return total, grads


def all_finite(weights: TensorDict) -> bool:
    """True when no weight is NaN or infinite (one host read for the whole model)."""
    return bool(torch.stack([torch.isfinite(w).all() for w in weights.values()]).all())


def dense_gradients(model: nn.Module, batch: Batch, task: Task = CLASSIFICATION) -> dict[str, torch.Tensor]:
    """Gradient of the task's loss on one mini-batch w.r.t. every trainable parameter, inactive ones included
    (frozen ones have none)."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    params: list[torch.Tensor] = [p for _, p in model.named_parameters() if p.requires_grad]
    x, y = batch
    loss = task.loss(model(x), y)
    grads = torch.autograd.grad(loss, params)
    return dict(zip(names, grads, strict=True))


@torch.no_grad()
def count_correct(model: nn.Module, batches: Iterable[Batch]) -> tuple[int, int]:
    """(correct, total) top-1 predictions of ``model`` over ``batches``."""
    model.eval()
    correct: torch.Tensor | None = None  # summed on the model's device, read once at the end
    total = 0
    for x, y in batches:
        hits = (model(x).argmax(dim=1) == y).sum()
        correct = hits if correct is None else correct + hits
        total += int(y.shape[0])
    return (int(correct) if correct is not None else 0), total
