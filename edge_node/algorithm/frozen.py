"""Frozen parameters: which of a model's parameters train, chosen by ``--trainable`` globs.

A frozen parameter has ``requires_grad=False``: local training takes no gradient for it (so autograd runs
no backward pass below the lowest trainable layer), and it carries an all-true mask that never changes
(the mask update leaves a dense tensor as it is), so the masks, the aggregation and the checkpoints keep
one entry per parameter. It is never published: the wire spec lists only the trainable parameters, and a
receiver keeps its own frozen values (every node's are the same: the fleet's shared start). The choice of
an all-true mask over no mask keeps every per-tensor loop of the algorithm as it is.

A BatchNorm layer whose affine parameters are all frozen is frozen whole (as detectron2's
``FrozenBatchNorm2d``): it normalises with its running statistics in training too, and they stay the start's.
A layer that cannot learn should not re-estimate what its inputs look like, and a training step then does no
batch statistics below the lowest trainable layer: the example MobileNetV2's step with its last blocks
trainable took 0.24x an all-trainable step this way, against 0.40-0.49x with those statistics in training mode
(docs/RESULTS.md).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from edge_node.errors import ConfigError


def parse_globs(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"layer4.*,linear.*"`` (or a sequence of such strings) -> ``("layer4.*", "linear.*")``; empty parts dropped."""
    if text is None:
        return ()
    parts = [text] if isinstance(text, str) else list(text)
    return tuple(g.strip() for part in parts for g in str(part).split(",") if g.strip())


def matching_names(names: Sequence[str], globs: Sequence[str]) -> tuple[str, ...]:
    """The ``names`` (in their order) that match any of the fnmatch-style ``globs``.

    Raises:
        ConfigError: a glob matches no name (one line naming it and a few of the names).
    """
    for glob in globs:
        if not any(fnmatch.fnmatchcase(name, glob) for name in names):
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            raise ConfigError(f"trainable glob {glob!r} matches no parameter of the model (its parameters: {shown})")
    return tuple(name for name in names if any(fnmatch.fnmatchcase(name, g) for g in globs))


def freeze(model: nn.Module, globs: Sequence[str]) -> tuple[str, ...]:
    """Train only the parameters matching ``globs`` (empty: all of them): the others get ``requires_grad=False``.

    Returns the frozen parameters' names (in ``named_parameters`` order; empty when all train).
    """
    if not globs:
        return ()
    names = [name for name, _ in model.named_parameters()]
    trainable = set(matching_names(names, globs))
    for name, param in model.named_parameters():
        param.requires_grad_(name in trainable)
    return tuple(name for name in names if name not in trainable)


def frozen_names(model: nn.Module) -> frozenset[str]:
    """The names of ``model``'s parameters that do not train (``requires_grad`` False)."""
    return frozenset(name for name, p in model.named_parameters() if not p.requires_grad)


def train_mode(model: nn.Module) -> None:
    """``model.train()``, except BatchNorm layers whose affine parameters are all frozen: those stay in eval mode.

    A norm layer without affine parameters, or with one that trains, trains its statistics as usual.
    """
    model.train()
    for module in model.modules():
        if isinstance(module, _NormBase):
            own = list(module.parameters(recurse=False))
            if own and not any(p.requires_grad for p in own):
                module.eval()
