"""The personalized model as ONNX (masked weights), checked with onnxruntime against torch.

The daemon keeps the latest one as ``model.onnx`` in its state directory (written atomically), so a
local application can run inference with onnxruntime without torch; ``edge-node export --onnx FILE``
writes one on demand and prints how far onnxruntime's outputs are from torch's on the node's test data.
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge_node.algorithm import load_weights
from edge_node.algorithm.training import Batch
from edge_node.errors import StorageError
from edge_node.storage import describe_failure

_LOGGER = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
OPSET = 17
INPUT_NAME = "images"  # float32 [batch, *input_shape] (images: [batch, 3, H, W]), normalised as in training
OUTPUT_NAME = "logits"


@dataclass(frozen=True)
class ExportCheck:
    samples: int
    max_abs_diff: float
    argmax_agreement: float  # fraction of samples whose top-1 class is the same


def write_onnx(path: Path, model: nn.Module, weights: Mapping[str, torch.Tensor], input_shape: tuple[int, ...]) -> int:
    """``model`` with ``weights`` loaded (zero where masked) as ONNX at ``path``, atomically; returns its size.

    The graph has a dynamic batch size. Raises StorageError when the file cannot be written (the
    previous one stays).
    """
    scratch = copy.deepcopy(model).cpu().eval()  # one copy per export, never per round of training
    load_weights(scratch, {k: v.cpu() for k, v in weights.items()})
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
            torch.onnx.export(
                scratch,
                (torch.zeros(1, *input_shape),),
                str(tmp),
                dynamo=False,  # the TorchScript exporter needs no onnxscript and is exact for these models
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                opset_version=OPSET,
            )
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        return path.stat().st_size
    except (OSError, RuntimeError) as exc:
        tmp.unlink(missing_ok=True)
        raise StorageError(describe_failure(path, exc)) from exc


def check_onnx(
    path: Path, model: nn.Module, weights: Mapping[str, torch.Tensor], batches: Iterable[Batch]
) -> ExportCheck:
    """Run ``path`` in onnxruntime and the torch model on ``batches``; compare logits and top-1 classes."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    scratch = copy.deepcopy(model).cpu().eval()
    load_weights(scratch, {k: v.cpu() for k, v in weights.items()})
    worst = 0.0
    agree = total = 0
    with torch.no_grad():
        for x, _ in batches:
            x = x.cpu()
            expected = scratch(x).numpy()
            got = session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0]
            worst = max(worst, float(np.abs(got - expected).max()))
            agree += int((got.argmax(1) == expected.argmax(1)).sum())
            total += x.shape[0]
    return ExportCheck(total, worst, agree / total if total else float("nan"))
