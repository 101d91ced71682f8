"""The personalized model as ONNX (masked weights), checked with onnxruntime against torch.

The daemon hands its model to the device's application after each round (``edge_node.node.handover``:
``STATE_DIR/handover/``, raw input, and the compatibility file ``STATE_DIR/model.onnx`` of normalised input);
``edge-node export`` writes one on demand and prints how far onnxruntime's outputs are from torch's on the
node's test data.

A model is checked once, where a command will export it (``start`` with ``export_onnx``, ``export``):
:func:`onnx_problem` exports it to a temporary directory and runs onnxruntime on a zero batch, so a
model the exporter cannot take is refused in one line before anything is written. A failure later, in a
running daemon's round (``edge_node.node.handover``), is one warning and a counted metric: an export never
stops a node.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge_node.algorithm.training import Batch
from edge_node.errors import ModelError, StorageError
from edge_node.plugins import one_line
from edge_node.storage import describe_failure

ONNX_FILE = "model.onnx"
OPSET = 17
INPUT_NAME = "images"  # float32 [batch, *input_shape] (images: [batch, 3, H, W]), normalised as in training
OUTPUT_NAME = "logits"
_REASON_CHARS = 200  # an exporter's message can run to pages: the start of its first line says what failed


@dataclass(frozen=True)
class ExportCheck:
    samples: int
    max_abs_diff: float
    argmax_agreement: float  # fraction of samples whose top-1 class is the same


def with_weights(
    model: nn.Module, weights: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor] | None = None
) -> nn.Module:
    """A CPU copy of ``model`` in eval mode with ``weights`` (its parameters, zero where masked) loaded, and
    ``buffers`` (e.g. BatchNorm statistics) where given: a buffer of the checkpoint replaces the model's,
    one it does not hold keeps the built value (``load_state_dict(strict=False)`` for buffers).

    Raises:
        ModelError: a parameter is missing or of another shape, or a buffer is not one of the model's.
    """
    scratch = copy.deepcopy(model).cpu().eval()  # one copy per export, never per round of training
    params = dict(scratch.named_parameters())
    known = dict(scratch.named_buffers())
    missing = [name for name in params if name not in weights]
    if missing:
        raise ModelError(f"the weights hold no tensor {missing[0]!r} of the model")
    unknown = [name for name in (buffers or {}) if name not in known]
    if unknown:
        raise ModelError(f"buffer {unknown[0]!r} of the checkpoint is not one of the model's")
    with torch.no_grad():
        for name, param in params.items():
            value = weights[name]
            if tuple(value.shape) != tuple(param.shape):
                raise ModelError(f"tensor {name!r} is {tuple(value.shape)}; the model's is {tuple(param.shape)}")
            param.copy_(value.cpu())
        for name, value in (buffers or {}).items():
            if tuple(value.shape) != tuple(known[name].shape):
                raise ModelError(f"buffer {name!r} is {tuple(value.shape)}; the model's is {tuple(known[name].shape)}")
            known[name].copy_(value.cpu())
    return scratch


def reason_line(exc: BaseException) -> str:
    """An exporter's or onnxruntime's failure as one short line."""
    text = one_line(exc)
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


class ExportFailed(Exception):
    """The exporter or onnxruntime refused the model; the message is the reason, on one line."""


@contextmanager
def _stdout_silenced() -> Iterator[None]:
    """File descriptor 1 on /dev/null: torch's TorchScript exporter turns its C++ log on whatever it is told
    (``setup_onnx_logging`` tests a function for truth, not its value) and, when it fails, prints the whole
    graph to stdout (a daemon's journal, a page per round)."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no stdout to protect
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def export_module(
    scratch: nn.Module, path: Path, input_shape: tuple[int, ...], names: tuple[str, str] = (INPUT_NAME, OUTPUT_NAME)
) -> None:
    """torch's ONNX exporter on ``scratch`` (a CPU copy in eval mode), to ``path``, dynamic batch size; ``names``:
    the graph's input and output names.

    Raises:
        OSError: ``path`` cannot be written.
        ExportFailed: the exporter refused the model (an op it has no ONNX form for, a forward it cannot
            trace, a BatchNorm layer without running statistics given one sample, ...).
    """
    input_name, output_name = names
    with warnings.catch_warnings(), _stdout_silenced():
        warnings.simplefilter("ignore")  # the exporter's tracer warnings are no news to the node's log
        try:
            torch.onnx.export(
                scratch,
                (torch.zeros(1, *input_shape),),
                str(path),
                dynamo=False,  # the TorchScript exporter needs no onnxscript and is exact for these models
                input_names=[input_name],
                output_names=[output_name],
                dynamic_axes={input_name: {0: "batch"}, output_name: {0: "batch"}},
                opset_version=OPSET,
            )
        except OSError:
            raise
        except Exception as exc:  # the exporter raises RuntimeError, ValueError, its own errors, a user's forward's
            raise ExportFailed(reason_line(exc)) from None


def write_onnx(
    path: Path,
    model: nn.Module,
    weights: Mapping[str, torch.Tensor],
    input_shape: tuple[int, ...],
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> int:
    """``model`` with ``weights`` loaded (zero where masked) and ``buffers`` (see :func:`with_weights`) as
    ONNX at ``path``, atomically; returns its size. The graph has a dynamic batch size.

    Raises:
        ModelError: the exporter refused the model (nothing written).
        StorageError: the file cannot be written (the previous one stays).
    """
    return write_module_onnx(path, with_weights(model, weights, buffers), input_shape)


def write_module_onnx(
    path: Path, scratch: nn.Module, input_shape: tuple[int, ...], names: tuple[str, str] = (INPUT_NAME, OUTPUT_NAME)
) -> int:
    """``scratch`` (a CPU module in eval mode, e.g. from :func:`with_weights`) as ONNX at ``path``, atomically;
    returns its size. ``names``: the graph's input and output. Raises as :func:`write_onnx`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        export_module(scratch, tmp, tuple(input_shape), names)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        return path.stat().st_size
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StorageError(describe_failure(path, exc)) from exc
    except ExportFailed as exc:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"the model cannot be exported to ONNX ({exc})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def onnx_problem(model: nn.Module, input_shape: tuple[int, ...]) -> str | None:
    """Why ``model`` (as built) cannot be exported to ONNX and run by onnxruntime, or None.

    Exports it to a temporary directory and runs onnxruntime once on a zero batch of one sample: what a
    command that will export runs once, before it writes anything (about a second for the built-in
    models on a desktop CPU).

    Raises:
        StorageError: the temporary directory cannot be written.
    """
    import onnxruntime

    shape = tuple(int(d) for d in input_shape)
    scratch = copy.deepcopy(model).cpu().eval()
    with tempfile.TemporaryDirectory(prefix="edge-node-onnx-check-") as scratch_dir:
        path = Path(scratch_dir) / ONNX_FILE
        try:
            export_module(scratch, path, shape)
        except OSError as exc:
            raise StorageError(describe_failure(path, exc)) from exc
        except ExportFailed as exc:
            return str(exc)
        try:
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            got = session.run([OUTPUT_NAME], {INPUT_NAME: np.zeros((1, *shape), dtype=np.float32)})[0]
        except Exception as exc:  # onnxruntime's own errors (an op or a type it lacks)
            return f"onnxruntime: {reason_line(exc)}"
    with torch.no_grad():
        expected = scratch(torch.zeros(1, *shape))
    if tuple(got.shape) != tuple(expected.shape):
        return f"onnxruntime gives outputs of shape {tuple(got.shape)}, torch {tuple(expected.shape)}"
    return None


def check_onnx(
    path: Path,
    model: nn.Module,
    weights: Mapping[str, torch.Tensor],
    batches: Iterable[Batch],
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> ExportCheck:
    """Run ``path`` in onnxruntime and the torch model on ``batches``; compare logits and top-1 classes."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    scratch = with_weights(model, weights, buffers)
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
