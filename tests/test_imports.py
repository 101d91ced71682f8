"""Each subpackage imports on its own, and the algorithm layer pulls in no I/O stack."""

import subprocess
import sys

import pytest

SUBPACKAGES = [
    "edge_node.algorithm",
    "edge_node.models",
    "edge_node.data",
    "edge_node.wire",
    "edge_node.net",
    "edge_node.energy",
    "edge_node.sim",
    "edge_node.cli",
]


@pytest.mark.parametrize("module", SUBPACKAGES)
def test_imports_alone(module):
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, timeout=120)


def test_algorithm_imports_no_network_or_os_probes():
    code = (
        "import sys, edge_node.algorithm\n"
        "bad = [m for m in ('grpc', 'zeroconf', 'psutil', 'edge_node.net', 'edge_node.node', 'edge_node.sim')"
        " if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
