"""edge-node: decentralized personalized federated learning (DisPFL) on fleets of edge devices.

The public API (docs/API.md), importable from here; names are loaded on first use, so that
``import edge_node`` stays light (no torch, grpc or zeroconf until a name needs them):

- :func:`run_simulation` (:class:`SimConfig`) runs N clients in one process; :func:`run_node`
  (:class:`NodeConfig`, :class:`Node`) runs one device's daemon; :func:`read_records` reads the per-round
  records either writes; :func:`load_trained` returns the trained model of a node's state dir or of a
  simulation's client; :func:`load_handover` (:class:`HandedOverModel`) runs the model a node handed over to
  the device's applications (onnxruntime, no torch), and follows the node when it hands over a newer one.
- :class:`Task` is the base of a learning task of your own (``--task package.module:function``; the built-in
  ones are classification, regression and multilabel).
- :func:`build_checked_model` / :func:`load_dataset` build a model (built-in or a user's factory) and load a
  data set (built-in or a user's factory) the way the commands do.

Layers, lowest first (a module imports only from its own layer or below; docs/ARCHITECTURE.md): foundations
(``errors``, ``protocol``, ``seeding``, ``storage``, ``plugins``), ``algorithm`` (pure tensor math, one
client's round), ``models``/``data``, ``energy``, ``wire`` (protobuf codec), ``net`` (gRPC, discovery),
``node`` (daemon), ``sim``/``fleet``, ``cli``/``api``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from edge_node.errors import EdgeNodeError
from edge_node.version import __version__

if TYPE_CHECKING:
    from edge_node.algorithm.tasks import Task
    from edge_node.api import load_trained, read_records, run_node, run_simulation
    from edge_node.data import Dataset, load_dataset
    from edge_node.handover_model import HandedOverModel, load_handover
    from edge_node.models import build_checked_model
    from edge_node.node.config import NodeConfig
    from edge_node.node.daemon import Node
    from edge_node.sim.config import SimConfig

_LAZY = {
    "Dataset": "edge_node.data",
    "HandedOverModel": "edge_node.handover_model",
    "Node": "edge_node.node.daemon",
    "NodeConfig": "edge_node.node.config",
    "SimConfig": "edge_node.sim.config",
    "Task": "edge_node.algorithm.tasks",
    "build_checked_model": "edge_node.models",
    "load_dataset": "edge_node.data",
    "load_handover": "edge_node.handover_model",
    "load_trained": "edge_node.api",
    "read_records": "edge_node.api",
    "run_node": "edge_node.api",
    "run_simulation": "edge_node.api",
}

__all__ = [
    "Dataset",
    "EdgeNodeError",
    "HandedOverModel",
    "Node",
    "NodeConfig",
    "SimConfig",
    "Task",
    "__version__",
    "build_checked_model",
    "load_dataset",
    "load_handover",
    "load_trained",
    "read_records",
    "run_node",
    "run_simulation",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
