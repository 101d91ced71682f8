"""The device daemon (``edge-node start``): config, state, capacity probe, round loop, status, export.

It drives one client of the DisPFL round in ``edge_node.algorithm.dispfl`` with the snapshots it pulls
from its peers (``edge_node.net``), and logs what it did and the energy it really used.
"""

from edge_node.node.config import NodeConfig
from edge_node.node.daemon import Node

__all__ = ["Node", "NodeConfig"]
