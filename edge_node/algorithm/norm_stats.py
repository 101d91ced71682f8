"""BatchNorm's running statistics under DisPFL: FedBN's ``local`` policy (Li et al., ICLR 2021).

A BatchNorm layer's affine weights are parameters like any other (masked, trained, averaged); its buffers
(``running_mean``, ``running_var``, ``num_batches_tracked``) are a client's own: kept beside its weights and
masks (``ClientState.buffers``), loaded into the model before the client trains or is evaluated, read back
after training, checkpointed, and never sent or averaged (``norm_stats = "local"``). Under ``norm_stats =
"average"`` they are also published, dense, beside the weights, and a round averages each float buffer over
the client and the peers that sent it and takes the largest ``num_batches_tracked``
(``aggregation.aggregate_buffers``; a peer that sent none, a ``local`` or 1.2 node, is not counted). A model
without such buffers has nothing here: every function is a no-op for it, and it trains bit for bit as before.

A BatchNorm model trains whole batches: its statistics come from the batch, so a batch sliced into
micro-batches would normalise each slice by its own statistics (``DisPFLParams.fitted`` sets ``micro_batch``
to 0), and a batch of one sample has no variance (BatchNorm in training mode raises; :func:`trainable`
drops such a batch, an epoch's last one). Both hold for a BatchNorm layer without running statistics too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from edge_node.defaults import DEFAULTS

TensorDict = Mapping[str, torch.Tensor]
# "local": FedBN, running statistics stay on the client; "average": sent with the weights and averaged
NORM_STATS = ("local", "average")
DEFAULT_NORM_STATS = DEFAULTS.norm_stats  # the shared table (edge_node.defaults)
_STAT_NAMES = frozenset({"running_mean", "running_var", "num_batches_tracked"})


def other_buffer(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The first buffer of ``model`` that is not a BatchNorm layer's running statistic, with its layer; or None."""
    for name, _ in model.named_buffers():
        layer_name, _, leaf = name.rpartition(".")
        layer = model.get_submodule(layer_name) if layer_name else model
        if not (isinstance(layer, _BatchNorm) and leaf in _STAT_NAMES):
            return name, layer
    return None


def has_running_stats(model: nn.Module) -> bool:
    """True when ``model`` holds BatchNorm running statistics (buffers a client keeps)."""
    return any(True for _ in model.named_buffers())


def batch_normalised(model: nn.Module) -> bool:
    """True when a layer of ``model`` normalises by the batch's statistics (BatchNorm, with or without buffers)."""
    return any(isinstance(module, _BatchNorm) for module in model.modules())


def read_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of ``model``'s buffers by name ({} for a model without any)."""
    return {name: b.detach().clone() for name, b in model.named_buffers()}


_START_ATTR = "_edge_node_start_statistics"  # where remember_start_statistics keeps a model's starting buffers


def remember_start_statistics(model: nn.Module) -> None:
    """Keep ``model``'s buffers as they are now (a pretrained start's) as every client's starting statistics:
    :func:`load_buffers` of ``{}`` restores them instead of a new layer's."""
    object.__setattr__(model, _START_ATTR, read_buffers(model))


def load_buffers(model: nn.Module, buffers: TensorDict) -> None:
    """Copy a client's ``buffers`` into ``model`` in place; ``{}`` (a client that has not trained yet) restores
    the start's statistics (:func:`remember_start_statistics`: a pretrained file's), or, without one, resets every
    BatchNorm layer's statistics to a new layer's (mean 0, variance 1, no batch tracked). No-op without buffers."""
    start: TensorDict = getattr(model, _START_ATTR, {})
    source = buffers or start
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if source:
                buffer.copy_(source[name])
    if not source:
        for module in model.modules():
            if isinstance(module, _BatchNorm) and module.track_running_stats:
                module.reset_running_stats()


def trainable(batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` without those of one sample (BatchNorm in training mode cannot normalise one)."""
    for x, y in batches:
        if y.shape[0] > 1:
            yield x, y
