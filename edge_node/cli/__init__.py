"""The ``edge-node`` command. Each subcommand lives in its own module and registers on import."""

from edge_node.cli._app import app, main

# Subcommand modules (importing registers them on ``app``); one line per module.
from edge_node.cli import simulate  # noqa: E402,F401  isort: skip

__all__ = ["app", "main"]
from edge_node.cli import energy  # noqa: E402,F401  isort: skip
from edge_node.cli import peers  # noqa: E402,F401  isort: skip
from edge_node.cli import certs  # noqa: E402,F401  isort: skip
