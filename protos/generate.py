"""Generate the Python modules of ``protos/edge_node/v1/*.proto`` into the mirrored ``edge_node/v1/``.

The one way to (re)build the committed generated code, so that ``tests/test_protos_current.py`` can
check it is current: run ``python protos/generate.py`` from anywhere (``--out DIR`` writes the
``edge_node/v1/`` tree under DIR instead of the repository root). The output is deterministic:
sorted inputs, a fixed ``__init__.py``, nothing time- or path-dependent.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PACKAGE_DIR = Path("edge_node") / "v1"
INIT_TEXT = '"""Generated protobuf and gRPC modules of protos/edge_node/v1 (by protos/generate.py; do not edit)."""\n'
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    """The .proto sources, relative to ``protos/`` (their import root), in a fixed order."""
    return sorted(p.relative_to(PROTO_ROOT) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Write ``edge_node/v1/`` under ``out_root``, replacing earlier generated files; return them."""
    import grpc_tools
    from grpc_tools import protoc  # only needed to generate, so imported here

    target = out_root / PACKAGE_DIR
    target.mkdir(parents=True, exist_ok=True)
    for old in target.iterdir():
        if old.name.endswith(GENERATED_SUFFIXES):
            old.unlink()
    sources = [str(p) for p in proto_files()]
    if not sources:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / PACKAGE_DIR}")
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *sources,
    ]
    # protoc resolves the relative sources against the proto path; run from protos/ to be sure.
    import os

    cwd = os.getcwd()
    os.chdir(PROTO_ROOT)
    try:
        status = protoc.main(args)
    finally:
        os.chdir(cwd)
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    (target / "__init__.py").write_text(INIT_TEXT)
    return sorted(p for p in target.iterdir() if p.name.endswith(GENERATED_SUFFIXES) or p.name == "__init__.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="root to write edge_node/v1/ under")
    args = parser.parse_args(argv)
    for path in generate(args.out.resolve()):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
