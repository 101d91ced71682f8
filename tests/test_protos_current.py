"""The committed generated modules under edge_node/v1/ are exactly what protos/generate.py makes now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMITTED = REPO_ROOT / "edge_node" / "v1"


def test_generated_protobuf_modules_are_current(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "protos" / "generate.py"), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "edge_node" / "v1").iterdir() if p.is_file()}
    committed = {p.name: p.read_bytes() for p in COMMITTED.iterdir() if p.is_file()}
    assert sorted(fresh) == sorted(committed), "generated file set differs: run python protos/generate.py"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated files {stale}: run python protos/generate.py"
    assert {"wire_pb2.py", "wire_pb2.pyi", "peer_pb2.py", "peer_pb2.pyi", "peer_pb2_grpc.py"} <= set(fresh)
