"""docs/API.md's examples run as written: every ``python`` block, in order, in one fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

API_PAGE = REPO_ROOT / "docs" / "API.md"
EXAMPLE_SRC = REPO_ROOT / "examples" / "digits_tabular" / "src"  # the page's `pip install ./examples/...`


def code_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.MULTILINE | re.DOTALL)


def test_the_page_has_examples_of_each_public_entry_point():
    code = "\n".join(code_blocks(API_PAGE.read_text()))
    for name in ("run_simulation", "read_records", "run_node", "NodeConfig", "SimConfig", "load_dataset"):
        assert name in code, name


@pytest.mark.timeout(900)  # two small simulations and a node round: about a minute on an idle 2-core machine
def test_the_api_page_examples_run(tmp_path: Path):
    pytest.importorskip("sklearn", reason="scikit-learn (the test extra) ships the example's data set")
    script = "\n\n".join(code_blocks(API_PAGE.read_text()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE_SRC), str(REPO_ROOT)]),
           "EDGE_NODE_CACHE": str(tmp_path / "cache")}  # fmt: skip
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=840,
                          cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "accuracy after round 2:" in done.stdout
    assert (tmp_path / "runs" / "demo" / "rounds.jsonl").is_file()
    assert (tmp_path / "state" / "node0" / "rounds.jsonl").is_file()


def test_import_edge_node_is_light():
    code = (
        "import sys, edge_node\n"
        "assert set(edge_node.__all__) >= {'run_simulation', 'run_node', 'read_records', 'SimConfig', 'NodeConfig'}\n"
        "assert set(edge_node.__all__) == {'EdgeNodeError', '__version__', *edge_node._LAZY}\n"
        "bad = [m for m in ('torch', 'grpc', 'zeroconf') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "assert callable(edge_node.run_simulation) and callable(edge_node.SimConfig)  # loaded on first use\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
