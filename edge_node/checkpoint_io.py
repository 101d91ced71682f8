"""Checkpoint files of tensors: written atomically, read with ``weights_only`` (never unpickling code).

Weights are stored as the values of their mask's active positions (they are zero elsewhere) next to the
bool masks, so a checkpoint costs about (density * 4 + 1) bytes per parameter. Used by the simulation
(all clients) and the daemon (its one client).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from edge_node.errors import CheckpointError
from edge_node.storage import atomic_write


def pack_weights(weights: Mapping[str, torch.Tensor], mask: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The active values of each tensor, on the CPU."""
    return {name: w[mask[name]].cpu() for name, w in weights.items()}


def unpack_weights(values: Mapping[str, torch.Tensor], mask: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Dense tensors on each mask's device, zero outside the mask (inverse of :func:`pack_weights`)."""
    out = {}
    for name, m in mask.items():
        if values[name].numel() != int(m.sum()):
            raise CheckpointError(f"tensor {name!r}: {values[name].numel()} values for {int(m.sum())} active positions")
        w = torch.zeros(m.shape, dtype=values[name].dtype, device=m.device)
        w[m] = values[name].to(m.device)
        out[name] = w
    return out


def save_payload(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` (tensors, numbers, strings, lists, dicts) to ``path`` atomically.

    Raises:
        StorageError: it could not be written (disk full, ...); the previous file is intact.
    """
    atomic_write(path, lambda handle: torch.save(payload, handle))


def load_payload(path: Path, *, what: str) -> dict[str, Any]:
    """Read a payload written by :func:`save_payload` (``weights_only=True``: no code is unpickled).

    Raises:
        CheckpointError: the file is unreadable, truncated or not a dict (the message names ``what``).
    """
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say so instead of a torch traceback
        raise CheckpointError(f"cannot read {what} {path}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path} is not an edge-node {what}")
    return payload
