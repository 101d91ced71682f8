"""edge-node: decentralized personalized federated learning (DisPFL) on fleets of edge devices.

Layers (nothing below imports from above): ``algorithm`` (pure tensor math), ``models``/``data``,
``wire`` (protobuf codec), ``net`` (gRPC, discovery), ``node`` (daemon), ``energy``, ``sim``, ``cli``.
"""

from edge_node.errors import EdgeNodeError

__version__ = "0.1.0"

__all__ = ["EdgeNodeError", "__version__"]
