"""What each tier mode learns: setting (ii) under ``--tier-mode mask``, ``width`` and ``both``, and ``heterofl``,
on one configuration, side by side: accuracy per tier and overall, training FLOPs and bytes per round, wall time.

Runs ``edge-node simulate`` once per mode (the commands are printed), then reads each run's records: a client's
tier is ``i mod 5`` (0.2 .. 1.0). The default is the paper-table configuration of docs/RESULTS.md (CIFAR-10,
``cnn``, 20 clients x 500 samples, Dir(0.3), 5 neighbours, 10 rounds of 1 epoch at batch 32).

    .venv/bin/python bench/width_tiers.py --data-dir ../shared/datasets/cifar10-jpeg.tar.gz
    .venv/bin/python bench/width_tiers.py --dataset demo --clients 10 --rounds 3     # a quick look, no download
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

TIERS = (0.2, 0.4, 0.6, 0.8, 1.0)
RUNS = {  # name: the flags of that run beyond the shared ones
    "mask": ["--method", "dispfl", "--tier-mode", "mask"],
    "width": ["--method", "dispfl", "--tier-mode", "width"],
    "both": ["--method", "dispfl", "--tier-mode", "both", "--density", "0.5"],
    "heterofl": ["--method", "heterofl"],
}


def _records(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cifar10")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--samples-per-client", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--neighbours", type=int, default=5)
    parser.add_argument("--output", default="runs/width-tiers")
    parser.add_argument("--runs", default=",".join(RUNS), help="which of mask,width,both,heterofl")
    args = parser.parse_args(argv)
    exe = str(Path(sys.executable).with_name("edge-node"))
    shared = ["--dataset", args.dataset, "--model", args.model, "--clients", str(args.clients),
              "--samples-per-client", str(args.samples_per_client), "--epochs", "1", "--rounds", str(args.rounds),
              "--batch-size", "32", "--partition", "dir:0.3", "--seed", "0", "--setting", "ii", "--regrow", "random",
              "--energy-backend", "estimate", "--no-progress", "--fresh"]  # fmt: skip
    if args.data_dir:
        shared += ["--data-dir", args.data_dir]
    rows = []
    for name in args.runs.split(","):
        own = RUNS[name] + (["--fedavg-clients", str(args.neighbours)] if name == "heterofl" else
                            ["--neighbours", str(args.neighbours)])  # fmt: skip
        out = Path(args.output) / name
        command = [exe, "simulate", *shared, *own, "--output", str(out)]
        print("$", shlex.join(command), flush=True)
        began = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - began
        records = _records(out)
        last = records[-1]
        nodes = last["nodes"]
        assert isinstance(nodes, list)
        headline = [n["acc_after"] if n["acc_after"] is not None else n["acc_before"] for n in nodes]  # the method's
        per_tier = {t: statistics.mean(float(a) for i, a in enumerate(headline) if TIERS[i % 5] == t) for t in TIERS}
        flops = statistics.mean(float(r["flops_per_client_mean"]) for r in records)  # type: ignore[arg-type]
        moved = statistics.mean(float(r["busiest_node_bytes"]) for r in records)  # type: ignore[arg-type]
        rows.append((name, float(last["acc_mean"]), per_tier, flops, moved, wall))  # type: ignore[arg-type]
    print(f"\n{'mode':<9} {'acc':>6} " + " ".join(f"{t:>6}" for t in TIERS) + f" {'GFLOPs/client/round':>20} "
          f"{'MB busiest/round':>17} {'wall s':>7}")  # fmt: skip
    for name, acc, per_tier, flops, moved, wall in rows:
        tiers = " ".join(f"{100 * per_tier[t]:>6.2f}" for t in TIERS)
        print(f"{name:<9} {100 * acc:>6.2f} {tiers} {flops / 1e9:>20.1f} {moved / 1e6:>17.2f} {wall:>7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
