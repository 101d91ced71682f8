"""``python -m edge_node`` = the ``edge-node`` command."""

from edge_node.cli import main

main()
