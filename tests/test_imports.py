"""Each subpackage imports on its own, and the algorithm layer pulls in no I/O stack."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SUBPACKAGES = [
    "edge_node.algorithm",
    "edge_node.models",
    "edge_node.data",
    "edge_node.wire",
    "edge_node.net",
    "edge_node.energy",
    "edge_node.sim",
    "edge_node.fleet",
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


# The layer order of docs/ARCHITECTURE.md, lowest first: a module imports only from its own layer or below.
LAYERS = [
    {
        "errors",
        "exit_codes",
        "protocol",
        "seeding",
        "storage",
        "tomlconf",
        "checkpoint_io",
        "v1",
        "plugins",
        "threads",
        "task_names",
        "robust_names",  # the robust aggregates' and the attacks' names (the fleet supervisor reads them)
        "version",
        "defaults",
        "torch_threads",
        "records",  # the round-record schema: read and written by node, sim and fleet
        "handover",  # the handed-over model on disk: written by the node, read by applications (no torch)
        "handover_model",  # an application's onnxruntime view of it
    },
    {"algorithm"},
    {"models", "pooling", "data"},
    {"energy"},
    {"wire"},
    {"pretrained"},  # a model's start and frozen layers: algorithm.frozen, and the wire spec of what travels
    {"net"},
    {"node"},
    {"sim", "fleet"},
    {"cli", "api"},
]


def _layer_of(top: str) -> int:
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"edge_node.{top} is in no layer of LAYERS (tests/test_imports.py); add it")


def _imported_tops(path: Path) -> set[str]:
    """First component after ``edge_node.`` of every import in ``path``, lazy ones inside functions included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "edge_node" and len(parts) > 1:
                found.add(parts[1])
    for node in ast.walk(ast.parse(path.read_text())):  # importlib.import_module("edge_node.x...") strings
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("edge_node."):
            found.add(node.value.split(".")[1])
    return found


def test_no_module_imports_from_a_higher_layer():
    package = Path(__file__).resolve().parents[1] / "edge_node"
    violations = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if len(rel.parts) == 1 and rel.stem in ("__init__", "__main__"):
            continue  # the package root re-exports and the entry point calls cli
        top = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        own = _layer_of(top)
        violations += [f"{rel} imports edge_node.{t}" for t in _imported_tops(path) if _layer_of(t) > own]
    assert not violations, violations


def _root_names(path: Path, submodules: set[str]) -> list[str]:
    """Names ``path`` takes from the package root (``from edge_node import X``, X no submodule)."""
    taken = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "edge_node" and node.level == 0:
            taken += [alias.name for alias in node.names if alias.name not in submodules]
    return taken


def test_no_module_takes_names_from_the_package_root():
    """The root re-exports from every layer: a name taken from it is an arrow the layer test cannot see."""
    package = Path(__file__).resolve().parents[1] / "edge_node"
    submodules = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if p.is_dir()}
    violations = [
        f"{path.relative_to(package)} takes edge_node.{name} from the package root"
        for path in sorted(package.rglob("*.py"))
        if path.relative_to(package) != Path("__init__.py")
        for name in _root_names(path, submodules)
    ]
    assert not violations, violations


def test_the_root_import_check_sees_a_root_name(tmp_path):
    """``from edge_node import __version__`` is caught; ``from edge_node import protocol`` (a submodule) is not."""
    source = tmp_path / "m.py"
    source.write_text("from edge_node import __version__, protocol\n")
    assert _root_names(source, {"protocol", "version"}) == ["__version__"]


def test_fleet_supervisor_imports_no_torch():
    """``edge-node loopback``'s supervisor shares the cores with N daemons: it must stay light."""
    code = (
        "import sys, edge_node.fleet.supervise, edge_node.fleet.progress, edge_node.node.status\n"
        "bad = [m for m in ('torch', 'grpc', 'zeroconf') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
