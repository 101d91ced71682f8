"""A data folder far larger than the node's bound: what re-reading it each round costs in time and memory.

Writes ``--files`` tiny distinct PNG images (8x8, random pixels: the flat layout's content split sees distinct
bytes) over ``--classes`` class folders, then reads the folder as a node with ``data_refresh = "round"`` does
(:class:`edge_node.data.folder_watch.FolderWatch`, the default bounds ``max_train_samples`` 20,000 and
``max_test_samples`` 5,000 unless given): the first read, a second read with nothing new (cache hits: listed,
not decoded), and a third after ``--arrive`` new files. For each: seconds, images decoded, decoded bytes held,
and this process's resident memory (``psutil``: now, and the peak so far from ``getrusage``) against the
baseline after the imports and the writing. The folder is removed afterwards.

    .venv/bin/python bench/data_folder.py --files 200000        # 10x max_train_samples
    .venv/bin/python bench/data_folder.py --files 1000000 --dir /var/tmp/million
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _provenance import commit, machine  # noqa: E402

from edge_node.data.folder_watch import FolderWatch  # noqa: E402
from edge_node.defaults import DEFAULTS  # noqa: E402,F401 -- the package's imports before the baseline

SIDE = 8


def _png(rng: np.random.Generator) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _write(root: Path, classes: list[str], start: int, count: int, rng: np.random.Generator) -> float:
    began = time.monotonic()
    for i in range(start, start + count):
        (root / classes[i % len(classes)] / f"{i:07d}.png").write_bytes(_png(rng))
    return time.monotonic() - began


def _mib(n: float) -> float:
    return round(n / 2**20, 1)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--arrive", type=int, default=1_000, help="files added before the third read")
    parser.add_argument("--max-train", type=int, default=20_000)
    parser.add_argument("--max-test", type=int, default=5_000)
    parser.add_argument("--dir", help="where to write the folder (default: a temporary one)")
    parser.add_argument("--json")
    args = parser.parse_args()
    parent = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="data-folder-bench-"))
    root = parent / "data"
    classes = [f"c{i}" for i in range(args.classes)]
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    process = psutil.Process()
    figures: dict[str, object] = {"files": args.files, "classes": args.classes, "max_train": args.max_train,
                                  "max_test": args.max_test}  # fmt: skip
    try:
        figures["write_s"] = round(_write(root, classes, 0, args.files, rng), 1)
        baseline = process.memory_info().rss
        figures["baseline_rss_mib"] = _mib(baseline)
        watch = FolderWatch(root, tuple(classes), test_fraction=0.2, max_train=args.max_train,
                            max_test=args.max_test, size=(SIDE, SIDE))  # fmt: skip
        reads = []
        for name in ("first", "again", "arrived"):
            if name == "arrived":
                _write(root, classes, args.files, args.arrive, rng)
            decoded = watch.decoded
            began = time.monotonic()
            read = watch.read()
            seconds = time.monotonic() - began
            row = {"read": name, "s": round(seconds, 2), "listed": read.listed, "train": read.num_train,
                   "test": read.num_test, "arrived": read.arrived, "decoded": watch.decoded - decoded,
                   "held_mib": _mib(watch.held_bytes()), "rss_mib": _mib(process.memory_info().rss),
                   "rss_over_baseline_mib": _mib(process.memory_info().rss - baseline),
                   "peak_rss_mib": _mib(_peak_rss())}  # fmt: skip
            reads.append(row)
            print(json.dumps(row), file=sys.stderr)
            del read
        figures["reads"] = reads
    finally:
        began = time.monotonic()
        shutil.rmtree(root, ignore_errors=True)
        if not args.dir:
            shutil.rmtree(parent, ignore_errors=True)
        figures["remove_s"] = round(time.monotonic() - began, 1)
    figures["commit"], figures["machine"] = commit(), machine()
    print(f"# {figures['machine']}; commit {figures['commit']}; {args.files:,} files of {SIDE}x{SIDE} PNG in "
          f"{args.classes} class folders (written in {figures['write_s']} s), bounds {args.max_train:,} train / "
          f"{args.max_test:,} test; baseline RSS {figures['baseline_rss_mib']} MiB")  # fmt: skip
    print(
        "| read | s | listed | train | test | arrived | decoded | pixels held (MiB) | RSS over baseline (MiB) "
        "| peak RSS (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in reads:
        print(
            f"| {r['read']} | {r['s']} | {r['listed']:,} | {r['train']:,} | {r['test']:,} | {r['arrived']:,} | "
            f"{r['decoded']:,} | {r['held_mib']} | {r['rss_over_baseline_mib']} | {r['peak_rss_mib']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
