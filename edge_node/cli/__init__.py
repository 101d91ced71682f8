"""The ``edge-node`` command. Each subcommand lives in its own module, imported only when it runs.

Lazy loading keeps ``edge-node peers`` or ``edge-node energy`` from paying for torch at start-up
(about 3 s on a Raspberry Pi class CPU).
"""

from edge_node.cli._app import app, main

__all__ = ["app", "main"]
