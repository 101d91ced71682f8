"""edge-node: decentralized personalized federated learning (DisPFL) on fleets of edge devices.

Layers, lowest first (a module imports only from its own layer or below; docs/ARCHITECTURE.md): foundations
(``errors``, ``protocol``, ``seeding``, ``storage``), ``algorithm`` (pure tensor math, one client's round),
``models``/``data``, ``energy``, ``wire`` (protobuf codec), ``net`` (gRPC, discovery), ``node`` (daemon),
``sim``/``fleet``, ``cli``.
"""

from edge_node.errors import EdgeNodeError

__version__ = "0.1.0"

__all__ = ["EdgeNodeError", "__version__"]
