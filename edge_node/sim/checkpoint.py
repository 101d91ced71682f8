"""Atomic, compact checkpoints of a simulation: resume from the last completed round.

Weights are stored as the values of their active positions only (``checkpoint_io.pack_weights``) next
to both bool masks. Written to a temp file, fsynced, then renamed: a killed run or a full disk never
leaves a half-written checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from edge_node.checkpoint_io import load_payload, pack_weights, save_payload, unpack_weights
from edge_node.errors import CheckpointError

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


def save_checkpoint(
    path: Path,
    *,
    round_index: int,
    config: dict[str, Any],
    weights: list[dict[str, torch.Tensor]],
    train_masks: list[dict[str, torch.Tensor]],
    next_masks: list[dict[str, torch.Tensor]],
    buffers: list[dict[str, torch.Tensor]] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write the state after round ``round_index`` atomically to ``path``.

    ``buffers``: each entry's BatchNorm running statistics (saved whole; left out when no entry has any).
    ``extra`` holds a method's own state across rounds (plain numbers, strings, lists, dicts, None).

    Raises:
        StorageError: it could not be written (disk full, ...); the previous checkpoint is intact.
    """
    payload = {
        "format": FORMAT_VERSION,
        "round": round_index,
        "config": config,
        "values": [pack_weights(w, m) for w, m in zip(weights, train_masks, strict=True)],
        "train_masks": [{k: v.cpu() for k, v in m.items()} for m in train_masks],
        "next_masks": [{k: v.cpu() for k, v in m.items()} for m in next_masks],
        "extra": extra or {},
    }
    if buffers and any(buffers):
        payload["buffers"] = [{k: v.cpu() for k, v in b.items()} for b in buffers]
    save_payload(path, payload)


def load_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    """Read a checkpoint (tensors only, ``weights_only=True``) and rebuild dense weights on ``device``."""
    payload = load_payload(path, what="simulation checkpoint")
    if payload.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path} is not an edge-node simulation checkpoint (format {FORMAT_VERSION})")
    train_masks = [{k: v.to(device) for k, v in m.items()} for m in payload["train_masks"]]
    next_masks = [{k: v.to(device) for k, v in m.items()} for m in payload["next_masks"]]
    weights = [unpack_weights(v, m) for v, m in zip(payload["values"], train_masks, strict=True)]
    return {
        "round": int(payload["round"]),
        "config": payload["config"],
        "weights": weights,
        "train_masks": train_masks,
        "next_masks": next_masks,
        "buffers": [{k: v.to(device) for k, v in b.items()} for b in payload.get("buffers", [])],
        "extra": payload.get("extra", {}),
    }
