"""The handed-over model in an application: onnxruntime on raw samples, reloaded when the node hands over anew.

    model = load_handover("/var/lib/edge-node")        # HandoverError when there is none yet
    model.top(image_chw_in_0_1)                         # [[("cat", 0.71), ("dog", 0.2), ...]]
    if model.reload_if_changed(): ...                   # the node handed over a newer model

Needs numpy and onnxruntime only (Pillow for :func:`read_input` of image files), no torch: what a device's
application installs. Every input is checked against ``model.json`` first, and a wrong one is one line
(:class:`~edge_node.errors.HandoverError`) naming the input, what it is and what the model takes.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_node.errors import HandoverError
from edge_node.handover import Pair, current_folder, read_pair


@dataclass(frozen=True)
class _Loaded:
    pair: Pair
    session: Any  # onnxruntime.InferenceSession


def _session(pair: Pair, threads: int | None) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    try:
        return onnxruntime.InferenceSession(pair.onnx, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own errors
        raise HandoverError(f"onnxruntime cannot load {pair.folder}: {str(exc).splitlines()[0]}") from None


def _load(state_dir: Path, threads: int | None) -> _Loaded:
    pair = read_pair(state_dir)
    if pair is None:
        raise HandoverError(
            f"{state_dir} holds no handed-over model yet (no handover/current.json): the node writes one after its "
            "first round when export_onnx is on"
        )
    return _Loaded(pair, _session(pair, threads))


def class_names(info: dict[str, Any]) -> list[str]:
    """A name per output of the model ``info`` (model.json) describes: its ``class_names``, else the indices."""
    names = info.get("class_names")
    width = int(info["output"]["shape"][-1])
    return [str(n) for n in names] if names else [str(i) for i in range(width)]


@dataclass(frozen=True)
class Prediction:
    """A batch's outputs and the ``model.json`` of the model that gave them."""

    outputs: np.ndarray  # [batch, outputs]: logits (classification, multilabel) or values (regression)
    info: dict[str, Any]

    @property
    def round(self) -> int:
        return int(self.info["round"])

    def top(self, k: int = 3) -> list[list[tuple[str, float]]]:
        """Per sample, the ``k`` most probable classes (softmax of the logits) with their probabilities."""
        logits = self.outputs.astype(np.float64)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        names = class_names(self.info)
        order = np.argsort(-probs, axis=1)[:, :k]
        return [[(names[j], float(p[j])) for j in row] for row, p in zip(order, probs, strict=True)]


class HandedOverModel:
    """The model a node handed over in ``state_dir`` (through ``handover/current.json``), ready for inference.

    Thread-safe: :meth:`reload_if_changed` swaps the model in one step, and a call in progress finishes on the
    model it started with. ``threads``: onnxruntime's intra-op threads (None: its default, all cores).
    """

    def __init__(self, state_dir: Path | str, *, threads: int | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.threads = threads
        self._loaded = _load(self.state_dir, threads)
        self._lock = threading.Lock()

    # -- what it is ---------------------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        """``model.json``: round, task, metric and its value, input and output, class names, node, time, SHA-256."""
        return self._loaded.pair.info

    @property
    def folder(self) -> Path:
        return self._loaded.pair.folder

    @property
    def round(self) -> int:
        """Rounds the model has trained (``edge-node predict`` says "after round N")."""
        return int(self.info["round"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's shape (without the batch dimension)."""
        return tuple(int(d) for d in self.info["input"]["shape"][1:])

    @property
    def class_names(self) -> list[str]:
        """A name per output: model.json's ``class_names``, else the output indices as text."""
        return class_names(self.info)

    def describe(self) -> str:
        """One line: round, node, task metric on its test set, folder."""
        info = self.info
        value = info.get("metric_value")
        if value is None or (isinstance(value, float) and math.isnan(value)):
            shown = "unknown"
        elif info.get("metric_is_fraction"):
            shown = f"{100 * value:.1f}%"
        else:
            shown = f"{value:.4g}"
        return (
            f"model of {info.get('node_id', '?')} after round {self.round}: {info.get('metric')} {shown} on "
            f"{info.get('test_samples', '?')} local test samples ({self.folder.name})"
        )

    # -- inference ----------------------------------------------------------------------------------
    def check(self, x: Any, where: str = "input") -> np.ndarray:
        """``x`` as a float32 batch ``[N, *input_shape]`` (one sample gains the batch dimension).

        Raises:
            HandoverError: one line naming ``where``: not an array of numbers, a wrong shape, non-finite values,
                image values outside [0, 1].
        """
        return check_input(x, self.info, where)

    def run(self, x: Any, where: str = "input") -> Prediction:
        """The outputs for a sample or a batch with the ``model.json`` of the model that gave them (one model,
        even when :meth:`reload_if_changed` swaps it meanwhile in another thread)."""
        loaded = self._loaded
        batch = check_input(x, loaded.pair.info, where)
        name = loaded.pair.info["input"]["name"]
        return Prediction(np.asarray(loaded.session.run(None, {name: batch})[0]), loaded.pair.info)

    def predict(self, x: Any, where: str = "input") -> np.ndarray:
        """The model's outputs (logits of a classification, values of a regression) for a sample or a batch."""
        return self.run(x, where).outputs

    def top(self, x: Any, k: int = 3, where: str = "input") -> list[list[tuple[str, float]]]:
        """Per sample, the ``k`` most probable classes (softmax of the logits) with their probabilities."""
        return self.run(x, where).top(k)

    # -- following the node -------------------------------------------------------------------------
    def reload_if_changed(self) -> bool:
        """Load the pair the pointer names now when it is not the one held; returns whether it changed.

        A pair that cannot be read keeps the model held (HandoverError only when the pointer itself is broken).
        """
        name = current_folder(self.state_dir)
        if name is None or name == self.folder.name:
            return False
        with self._lock:
            if name == self._loaded.pair.folder.name:
                return False
            self._loaded = _load(self.state_dir, self.threads)
            return True


def load_handover(state_dir: Path | str, *, threads: int | None = None) -> HandedOverModel:
    """The model the node in ``state_dir`` handed over (see :class:`HandedOverModel`).

    Raises:
        HandoverError: none handed over yet, or one that cannot be read.
    """
    return HandedOverModel(state_dir, threads=threads)


def check_input(x: Any, info: dict[str, Any], where: str = "input") -> np.ndarray:
    """``x`` checked against model.json's ``input`` and returned as a float32 batch (see HandedOverModel.check)."""
    spec = info["input"]
    shape = tuple(int(d) for d in spec["shape"][1:])
    array = np.asarray(x)
    if array.dtype.kind != "f":
        hint = " (images: pixels / 255, values in [0, 1])" if spec.get("kind") == "image" else ""
        raise HandoverError(f"{where}: dtype {array.dtype}; the model takes {spec['dtype']}{hint}")
    if array.shape == shape:
        array = array[None]
    elif array.shape[1:] != shape or array.shape[0] == 0:
        raise HandoverError(
            f"{where}: shape {tuple(array.shape)}; the model takes {tuple(shape)} (one sample) or "
            f"(N, {', '.join(str(d) for d in shape)}) (a batch)"
        )
    array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(array).all():
        raise HandoverError(f"{where}: holds NaN or infinite values")
    bounds = spec.get("range")
    if bounds is not None and (float(array.min()) < bounds[0] or float(array.max()) > bounds[1]):
        raise HandoverError(
            f"{where}: values from {float(array.min()):g} to {float(array.max()):g}; the model takes {spec['raw']}"
        )
    return array


def read_input(path: Path, info: dict[str, Any], *, resize: bool = False) -> np.ndarray:
    """A ``.npy`` array (one sample or a batch) or an image file as the model's raw input (float32 batch).

    An image is decoded by Pillow, converted to the model's channels (RGB, or L for one channel), resized to
    the model's size when ``resize`` (else a size other than the model's is refused), scaled to [0, 1], CHW.

    Raises:
        HandoverError: one line naming ``path``: unreadable, not an image nor an array, wrong size or shape.
    """
    path = Path(path)
    where = str(path)
    if path.suffix.lower() == ".npy":
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise HandoverError(f"{where}: not a readable .npy array ({str(exc).splitlines()[0]})") from None
        return check_input(array, info, where)
    spec = info["input"]
    if spec.get("kind") != "image":
        raise HandoverError(f"{where}: the model takes {spec['raw']}: give .npy arrays, not image files")
    from PIL import Image, UnidentifiedImageError

    channels, height, width = (int(d) for d in spec["shape"][1:])
    try:
        with Image.open(path) as image:
            image.load()
            converted = image.convert("L" if channels == 1 else "RGB")
    except (OSError, UnidentifiedImageError) as exc:
        raise HandoverError(f"{where}: not an image Pillow can read, nor a .npy array ({exc})") from None
    if converted.size != (width, height):
        if not resize:
            raise HandoverError(
                f"{where}: image of {converted.size[0]}x{converted.size[1]} pixels; the model takes {width}x{height}"
                " (--resize scales it)"
            )
        converted = converted.resize((width, height), Image.Resampling.BILINEAR)
    pixels = np.asarray(converted, dtype=np.float32) / 255.0
    chw = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    return check_input(chw, info, where)
