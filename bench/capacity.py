"""How long ``--capacity auto``'s probe takes, and what it measures, per model: cnn and resnet18.

Each model is probed by ``edge-node capacity --json`` in its own process: the code path of ``edge-node
start --capacity auto`` (same settings, threads, fleet seed, data slice: the demo set's slice 0 of 6
unless ``--daemon-arg`` says otherwise). Printed per model: every measurement, the probe's own time
(warm-up, measuring window, in all), the process's wall and CPU time (Python and torch start-up, data
loading and the probe; CPU time well below wall time means the core was shared), the tier and the
constraint that decided it.

The issue's bound is one core: run it as ``taskset -c 0 python bench/capacity.py`` (the affinity is
inherited by the probes; the output says how many CPUs they saw).

Usage: python bench/capacity.py [--models cnn,resnet18] [--threads N] [--daemon-arg=--FLAG ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

BASE = ["--fleet", "bench", "--node-id", "bench", "--insecure", "--capacity", "auto", "--num-clients", "6",
        "--client-index", "0"]  # fmt: skip


def probe(model: str, threads: int | None, extra: list[str]) -> dict[str, Any]:
    """One ``edge-node capacity --json`` run for ``model``: its decision plus the process's wall time."""
    cmd = [sys.executable, "-m", "edge_node", "capacity", "--json", *BASE, "--model", model, *extra]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise SystemExit(f"bench/capacity.py: {' '.join(cmd)} exited {out.returncode}:\n{out.stderr}")
    decision = json.loads(out.stdout)
    return {"model": model, "process_wall_s": round(wall_s, 2), "process_cpu_s": round(cpu_s, 2), "decision": decision}


def describe(row: dict[str, Any]) -> str:
    d = row["decision"]
    m = d["measurements"]
    link = m["link_detail"]
    shared = row["process_cpu_s"] < 0.8 * row["process_wall_s"] * max(1, m["torch_threads"])
    return "\n".join([
        f"{row['model']}:",
        f"  throughput          {m['train_samples_per_s']:.1f} samples/s "
        f"({m['probe_steps']} steps of {m['probe_batch_size']} samples)",
        f"  probe               {m['probe_total_s']:.1f} s in all: warm-up {m['warmup_s']:.1f} s,"
        f" window {m['probe_s']:.1f} s",
        f"  process             {row['process_wall_s']:.1f} s wall, {row['process_cpu_s']:.1f} s CPU"
        " (start-up, data loading, probe" + ("; CPU well below wall: the core was shared)" if shared else ")"),
        f"  activation memory   {m['activation_bytes'] / 2**20:.0f} MiB",
        f"  available memory    {m['available_memory_bytes'] / 2**30:.2f} GiB",
        f"  CPUs                {m['cpu_count']} ({m['torch_threads']} torch threads)",
        f"  accelerator         {m['accelerator']}",
        f"  link                {link}",
        f"  tier                {d['tier']}: {d['decided_by']}",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,resnet18", help="Comma-separated models [cnn,resnet18].")
    parser.add_argument("--threads", type=int, default=None, help="--threads for the probes [torch's default].")
    parser.add_argument("--daemon-arg", action="append", default=[], help="Another flag for edge-node capacity.")
    parser.add_argument("--json", dest="json_path", default=None, help="Also write the figures to this file.")
    args = parser.parse_args()
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print(f"CPU affinity of the probes: {affinity} (of {os.cpu_count()} CPUs); load average {os.getloadavg()}")
    rows = []
    for model in [m for m in args.models.split(",") if m]:
        row = probe(model, args.threads, list(args.daemon_arg))
        rows.append(row)
        print(describe(row), flush=True)
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump({"affinity": affinity, "load_average": os.getloadavg(), "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
