"""Peak host memory of a 100-client ResNet18 simulation: edge-node vs a naive reference-style layout.

Measured side by side in one run, each in its own subprocess (peak RSS from the kernel):

* ``ours``: one real round of ``edge-node simulate`` (resnet18, 100 clients, density 0.5, 10 neighbours;
  a few samples per client so the round finishes on a CPU) -- everything the run keeps: weights, bool
  masks, aggregation buffers, checkpoint packing.
* ``naive``: the layout of DisPFL's reference code -- per client a float32 state dict, float32 mask dict
  and a per-round ``copy.deepcopy`` of every client's model before aggregation -- allocated and
  aggregated once, no training. It is a lower bound on that layout's footprint.

Usage: python bench/sim_memory.py [--clients 100] [--model resnet18] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

NAIVE = r"""
import copy, sys, torch
from edge_node.models import build_model
clients, name = int(sys.argv[1]), sys.argv[2]
model = build_model(name, seed=0)
states = []
for i in range(clients):
    g = torch.Generator().manual_seed(i)
    masks = {k: (torch.rand(v.shape, generator=g) < 0.5).float() for k, v in model.state_dict().items()}
    states.append(({k: v.clone() * masks[k] for k, v in model.state_dict().items()}, masks))
snapshot = copy.deepcopy(states)  # the reference deep-copies every model before aggregating
for i in range(clients):
    nbrs = [(i + j + 1) % clients for j in range(min(10, clients - 1))]
    w, m = states[i]
    for k in w:
        total = w[k] + sum(snapshot[j][0][k] for j in nbrs)
        count = m[k] + sum(snapshot[j][1][k] for j in nbrs)
        w[k] = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
"""


_WRAPPER = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def _peak_rss_gib(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` under a fresh wrapper process; return (its peak RSS in GiB, wall seconds)."""
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _WRAPPER, *cmd], check=True, capture_output=True, text=True)
    peak_kib = int(out.stdout.strip().splitlines()[-1])
    return peak_kib / 2**20, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ours_cmd = [
            sys.executable, "-m", "edge_node", "simulate", "--dataset", "demo", "--model", args.model,
            "--clients", str(args.clients), "--neighbours", str(min(10, args.clients - 1)), "--density", "0.5",
            "--rounds", "1",
            "--epochs", "1", "--samples-per-client", "4", "--batch-size", "4", "--no-progress",
            "--energy-backend", "estimate", "--output", os.path.join(tmp, "run"),
        ]  # fmt: skip
        naive_cmd = [sys.executable, "-c", NAIVE, str(args.clients), args.model]
        ours_gib, ours_s = _peak_rss_gib(ours_cmd)
        naive_gib, naive_s = _peak_rss_gib(naive_cmd)
    figures = {
        "model": args.model,
        "clients": args.clients,
        "ours_peak_rss_gib": round(ours_gib, 2),
        "naive_peak_rss_gib": round(naive_gib, 2),
        "ratio_naive_over_ours": round(naive_gib / ours_gib, 2),
        "ours_wall_s": round(ours_s, 1),
        "naive_wall_s": round(naive_s, 1),
    }
    print(f"{args.clients} x {args.model}: ours {ours_gib:.2f} GiB peak RSS (one full simulated round, {ours_s:.0f} s)")
    print(f"{args.clients} x {args.model}: naive reference-style layout {naive_gib:.2f} GiB (state + one aggregation)")
    print(f"ratio naive / ours: {naive_gib / ours_gib:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)


if __name__ == "__main__":
    main()
