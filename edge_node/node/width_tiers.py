"""A node's width tiers (``tier_mode`` width or both): each tier's narrow model, and what the node trains at its own.

Under width tiers a capacity tier buys a narrow model (edge_node.algorithm.width: the first channels of every
hidden layer, its dense FLOPs the tier's share of the full model's), not only a sparser mask. The node keeps its
state in the full shapes (zero and masked off outside its tier's prefixes), trains its tier's narrow model on
dense kernels of the narrow shapes, and sends only the prefixes (protocol 1.5). Every node of a fleet computes
the same table from the model alone, so a receiver checks a stream's shapes against the tier its header names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

from edge_node.algorithm import weight_positions
from edge_node.algorithm.norm_stats import batch_normalised
from edge_node.algorithm.width import Shapes
from edge_node.errors import ConfigError
from edge_node.models import TierWidth, build_model, tier_widths


@dataclass(frozen=True)
class NodeTiers:
    """The fleet's tier table under one width mode, and how a node builds its tier's model."""

    mode: str  # width or both
    table: Mapping[str, TierWidth]  # by tier name, "0.2" .. "1.0"
    model_name: str
    num_classes: int
    input_shape: tuple[int, ...]
    inner_density: float  # the mask's density inside the narrow model: 1 (width) or --density (both)

    @property
    def shapes(self) -> dict[str, Shapes]:
        """Each tier's narrow shapes, for the wire spec (``ModelSpec.with_tiers``)."""
        return {tier: width.shapes for tier, width in self.table.items()}

    def within(self, tier: str) -> Shapes | None:
        """Tier ``tier``'s prefixes, None where it trains the full model (width 1)."""
        width = self.table[tier]
        return None if width.width >= 1.0 else width.shapes

    def model(self, tier: str, full: nn.Module) -> nn.Module:
        """The model tier ``tier`` trains: its narrow model on ``full``'s device (its weights come from the state
        at each round), or ``full`` itself at width 1."""
        width = self.table[tier]
        if width.width >= 1.0:
            return full
        device = next(full.parameters()).device
        built = build_model(self.model_name, self.num_classes, input_shape=self.input_shape, width=width.width)
        return built.to(device)

    def describe(self, tier: str) -> str:
        width = self.table[tier]
        return f"width {width.width:.3g} ({width.flop_share:.3f} of the dense FLOPs)"


def node_tiers(mode: str, model_name: str, model: nn.Module, num_classes: int, input_shape: tuple[int, ...],
               inner_density: float) -> NodeTiers | None:  # fmt: skip
    """The tier table of a node under ``mode`` (None under ``mask``).

    Raises:
        ConfigError: a BatchNorm model (a narrow model's statistics are not the full one's), or one whose FLOPs
            cannot be counted (no width can be chosen for a tier).
        ModelError: a plug-in that does not accept ``width`` or whose narrow models are not nested.
    """
    if mode == "mask":
        return None
    if batch_normalised(model):
        raise ConfigError(f"tier_mode {mode} cannot train model {model_name}: a narrow model's BatchNorm statistics "
                          "are not the full model's; use GroupNorm or tier_mode mask")  # fmt: skip
    positions = weight_positions(model, input_shape)
    if positions is None:
        raise ConfigError(f"tier_mode {mode}: the FLOPs of model {model_name} cannot be counted, so no width can be "
                          "chosen for a tier; use tier_mode mask")  # fmt: skip
    table = tier_widths(model_name, num_classes, input_shape, positions)  # ModelError: a plug-in without width
    return NodeTiers(mode, table, model_name, num_classes, tuple(input_shape), inner_density if mode == "both" else 1.0)
