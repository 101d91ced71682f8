"""The node's side of the handover: after each round, its personalized model for the device's application.

The daemon calls :meth:`Handover.after_round` once per round (with ``export_onnx``). It

1. loads the round's model: its masked weights and the node's own BatchNorm statistics (``buffers``);
2. exports it twice: the handover graph, which takes *raw* samples (images: float32 in [0, 1], NCHW; the
   normalisation of training is inside the graph), into a hidden folder under ``handover/``; and the
   compatibility file ``STATE_DIR/model.onnx`` (normalised input, as before; kept for one release);
3. scores the handover graph with onnxruntime on the node's current test set (the task's metric);
4. under ``handover = "best"`` re-scores the model handed over so far on that same test set, and hands the
   new one over only when it is no worse, within a tolerance (:func:`hands_over`); under ``"latest"``
   always;
5. publishes the pair (:func:`edge_node.handover.publish`: complete pair, then the pointer, by rename).

Any failure there (the exporter, a full disk, onnxruntime) is one warning and ``on_failure()`` (a counted
metric): the pair handed over before stays readable and the node trains on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edge_node.algorithm.tasks import Task
from edge_node.data.batches import ClientData
from edge_node.errors import EdgeNodeError, HandoverError
from edge_node.handover import FORMAT_VERSION, PAIR_ONNX, incoming, publish, read_pair
from edge_node.node.config import NodeConfig
from edge_node.node.export import ONNX_FILE, reason_line, with_weights, write_module_onnx
from edge_node.node.local_data import LocalData
from edge_node.version import __version__

_LOGGER = logging.getLogger(__name__)

INPUT_NAME = "input"  # the handover graph's input and output (model.json says so too)
OUTPUT_NAME = "output"
SCORE_BATCH = 256  # test samples through onnxruntime at once
RAW_IMAGES = "float32 pixels in [0, 1] (uint8 / 255), RGB, [batch, channels, height, width]"
RAW_FEATURES = "float32 samples as the data factory gives them, [batch, *shape]"


class RawInput(nn.Module):
    """``model`` behind the per-channel normalisation of training: takes images as float32 in [0, 1]."""

    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(self, model: nn.Module, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.model = model
        # (x - mean) / std as one multiply-add, as edge_node.data.augment.normalize_batch does it
        self.register_buffer("scale", torch.tensor([1.0 / s for s in std], dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer(
            "shift",
            torch.tensor([-m / s for m, s in zip(mean, std, strict=True)], dtype=torch.float32).view(1, -1, 1, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(torch.addcmul(self.shift, x, self.scale))


@dataclass(frozen=True)
class RawSpec:
    """What a raw sample is: its shape and, for images, the normalisation the graph applies."""

    shape: tuple[int, ...]
    mean: tuple[float, ...] = ()  # images: per channel; other samples: ()
    std: tuple[float, ...] = ()

    @property
    def is_image(self) -> bool:
        return bool(self.mean)

    def wrap(self, scratch: nn.Module) -> nn.Module:
        return RawInput(scratch, self.mean, self.std).eval() if self.is_image else scratch

    def to_json(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"name": INPUT_NAME, "shape": ["batch", *self.shape], "dtype": "float32"}
        if self.is_image:
            spec |= {"kind": "image", "range": [0.0, 1.0], "raw": RAW_IMAGES,
                     "normalised_in_graph": {"mean": list(self.mean), "std": list(self.std)}}  # fmt: skip
        else:
            spec |= {"kind": "features", "range": None, "raw": RAW_FEATURES}
        return spec


def raw_test_batches(data: ClientData, batch_size: int = SCORE_BATCH) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    """The client's test samples as the application feeds them (images / 255), with their targets, on the CPU."""
    pool, idx = data.pool, data.test_idx
    for start in range(0, idx.numel(), batch_size):
        batch = idx[start : start + batch_size]
        x = pool.test_x[batch].cpu()
        yield (x.float().div_(255.0) if pool.is_image else x.float()).numpy(), pool.test_y[batch].cpu()


def onnx_metrics(
    session: Any, batches: Iterable[tuple[np.ndarray, torch.Tensor]], task: Task
) -> tuple[dict[str, float], int]:
    """The task's metrics of an onnxruntime ``session`` (input :data:`INPUT_NAME`) over ``batches``, and the count."""
    sums: torch.Tensor | None = None
    samples = 0
    for x, y in batches:
        outputs = torch.from_numpy(np.asarray(session.run(None, {INPUT_NAME: x})[0]))
        part = task.metric_sums(outputs, y)
        sums = part if sums is None else sums + part
        samples += int(y.shape[0])
    return ({task.metric: math.nan} if sums is None else task.finish(sums, samples)), samples


def tolerance(*, fraction: bool, test_samples: int, incumbent: float, given: float | None = None) -> float:
    """How much worse a round's model may score and still be handed over: ``given``, else one test sample's
    worth: 1/n of a fraction (accuracy: one sample more misclassified), |incumbent|/n of an error (MAE: an
    average sample's share of the mean)."""
    if given is not None:
        return given
    if test_samples <= 0:
        return 0.0
    return 1.0 / test_samples if fraction else abs(incumbent) / test_samples


def hands_over(mode: str, candidate: float, incumbent: float | None, *, higher_is_better: bool, slack: float) -> bool:
    """Whether the round's model (metric ``candidate``) replaces the handed-over one (``incumbent`` re-scored on
    the same test set; None: there is none, or it cannot be scored)."""
    if mode == "latest" or incumbent is None or math.isnan(incumbent):
        return True
    if math.isnan(candidate):
        return False
    return candidate >= incumbent - slack if higher_is_better else candidate <= incumbent + slack


def _session(model: bytes | Path, threads: int) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads  # the node's own threads: the application's cores stay its own
    source = model if isinstance(model, bytes) else str(model)
    return onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])


class Handover:
    """One node's handover, set up once at start; :meth:`after_round` once per round."""

    def __init__(
        self, state_dir: Path, model: nn.Module, raw: RawSpec, task: Task, about: Mapping[str, Any], *,
        mode: str = "best", keep: int = 3, tolerance: float | None = None,
        on_failure: Callable[[], None] = lambda: None, on_outcome: Callable[[str], None] = lambda _outcome: None,
    ) -> None:  # fmt: skip
        """``about``: what model.json says that no round changes (node_id, fleet, arch_id, class_names, output).
        ``on_outcome``: told "handed_over" or "kept" after each round that got that far."""
        self.state_dir = Path(state_dir)
        self.model = model
        self.raw = raw
        self.task = task
        self.about = dict(about)
        self.mode = mode
        self.keep = keep
        self.tolerance = tolerance
        self.on_failure = on_failure
        self.on_outcome = on_outcome

    def after_round(
        self, round_done: int, weights: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor],
        data: ClientData,
    ) -> str | None:  # fmt: skip
        """Hand over the model after ``round_done`` rounds if the policy takes it, then write the compatibility
        ``model.onnx`` (the latest round's, whatever the policy). Returns the new pair's folder name, or None (the
        old one kept, or a failure: one warning, ``on_failure()``; training goes on)."""
        try:
            scratch = with_weights(self.model, weights, buffers)  # the node's BatchNorm statistics, not the built ones
            name = self._hand_over(round_done, scratch, data)
        except Exception as exc:  # whatever it is, training goes on; the previous pair stays readable
            self._failed(f"model after round {round_done} not handed over", exc, "the one handed over before stays")
            return None
        try:
            write_module_onnx(self.state_dir / ONNX_FILE, scratch, self.raw.shape)
        except Exception as exc:
            compat = self.state_dir / ONNX_FILE
            self._failed(f"{compat} (normalised input) not updated", exc, "the handed-over model is unaffected")
        return name

    def _failed(self, what: str, exc: Exception, kept: str) -> None:
        reason = str(exc) if isinstance(exc, EdgeNodeError) else reason_line(exc)
        _LOGGER.warning("%s: %s; %s, training goes on", what, reason, kept)
        self.on_failure()

    def _hand_over(self, round_done: int, scratch: nn.Module, data: ClientData) -> str | None:
        threads = max(1, torch.get_num_threads())
        with incoming(self.state_dir) as pending:
            write_module_onnx(pending / PAIR_ONNX, self.raw.wrap(scratch), self.raw.shape, (INPUT_NAME, OUTPUT_NAME))
            metrics, samples = onnx_metrics(_session(pending / PAIR_ONNX, threads), raw_test_batches(data), self.task)
            value = metrics[self.task.metric]
            incumbent = self._rescore(data, threads) if self.mode == "best" else None
            reference = incumbent if incumbent is not None else value
            slack = tolerance(fraction=self.task.metric_is_fraction, test_samples=samples, incumbent=reference,
                              given=self.tolerance)  # fmt: skip
            taken = hands_over(self.mode, value, incumbent, higher_is_better=self.task.higher_is_better, slack=slack)
            name = publish(pending, self._info(round_done, metrics, samples), round_done=round_done, keep=self.keep) \
                if taken else None  # fmt: skip
        shown = _shown(self.task, value)
        if name is None:
            assert incumbent is not None
            _LOGGER.info("model after round %d not handed over: %s %s on %d test samples, the handed-over one's %s "
                         "(tolerance %.3g)", round_done, self.task.metric, shown, samples, _shown(self.task, incumbent),
                         slack)  # fmt: skip
            self.on_outcome("kept")
        else:
            _LOGGER.info("handed over the model after round %d (%s %s on %d test samples): %s", round_done,
                         self.task.metric, shown, samples, name)  # fmt: skip
            self.on_outcome("handed_over")
        return name

    def _rescore(self, data: ClientData, threads: int) -> float | None:
        """The handed-over model's metric on the current test set; None when there is none or it cannot be
        scored (then the round's model replaces it)."""
        try:
            pair = read_pair(self.state_dir)
        except HandoverError as exc:
            _LOGGER.warning("%s; the round's model replaces it", exc)
            return None
        if pair is None:
            return None
        if pair.info.get("task") != self.task.name or pair.info.get("input") != self.raw.to_json():
            _LOGGER.info("the handed-over model in %s is of another task or input; the round's model replaces it",
                         pair.folder)  # fmt: skip
            return None
        try:
            metrics, _ = onnx_metrics(_session(pair.onnx, threads), raw_test_batches(data), self.task)
        except Exception as exc:  # onnxruntime's own errors: an output the task cannot score
            _LOGGER.warning("cannot re-score the handed-over model in %s (%s); the round's model replaces it",
                            pair.folder, reason_line(exc))  # fmt: skip
            return None
        return metrics[self.task.metric]

    def _info(self, round_done: int, metrics: Mapping[str, float], samples: int) -> dict[str, Any]:
        """model.json without the SHA-256 and size of the ONNX file (``publish`` adds them)."""
        task = self.task
        return {
            "format": FORMAT_VERSION,
            "round": round_done,
            **self.about,
            "task": task.name,
            "metric": task.metric,
            "metric_value": _json_number(metrics[task.metric]),
            "metric_higher_is_better": task.higher_is_better,
            "metric_is_fraction": task.metric_is_fraction,
            "metrics": {k: _json_number(v) for k, v in metrics.items()},
            "test_samples": samples,
            "input": self.raw.to_json(),
            "handover": self.mode,
            "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "edge_node_version": __version__,
        }


def _json_number(value: float) -> float | None:
    return None if math.isnan(value) else round(float(value), 6)


def _shown(task: Task, value: float) -> str:
    from edge_node.task_names import format_metric

    return format_metric(value, fraction=task.metric_is_fraction)


def node_handover(config: NodeConfig, model: nn.Module, arch_id: str, local: LocalData, task: Task,
                  on_failure: Callable[[], None], on_outcome: Callable[[str], None]) -> Handover | None:  # fmt: skip
    """The daemon's handover (None without ``export_onnx``: nothing is written)."""
    if not config.export_onnx:
        return None
    pool = local.data.pool
    raw = RawSpec(pool.input_shape, pool.mean, pool.std) if pool.is_image else RawSpec(pool.input_shape)
    about = {
        "node_id": config.resolved_node_id,
        "fleet": config.fleet,
        "arch_id": arch_id,
        "output": {"name": OUTPUT_NAME, "shape": ["batch", local.num_classes]},
        "class_names": list(local.class_names) if local.class_names and task.name == "classification" else None,
    }
    return Handover(
        config.state_dir, model, raw, task, about, mode=config.handover, keep=config.handover_keep,
        tolerance=config.handover_tolerance, on_failure=on_failure, on_outcome=on_outcome,
    )  # fmt: skip
