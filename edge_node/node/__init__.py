"""The device daemon (``edge-node start``): config, state, capacity probe, round loop, status, export.

It drives one client of the DisPFL round in ``edge_node.algorithm.dispfl`` with the snapshots it pulls
from its peers (``edge_node.net``), and logs what it did and the energy it really used.

``Node`` and ``NodeConfig`` are imported on first use, so that light readers of a node (the status
socket client used by ``edge-node loopback``'s supervisor) do not load torch and grpc.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_node.node.config import NodeConfig
    from edge_node.node.daemon import Node

__all__ = ["Node", "NodeConfig"]
_LAZY = {"Node": "edge_node.node.daemon", "NodeConfig": "edge_node.node.config"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edge_node.node' has no attribute {name!r}")
