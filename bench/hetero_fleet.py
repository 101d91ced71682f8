"""What setting (ii) buys: a heterogeneous loopback fleet, auto tiers against the alternatives (root).

    sudo .venv/bin/python bench/hetero_fleet.py --output runs/hetero [--nodes 8] [--rounds 10] \\
        [--devices 'pi4:3,pi5:3,orin-nano:2'] [--data-dir ../shared/datasets/cifar10-jpeg.tar.gz] \\
        [--epochs 1] [--batch-size 32] [--target 0.4] [--round-budget-s 600] \\
        [--arms auto,width,dense,slowest,lockstep,stale1] [--dry-run]
    # or one arm per command (each its own quiet window), merged into the same --output:
    sudo .venv/bin/python bench/hetero_fleet.py --output runs/hetero --arms auto
    sudo .venv/bin/python bench/hetero_fleet.py --output runs/hetero --arms slowest   # uses auto's tiers

Runs the same fleet (``--nodes`` daemons with ``--devices`` profiles in network namespaces, CIFAR-10
Dir(0.3), each node its slice, one seed, ``--rounds`` rounds) once per arm:

* ``auto``: ``--capacity auto``, each node picks its tier from its own limited machine (mask tiers);
* ``width``: ``auto`` with ``--tier-mode width``: a tier is a narrow model (its compute shrinks), each node
  timing its tiers' real narrow steps;
* ``dense``: every node at 1.0;
* ``slowest``: every node at the tier the slowest device took in ``auto`` (run ``auto`` first);
* ``lockstep``: ``auto`` with ``--lockstep`` (every round waits for the whole fleet);
* ``stale1``: ``auto`` with a staleness bound of 1 round (the daemon's default is 5).

Per arm, from the nodes' own ``rounds.jsonl``: the wall time (from the command's start, so start-up and
the capacity probe count) and the bytes received by the whole fleet until the fleet's mean accuracy
(each node's latest ``acc_after``, once every node has one) first reaches ``--target`` while every node
still runs (a node that has done its rounds exits, and slower nodes then find fewer peers); the final mean
accuracy; each node's tier; how stale the pulled models were (this node's round minus the peer's).
Writes ``hetero.json``, ``hetero.md`` and ``hetero.png`` (mean accuracy against wall time and against
bytes) to ``--output``. Arms already in ``hetero.json`` are kept (a later command adds or replaces arms),
so each arm can run in its own window; the fleet's settings must be the same as theirs (else one line and
exit 2), and ``slowest`` takes the tiers of the saved ``auto`` arm. Nothing is asserted. Wall times depend
on the machine: run each arm on an otherwise idle one (the load average before and after each arm is
written down), and compare arms of one fleet only.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._provenance import commit, machine  # noqa: E402
from edge_node.records import ROUNDS_LOG, read_records  # noqa: E402

ARMS = ("auto", "width", "dense", "slowest", "lockstep", "stale1")
DEFAULT_DATA = REPO.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What must be the same for arms to be compared (arms of other settings are not merged)."""
    return {"nodes": args.nodes, "rounds": args.rounds, "devices": args.devices, "seed": args.seed,
            "dataset": "demo" if args.demo else "cifar10", "round_budget_s": args.round_budget_s,
            "pull_timeout_s": args.pull_timeout_s, "epochs": args.epochs, "batch_size": args.batch_size}  # fmt: skip


def saved_arms(path: Path, wanted: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The arms of an earlier command on the same fleet, or none; SystemExit(2) for another fleet's file."""
    if not path.exists():
        return {}
    saved = json.loads(path.read_text())
    fleet = {k: v for k, v in saved.get("settings", {}).items() if k != "target"}  # the target only analyses
    if fleet != wanted:
        print(f"{path} holds arms of other settings ({saved.get('settings')}); use another --output",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    return dict(saved["arms"])


def slowest_of(arm: dict[str, Any] | None) -> str | None:
    """The lowest tier any node took in an arm (the ``slowest`` arm's capacity)."""
    if not arm or not arm["tiers"]:
        return None
    return str(min(arm["tiers"].values(), key=float))


def started_of(out: Path, arm: dict[str, Any]) -> float:
    """When an arm's command started (saved; for arms saved before that, from a timeline point)."""
    if "started_unix" in arm:
        return float(arm["started_unix"])
    points = timeline(records(out), len(arm["tiers"]), 0.0)  # started at 0: each point's own time
    if points and arm["timeline"]:
        return points[0]["wall_s"] - arm["timeline"][0]["wall_s"]
    return float(calendar.timegm(time.strptime(arm["started_utc"], "%Y-%m-%dT%H:%M:%SZ")))  # to the second


def reanalyse(arms: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The saved arms analysed again from their nodes' records, for this ``--target`` (nothing runs)."""
    again = {}
    for arm, saved in arms.items():
        started = started_of(args.output / arm, saved)
        fresh = analyse(args.output / arm, args.nodes, started, args.target, saved["wall_s"], saved["exit_code"])
        again[arm] = {**saved, **fresh, "started_unix": started}
    return again


def arm_flags(arm: str, slowest_tier: str | None) -> list[str]:
    """The ``edge-node loopback`` flags that make an arm differ from the others."""
    if arm == "auto":
        return ["--capacity", "auto"]
    if arm == "width":
        return ["--capacity", "auto", "--tier-mode", "width"]
    if arm == "dense":
        return ["--capacity", "1.0"]
    if arm == "slowest":
        if slowest_tier is None:
            raise SystemExit("the slowest arm needs the auto arm's tiers: run --arms auto first (same --output)")
        return ["--capacity", slowest_tier]
    if arm == "lockstep":
        return ["--capacity", "auto", "--lockstep"]
    if arm == "stale1":
        return ["--capacity", "auto", "--daemon-arg=--staleness", "--daemon-arg=1"]
    raise SystemExit(f"unknown arm {arm!r}; arms are {', '.join(ARMS)}")


def command(args: argparse.Namespace, arm: str, slowest_tier: str | None) -> list[str]:
    data = ["--dataset", "demo"] if args.demo else ["--dataset", "cifar10", "--data-dir", str(args.data_dir)]
    return [sys.executable, "-m", "edge_node", "loopback", "--nodes", str(args.nodes), "--rounds", str(args.rounds),
            "--netns", "--devices", args.devices, *data, "--partition", "dir:0.3", "--seed", str(args.seed),
            "--round-budget-s", str(args.round_budget_s), "--pull-timeout-s", str(args.pull_timeout_s),
            "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
            "--output", str(args.output / arm), "--fresh", "--no-progress",
            *arm_flags(arm, slowest_tier)]  # fmt: skip


def records(out: Path) -> list[dict[str, Any]]:
    """Every node's completed round records, in time order."""
    rows = []
    for path in sorted(out.glob(f"node*/{ROUNDS_LOG}")):
        rows += [r for r in read_records(path.parent) if not r.get("diverged")]
    return sorted(rows, key=lambda r: r["time_unix"])


def timeline(rows: list[dict[str, Any]], nodes: int, started_unix: float) -> list[dict[str, float]]:
    """After each record once every node has one: wall time, the fleet's mean accuracy and bytes so far."""
    latest: dict[str, float] = {}
    received = 0
    points = []
    for r in rows:
        latest[r["node_id"]] = r["acc_after"]
        received += int(r.get("bytes_in", 0))
        if len(latest) == nodes:
            points.append({"wall_s": r["time_unix"] - started_unix, "acc_mean": sum(latest.values()) / nodes,
                           "bytes_in": received})  # fmt: skip
    return points


def staleness(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    lags = [r["round"] - peer for r in rows for peer in (r.get("peer_rounds") or {}).values()]
    if not lags:
        return {"mean": None, "max": None, "pulls": 0}
    return {"mean": sum(lags) / len(lags), "max": max(lags), "pulls": len(lags)}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def analyse(out: Path, nodes: int, started_unix: float, target: float, wall_s: float, code: int) -> dict[str, Any]:
    rows = records(out)
    points = timeline(rows, nodes, started_unix)
    # A node that has run its rounds exits and serves no more: later rounds of slower nodes find fewer
    # peers. Only the part of the timeline where every node still ran counts for the target.
    last = {}
    for r in rows:
        last[r["node_id"]] = r["time_unix"] - started_unix
    first_done_s = min(last.values()) if len(last) == nodes else None
    running = [p for p in points if first_done_s is not None and p["wall_s"] <= first_done_s]
    reached = next((p for p in running if p["acc_mean"] >= target), None)
    tiers = {}
    for r in rows:
        tiers[r["node_id"]] = r["tier"]
    return {
        "exit_code": code,
        "wall_s": round(wall_s, 1),
        "rounds_recorded": len(rows),
        "tiers": dict(sorted(tiers.items())),
        "acc_final_mean": points[-1]["acc_mean"] if points else None,
        "first_node_done_s": round(first_done_s, 1) if first_done_s is not None else None,
        "time_to_target_s": round(reached["wall_s"], 1) if reached else None,
        "bytes_to_target": reached["bytes_in"] if reached else None,
        "bytes_total": sum(int(r.get("bytes_in", 0)) for r in rows),
        "staleness": staleness(rows),
        "train_s_per_round": _mean([r["seconds"]["train"] for r in rows if isinstance(r.get("seconds"), dict)]),
        "joules_per_round": _mean([r["energy_total_j"] for r in rows if r.get("energy_total_j") is not None]),
        "energy_labels": sorted({str(r.get("energy_label")) for r in rows}),
        "timeline": points,
    }


def markdown(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"Fleet: {args.nodes} nodes, devices `{args.devices}`, {'demo' if args.demo else 'CIFAR-10'} Dir(0.3), "
        f"{args.rounds} rounds of {args.epochs} epoch(s) of batch {args.batch_size}, seed {args.seed}, round budget "
        f"{args.round_budget_s:g} s; target mean accuracy "
        f"{100 * args.target:.0f}%. {machine()}.",
        "",
        "| arm | exit | tiers | wall s | to target s | MB to target | MB in all | final mean acc | train s / round | "
        "J / round | staleness mean/max | started (UTC), commit | load before/after |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    for arm, r in results.items():
        tiers = ",".join(sorted(set(r["tiers"].values()))) or "-"
        to_target = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
        mb = "-" if r["bytes_to_target"] is None else f"{r['bytes_to_target'] / 1e6:.1f}"
        acc = "-" if r["acc_final_mean"] is None else f"{100 * r['acc_final_mean']:.1f}%"
        st = r["staleness"]
        stale = "-" if st["mean"] is None else f"{st['mean']:.2f} / {st['max']}"
        train = "-" if r.get("train_s_per_round") is None else f"{r['train_s_per_round']:.1f}"
        joules = "-" if r.get("joules_per_round") is None else (
            f"{r['joules_per_round']:.1f} ({', '.join(r.get('energy_labels', []))})"
        )  # fmt: skip
        lines.append(f"| {arm} | {r['exit_code']} | {tiers} | {r['wall_s']:.0f} | {to_target} | {mb} | "
                     f"{r['bytes_total'] / 1e6:.1f} | {acc} | {train} | {joules} | {stale} | "
                     f"{r.get('started_utc', '-')}, "
                     f"{r.get('commit', '-')} | {r.get('load_before', '-')} / "
                     f"{r.get('load_after', '-')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(results: dict[str, dict[str, Any]], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, r in results.items():
        pts = r["timeline"]
        ax_t.plot([p["wall_s"] for p in pts], [100 * p["acc_mean"] for p in pts], label=arm)
        ax_b.plot([p["bytes_in"] / 1e6 for p in pts], [100 * p["acc_mean"] for p in pts], label=arm)
    for ax, xlabel in ((ax_t, "wall time (s)"), (ax_b, "MB received by the fleet")):
        ax.axhline(100 * target, color="grey", lw=0.8, ls="--")
        ax.set(xlabel=xlabel, ylabel="fleet mean accuracy (%)")
        ax.grid(alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save(store: Path, args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps({"settings": {**settings(args), "target": args.target}, "arms": results,
                                 "machine": machine()}, indent=1) + "\n")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--devices", default="pi4:3,pi5:3,orin-nano:2")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--demo", action="store_true", help="The built-in demo set instead of CIFAR-10 (a smoke run).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=1, help="Local epochs per round (the table's: 1).")
    parser.add_argument("--batch-size", type=int, default=32, help="Training batch size (the table's: 32).")
    parser.add_argument("--target", type=float, default=0.4, help="Fleet mean accuracy to reach (0..1).")
    parser.add_argument("--round-budget-s", type=float, default=600.0)
    parser.add_argument("--pull-timeout-s", type=float, default=120.0)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--dry-run", action="store_true", help="Print the commands only.")
    parser.add_argument("--reanalyse", action="store_true",
                        help="Run nothing: analyse the saved arms again for --target.")  # fmt: skip
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in arms:
        if arm not in ARMS:
            raise SystemExit(f"unknown arm {arm!r}; arms are {', '.join(ARMS)}")
    store = args.output / "hetero.json"
    results = saved_arms(store, settings(args))
    if args.reanalyse:
        arms, results = [], reanalyse(results, args)
    for arm in arms:
        planned = slowest_of(results.get("auto")) or "<the auto arm's slowest tier>"
        argv = command(args, arm, planned if args.dry_run else slowest_of(results.get("auto")))
        print("$ " + " ".join(argv), flush=True)
        if args.dry_run:
            continue
        load_before = round(os.getloadavg()[0], 2)
        started = time.time()
        code = subprocess.run(argv, stdout=subprocess.DEVNULL, check=False).returncode
        result = analyse(args.output / arm, args.nodes, started, args.target, time.time() - started, code)
        result.update(started_unix=started, commit=commit(),
                      started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                      load_before=load_before, load_after=round(os.getloadavg()[0], 2))  # fmt: skip
        results[arm] = result
        print(f"{arm}: exit {code}, {result['wall_s']:.0f} s, tiers {result['tiers']}", flush=True)
        save(store, args, results)
    if args.dry_run or not results:
        return
    if args.reanalyse:
        save(store, args, results)
    ordered = {arm: results[arm] for arm in ARMS if arm in results}
    text = markdown(ordered, args)
    (args.output / "hetero.md").write_text(text)
    plot(ordered, args.output / "hetero.png", args.target)
    print(text)


if __name__ == "__main__":
    main()
