"""``edge-node simulate``: N DisPFL clients in one process on a benchmark data set."""

from __future__ import annotations

from edge_node.cli._app import app


@app.command()
def simulate() -> None:
    """Run the reference simulation (being built)."""
    raise NotImplementedError
