"""The node's model and the spec its messages carry, built one way for ``start``, ``capacity`` and ``export``.

All three must agree on the architecture id (a checkpoint or a peer's model is refused otherwise), so the
checked build and the spec come from this one function.
"""

from __future__ import annotations

import logging

from torch import nn

from edge_node.errors import ModelError
from edge_node.models import MODELS, arch_name, build_checked_model
from edge_node.node.config import NodeConfig
from edge_node.node.export import onnx_problem
from edge_node.node.local_data import LocalData
from edge_node.pretrained import prepare_start, wire_spec
from edge_node.wire import ModelSpec

__all__ = ["node_model"]

log = logging.getLogger(__name__)

# What a refused export tells each command to do.
EXPORT_FIX = {"start": "set export_onnx = false to run without the export", "export": "fix the model's forward"}


def node_model(config: NodeConfig, local: LocalData, *, check_export: str | None = None) -> tuple[nn.Module, ModelSpec]:
    """The configured model, checked and built from the fleet seed (on the CPU), started from ``init_weights``
    and frozen but for ``trainable`` when they are set (edge_node.pretrained), and its wire spec.

    Args:
        check_export: the command that will export the model (``start`` with ``export_onnx``, ``export``):
            then it is exported to ONNX once and run by onnxruntime first (:func:`onnx_problem`). ``warn``
            (``start`` without ``export_onnx``): a plug-in model that cannot be exported is said in one
            warning, so the user learns it before ``edge-node export`` refuses it, and the node runs (the
            built-in models export, tested; they are not checked again).

    Raises:
        ModelError: the model breaks the contract (``build_checked_model``), or cannot be exported to ONNX
            (``model X cannot be exported to ONNX (reason): <the command's fix>``).
        ConfigError: a bad ``init_weights`` file or a ``trainable`` glob that matches nothing.
    """
    input_shape = local.data.pool.input_shape
    model = build_checked_model(config.model, local.num_classes, input_shape, config.seed)
    started = prepare_start(model, config.init_weights, config.trainable, model_name=config.model)
    spec = wire_spec(arch_name(config.model), local.num_classes, model, started)
    if check_export is None or (check_export == "warn" and config.model in MODELS):
        return model, spec
    problem = onnx_problem(model, input_shape)
    if problem is None:
        return model, spec
    if check_export != "warn":
        raise ModelError(f"model {config.model} cannot be exported to ONNX ({problem}): {EXPORT_FIX[check_export]}")
    log.warning(
        "model %s cannot be exported to ONNX (%s): export_onnx = false, so this node runs without model.onnx, "
        "and edge-node export will refuse its checkpoint", config.model, problem,
    )  # fmt: skip
    return model, spec
