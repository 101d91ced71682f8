"""Same simulation on CPU and on CUDA: equal up to floating-point noise (issue 4's device check).

Runs one small ``edge-node simulate`` configuration three times in this process, side by side:

* ``cpu``: the reference run (torch's default thread count);
* ``cpu-1t``: the same on one CPU thread -- reductions summed in another order, i.e. pure
  floating-point noise; its distance from ``cpu`` is the *noise floor*;
* ``cuda-tf32off`` and ``cuda-tf32default`` (or ``test-cpu`` with ``--device-b cpu``, a CPU-only
  self-test): the runs under test.

It then compares each run with ``cpu``:

* must be equal exactly (no floating point involved): the topology, bytes received/sent per node,
  FLOPs, per-tensor active counts (mask density) -- any difference is a bug, not noise;
* may differ by noise: per-client accuracies (before and after local training, every round), final
  weights (relative L2 distance per client) and final masks (fraction of positions that differ,
  since magnitude pruning can flip near-ties).

It prints both distances and their ratio (device difference / noise floor), writes everything as
JSON and exits 0 when the device run is within the tolerances below, 1 when not, 2 when the device
cannot be used. Usage on the GPU machine (see ``bench/gpu_session.sh``)::

    python bench/cuda_vs_cpu.py --dataset cifar10 --data-dir .device/cifar10-jpeg.tar.gz --json out.json

By default two CUDA runs are made: TF32 off (cuDNN convolutions and matmuls in full fp32) and torch's
default (TF32 convolutions: what ``edge-node simulate --device cuda`` gets); both must pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edge_node.data import load_dataset
from edge_node.errors import EdgeNodeError
from edge_node.records import per_node, read_records
from edge_node.sim.checkpoint import CHECKPOINT_NAME, load_checkpoint
from edge_node.sim.config import SimConfig
from edge_node.sim.runner import run_simulation

# Tolerances of "the same up to floating-point noise" for a few rounds of a few clients.
MAX_ACC_MEAN_DIFF_POINTS = 1.0  # |mean accuracy (cpu) - mean accuracy (device)|, any round, before or after
MAX_WEIGHT_REL_DIFF = 0.05  # ||w_cpu - w_dev|| / ||w_cpu||, worst client
MAX_MASK_DISAGREEMENT = 0.005  # fraction of positions whose mask bit differs, worst client
EXACT_KEYS = ("paper_comm_mb_mean", "flops_per_client_mean", "density_mean")
EXACT_NODE_KEYS = ("bytes_in", "bytes_out")  # of every client's node entry


@dataclass
class RunResult:
    label: str
    records: list[dict[str, Any]]
    weights: list[dict[str, torch.Tensor]]
    masks: list[dict[str, torch.Tensor]]
    wall_s: float


def run_once(config: SimConfig, dataset: Any, label: str, device: str, threads: int | None, root: Path) -> RunResult:
    """One simulation into ``root/label``; its per-round records and final state on the CPU."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        cfg = SimConfig(**{**config.__dict__, "device": device, "output": root / label, "progress": False})
        started = time.perf_counter()
        out = run_simulation(cfg, dataset)
        wall = time.perf_counter() - started
    finally:
        torch.set_num_threads(previous)
    records = read_records(out)
    state = load_checkpoint(out / CHECKPOINT_NAME, torch.device("cpu"))
    return RunResult(label, records, state["weights"], state["train_masks"], wall)


def compare(ref: RunResult, other: RunResult) -> dict[str, Any]:
    """Distances between two runs of the same configuration (see the module docstring)."""
    if len(ref.records) != len(other.records):
        raise ValueError(f"{ref.label} has {len(ref.records)} rounds, {other.label} {len(other.records)}")
    exact_mismatches = [
        f"round {a['round']}: {key}"
        for a, b in zip(ref.records, other.records, strict=True)
        for key in EXACT_KEYS
        if a[key] != b[key]
    ] + [
        f"round {a['round']}: nodes' {key}"
        for a, b in zip(ref.records, other.records, strict=True)
        for key in EXACT_NODE_KEYS
        if per_node(a, key) != per_node(b, key)
    ]
    acc_mean_diff = max(
        abs(a[key] - b[key]) * 100
        for a, b in zip(ref.records, other.records, strict=True)
        for key in ("acc_before_mean", "acc_after_mean")
    )
    acc_client_diff = max(
        abs(x - y) * 100
        for a, b in zip(ref.records, other.records, strict=True)
        for key in ("acc_before", "acc_after")
        for x, y in zip(per_node(a, key), per_node(b, key), strict=True)
    )
    weight_rel = []
    mask_diff = []
    mask_count_mismatches = 0
    for w_ref, w_oth, m_ref, m_oth in zip(ref.weights, other.weights, ref.masks, other.masks, strict=True):
        num = sum(float((w_ref[k].double() - w_oth[k].double()).pow(2).sum()) for k in w_ref)
        den = sum(float(w_ref[k].double().pow(2).sum()) for k in w_ref)
        weight_rel.append((num**0.5) / den**0.5 if den > 0 else float(num > 0))
        differing = sum(int((m_ref[k] != m_oth[k]).sum()) for k in m_ref)
        mask_diff.append(differing / sum(m.numel() for m in m_ref.values()))
        mask_count_mismatches += sum(int(m_ref[k].sum()) != int(m_oth[k].sum()) for k in m_ref)
    return {
        "exact_mismatches": exact_mismatches,
        "mask_count_mismatches": mask_count_mismatches,
        "acc_mean_max_diff_points": acc_mean_diff,
        "acc_client_max_diff_points": acc_client_diff,
        "weight_rel_diff_max": max(weight_rel),
        "mask_disagreement_max": max(mask_diff),
    }


def failures(diff: dict[str, Any]) -> list[str]:
    """Why ``diff`` is more than floating-point noise (empty when it is within the tolerances)."""
    out = []
    if diff["exact_mismatches"]:
        out.append(f"values that must be equal differ: {', '.join(diff['exact_mismatches'][:5])}")
    if diff["mask_count_mismatches"]:
        out.append(f"{diff['mask_count_mismatches']} tensors changed their active count")
    if diff["acc_mean_max_diff_points"] > MAX_ACC_MEAN_DIFF_POINTS:
        out.append(f"mean accuracy differs by {diff['acc_mean_max_diff_points']:.2f} points")
    if diff["weight_rel_diff_max"] > MAX_WEIGHT_REL_DIFF:
        out.append(f"weights differ by {diff['weight_rel_diff_max']:.3g} (relative L2)")
    if diff["mask_disagreement_max"] > MAX_MASK_DISAGREEMENT:
        out.append(f"{100 * diff['mask_disagreement_max']:.3f} % of mask positions differ")
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"  # "-": the floor is 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="demo", help="demo (built in) or cifar10 / cifar100 / tiny-imagenet")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--neighbours", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples-per-client", type=int, default=None, help="dir quota (default: all / clients)")
    parser.add_argument("--regrow", default="random", choices=("random", "gradient"))
    parser.add_argument("--device-b", default="cuda", choices=("cuda", "cpu"), help="the device under test")
    parser.add_argument("--threads-b", type=int, default=None, help="torch threads of the run under test")
    parser.add_argument(
        "--tf32", nargs="+", default=["off", "default"], choices=("off", "default"),
        help="CUDA runs to make: TF32 off (pure fp32) and/or torch's default (TF32 convolutions)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    args = parser.parse_args(argv)

    if args.device_b == "cuda" and not torch.cuda.is_available():
        print(f"cuda_vs_cpu: torch {torch.__version__} sees no CUDA device; run it on a GPU machine", file=sys.stderr)
        return 2
    try:
        config = SimConfig(
            dataset=args.dataset, data_dir=args.data_dir, model=args.model, clients=args.clients,
            neighbours=args.neighbours, rounds=args.rounds, planned_rounds=max(args.rounds, 30), epochs=args.epochs,
            samples_per_client=args.samples_per_client, regrow=args.regrow, energy_backend="estimate",
        )  # fmt: skip
        dataset = load_dataset(args.dataset, args.data_dir)
    except EdgeNodeError as exc:
        print(f"cuda_vs_cpu: {exc}", file=sys.stderr)
        return 2

    device_name = torch.cuda.get_device_name() if args.device_b == "cuda" else "cpu"
    variants = [f"cuda-tf32{mode}" for mode in dict.fromkeys(args.tf32)] if args.device_b == "cuda" else ["test-cpu"]
    tf32_defaults = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with tempfile.TemporaryDirectory(prefix="cuda-vs-cpu-") as tmp:
        root = args.keep or Path(tmp)
        ref = run_once(config, dataset, "cpu", "cpu", None, root)
        floor_run = run_once(config, dataset, "cpu-1t", "cpu", 1, root)
        tested = []
        for label in variants:
            off = label.endswith("tf32off")
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = (
                (False, False) if off else tf32_defaults
            )
            tested.append(run_once(config, dataset, label, args.device_b, args.threads_b, root))
    floor = compare(ref, floor_run)
    diffs = {run.label: compare(ref, run) for run in tested}
    problems = {label: failures(diff) for label, diff in diffs.items()}

    print(
        f"{args.dataset}/{args.model}: {args.clients} clients, {args.rounds} rounds x {args.epochs} epochs, "
        f"regrow={args.regrow}; device under test: {device_name}; torch {torch.__version__}"
    )
    walls = {run.label: run.wall_s for run in (ref, floor_run, *tested)}
    print("wall: " + ", ".join(f"{label} {wall:.1f} s" for label, wall in walls.items()))
    header = f"{'distance from cpu':<30}{'cpu-1t (floor)':>16}"
    for run in tested:
        header += f"{run.label:>18}{'/floor':>10}"
    print(header + f"{'tolerance':>11}")
    for key, tol in (
        ("acc_mean_max_diff_points", MAX_ACC_MEAN_DIFF_POINTS),
        ("acc_client_max_diff_points", None),
        ("weight_rel_diff_max", MAX_WEIGHT_REL_DIFF),
        ("mask_disagreement_max", MAX_MASK_DISAGREEMENT),
    ):
        row = f"{key:<30}{floor[key]:>16.4g}"
        for run in tested:
            value = diffs[run.label][key]
            row += f"{value:>18.4g}{_fmt_ratio(_ratio(value, floor[key])):>10}"
        print(row + f"{'' if tol is None else f'{tol:g}':>11}")
    accs = {run.label: [round(100 * r["acc_after_mean"], 2) for r in run.records] for run in (ref, *tested)}
    print("mean accuracy after local training per round: " + "; ".join(f"{k} {v}" for k, v in accs.items()))
    for label, found in problems.items():
        diff = diffs[label]
        exact = "equal" if not diff["exact_mismatches"] and not diff["mask_count_mismatches"] else "NOT equal"
        verdict = "same up to floating-point noise" if not found else "DIFFERENT: " + "; ".join(found)
        print(f"verdict {label}: exact values {exact}; {verdict}")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "config": config.to_json(),
            "device_name": device_name,
            "torch": torch.__version__,
            "wall_s": walls,
            "acc_after_mean": accs,
            "noise_floor": floor,
            "difference": diffs,
            "tolerances": {
                "acc_mean_max_diff_points": MAX_ACC_MEAN_DIFF_POINTS,
                "weight_rel_diff_max": MAX_WEIGHT_REL_DIFF,
                "mask_disagreement_max": MAX_MASK_DISAGREEMENT,
            },
            "failures": problems,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 1 if any(problems.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
