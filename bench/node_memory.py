"""Memory of a running node: RSS of real ``edge-node start`` daemons, per model, while they train.

    .venv/bin/python bench/node_memory.py [--models cnn resnet18] [--rounds 3] [--batch-size 128] [--json F]

For each model, a loopback fleet of ``--nodes`` (default 2) daemons on the built-in demo set (static
peers on 127.0.0.1, one torch thread each, tier 0.6, the daemon's default batch of 128 unless
``--batch-size`` says otherwise) runs ``--rounds`` rounds; every 0.1 s each daemon's RSS (psutil) is
sampled together with the round it has completed. Printed per model: the RSS once start-up is
over (first sample after the node serves, i.e. imports, data, model and gRPC server), the median and
the largest RSS while rounds run (pulling, aggregating, training, evaluating, exporting ONNX), and the
same as unique set size (USS: pages no other process shares, i.e. without the shared libraries'
pages a second process on the device would not pay again). Nothing is asserted: the figures are the
result (issue 9's target is a cnn node under 400 MB RSS on this machine).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._provenance import commit, machine  # noqa: E402
from edge_node.fleet.config import FleetConfig  # noqa: E402
from edge_node.fleet.fleet import Fleet  # noqa: E402

MB = 2**20


def _memory(pid: int | None) -> tuple[float, float] | None:
    """(RSS, USS) in MiB of a live process, or None once it is gone."""
    if pid is None:
        return None
    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return info.rss / MB, info.uss / MB


def _serving(log_path: Path) -> bool:
    try:
        return "serving" in log_path.read_text(errors="replace")
    except OSError:
        return False


def measure(model: str, *, nodes: int, rounds: int, batch_size: int, epochs: int, output: Path,
            daemon_args: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """Run one fleet of ``model`` to the end and return per-node memory figures."""
    config = FleetConfig(nodes=nodes, rounds=rounds, model=model, output=output, batch_size=batch_size,
                         epochs=epochs, progress=False, daemon_args=daemon_args)  # fmt: skip
    samples: dict[str, list[dict[str, float]]] = {}
    t0 = time.monotonic()
    with Fleet(config, fresh=True) as fleet:
        fleet.start()
        while not fleet.finished():
            fleet.poll()
            for daemon in fleet.own_daemons():
                mem = _memory(daemon.pid)
                if mem is None:
                    continue
                samples.setdefault(daemon.node_id, []).append({
                    "t_s": time.monotonic() - t0, "rss_mb": mem[0], "uss_mb": mem[1],
                    "serving": float(_serving(daemon.log_path)), "rounds": float(len(daemon.records)),
                })  # fmt: skip
            time.sleep(0.1)
        fleet.stop()
        exits = {d.node_id: d.returncode for d in fleet.own_daemons()}
    per_node = []
    for node, rows in sorted(samples.items()):
        up = [r for r in rows if r["serving"]]
        running = [r for r in up if r["t_s"] >= up[0]["t_s"] + 1.0] if up else []
        per_node.append({
            "node": node,
            "rounds": int(max(r["rounds"] for r in rows)),
            "startup_rss_mb": round(up[0]["rss_mb"], 1) if up else None,
            "startup_uss_mb": round(up[0]["uss_mb"], 1) if up else None,
            "median_rss_mb": round(statistics.median(r["rss_mb"] for r in running), 1) if running else None,
            "max_rss_mb": round(max(r["rss_mb"] for r in running), 1) if running else None,
            "median_uss_mb": round(statistics.median(r["uss_mb"] for r in running), 1) if running else None,
            "max_uss_mb": round(max(r["uss_mb"] for r in running), 1) if running else None,
            "samples": len(rows),
        })  # fmt: skip
    return {"model": model, "wall_s": round(time.monotonic() - t0, 1), "exit_codes": exits, "per_node": per_node,
            "samples": samples}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "resnet18"])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128, help="the daemon's default is 128")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--daemon-arg", action="append", default=[], help="one more edge-node start flag")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="edge-node-memory-") as tmp:
        for model in args.models:
            print(f"{model}: {args.nodes} daemons, {args.rounds} rounds ...", file=sys.stderr, flush=True)
            results.append(measure(model, nodes=args.nodes, rounds=args.rounds, batch_size=args.batch_size,
                                   epochs=args.epochs, output=Path(tmp) / model,
                                   daemon_args=tuple(args.daemon_arg)))  # fmt: skip
    where = machine()
    print(f"node memory, demo set, batch {args.batch_size}, {args.epochs} epoch(s) a round, {args.rounds} rounds, "
          f"commit {commit()}, {where}")  # fmt: skip
    print(f"{'model':<10}{'node':<7}{'rounds':>7}{'RSS MB start-up':>17}{'median':>8}{'max':>8}"
          f"{'USS MB start-up':>17}{'median':>8}{'max':>8}")  # fmt: skip
    for result in results:
        for n in result["per_node"]:
            print(f"{result['model']:<10}{n['node']:<7}{n['rounds']:>7}{_fmt(n['startup_rss_mb']):>17}"
                  f"{_fmt(n['median_rss_mb']):>8}{_fmt(n['max_rss_mb']):>8}{_fmt(n['startup_uss_mb']):>17}"
                  f"{_fmt(n['median_uss_mb']):>8}{_fmt(n['max_uss_mb']):>8}")  # fmt: skip
    if args.json is not None:
        record = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                  "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
                  "machine": where, "results": results}  # fmt: skip
        args.json.write_text(json.dumps(record, indent=1) + "\n")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


if __name__ == "__main__":
    main()
