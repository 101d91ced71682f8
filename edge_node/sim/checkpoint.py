"""Atomic, compact checkpoints of a simulation: resume from the last completed round.

Weights are stored as the values of their active positions only (they are zero elsewhere) next to
bool masks, so a checkpoint is about (density * 4 + 2) bytes per parameter and client. Written to a
temp file, fsynced, then renamed (``storage.atomic_write``): a killed run or a full disk never leaves
a half-written checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from edge_node.errors import CheckpointError
from edge_node.storage import atomic_write

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


def _pack(weights: dict[str, torch.Tensor], mask: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: w[mask[name]].cpu() for name, w in weights.items()}


def _unpack(values: dict[str, torch.Tensor], mask: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, m in mask.items():
        w = torch.zeros(m.shape, dtype=values[name].dtype, device=m.device)
        w[m] = values[name].to(m.device)
        out[name] = w
    return out


def save_checkpoint(
    path: Path,
    *,
    round_index: int,
    config: dict[str, Any],
    weights: list[dict[str, torch.Tensor]],
    train_masks: list[dict[str, torch.Tensor]],
    next_masks: list[dict[str, torch.Tensor]],
) -> None:
    """Write the state after round ``round_index`` atomically to ``path``.

    Raises:
        StorageError: it could not be written (disk full, ...); the previous checkpoint is intact.
    """
    payload = {
        "format": FORMAT_VERSION,
        "round": round_index,
        "config": config,
        "values": [_pack(w, m) for w, m in zip(weights, train_masks, strict=True)],
        "train_masks": [{k: v.cpu() for k, v in m.items()} for m in train_masks],
        "next_masks": [{k: v.cpu() for k, v in m.items()} for m in next_masks],
    }
    atomic_write(path, lambda handle: torch.save(payload, handle))


def load_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    """Read a checkpoint (tensors only, ``weights_only=True``) and rebuild dense weights on ``device``."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say so instead of a torch traceback
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path} is not an edge-node simulation checkpoint (format {FORMAT_VERSION})")
    train_masks = [{k: v.to(device) for k, v in m.items()} for m in payload["train_masks"]]
    next_masks = [{k: v.to(device) for k, v in m.items()} for m in payload["next_masks"]]
    weights = [_unpack(v, m) for v, m in zip(payload["values"], train_masks, strict=True)]
    return {
        "round": int(payload["round"]),
        "config": payload["config"],
        "weights": weights,
        "train_masks": train_masks,
        "next_masks": next_masks,
    }
