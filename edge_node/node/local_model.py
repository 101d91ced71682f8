"""The node's model and the spec its messages carry, built one way for ``start``, ``capacity`` and ``export``.

All three must agree on the architecture id (a checkpoint or a peer's model is refused otherwise), so the
checked build and the spec come from this one function.
"""

from __future__ import annotations

from torch import nn

from edge_node.models import arch_name, build_checked_model
from edge_node.node.config import NodeConfig
from edge_node.node.local_data import LocalData
from edge_node.wire import ModelSpec

__all__ = ["node_model"]


def node_model(config: NodeConfig, local: LocalData) -> tuple[nn.Module, ModelSpec]:
    """The configured model, checked and built from the fleet seed (on the CPU), and its wire spec."""
    model = build_checked_model(config.model, local.num_classes, local.data.pool.input_shape, config.seed)
    return model, ModelSpec.from_tensors(arch_name(config.model), local.num_classes, dict(model.named_parameters()))
