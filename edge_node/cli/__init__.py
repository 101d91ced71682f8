"""The ``edge-node`` command. Each subcommand lives in its own module and registers on import."""

from edge_node.cli._app import app, main

# Subcommand modules (importing registers them on ``app``); one line per module.
from edge_node.cli import simulate  # noqa: E402,F401  isort: skip

__all__ = ["app", "main"]
