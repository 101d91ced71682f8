"""What a tier buys in compute: one training step at each tier, width mode against mask mode, against tier 1.0.

Mask mode (today's default) trains the full model with a DisPFL mask at the tier's density: the masked
weights are still multiplied by dense kernels. Width mode trains the tier's narrow model (its width chosen
from dense FLOPs, edge_node.algorithm.width.choose_width) on all-true masks: the kernels are smaller. Each step
is edge-node's own (``train_masked``, the node's SGD settings), on the same batches; the settings are timed in
alternating blocks (tier by tier, round robin) over ``--repeats``, so a change of machine load falls on all of
them alike. Prints the median seconds per step and the ratio to tier 1.0 of the same mode.

``--cpu C`` runs the timing inside a cgroup limited to C CPUs (the pi4 profile's quota is 0.2): the process
re-runs itself in the group (root and the cgroup cpu controller needed), side by side with an unlimited
run when ``--cpu`` lists ``none`` too.

    .venv/bin/python bench/width_step.py                                   # cnn and resnet18, 1 thread, no quota
    .venv/bin/python bench/width_step.py --cpu none,0.2 --models cnn,resnet18
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.algorithm.flops import weight_positions
from edge_node.algorithm.masks import init_masks
from edge_node.algorithm.training import train_masked
from edge_node.algorithm.width import choose_width
from edge_node.models import build_model, build_width_model
from edge_node.protocol import TIER_DENSITIES


def _shapes_at(name: str):  # type: ignore[no-untyped-def]
    def shapes(width: float) -> dict[str, tuple[int, ...]]:
        with torch.device("meta"):
            model = build_model(name, 10, width=width)
        return {n: tuple(p.shape) for n, p in model.named_parameters()}

    return shapes


def _settings(name: str) -> list[tuple[str, float, torch.nn.Module, dict[str, torch.Tensor], float]]:
    """(mode, tier, model, masks, dense FLOP share) for every tier of both modes."""
    full = build_model(name, 10, seed=0)
    positions = weight_positions(full, (3, 32, 32))
    assert positions is not None
    out = []
    for tier in TIER_DENSITIES:
        choice = choose_width(_shapes_at(name), positions, tier)
        narrow = build_width_model(name, 10, (3, 32, 32), choice.width)
        dense = {n: torch.ones_like(p, dtype=torch.bool) for n, p in narrow.named_parameters()}
        out.append(("width", tier, narrow, dense, choice.flop_share))
        masked = build_model(name, 10, seed=0)
        weights = {n: p.detach() for n, p in masked.named_parameters()}
        masks = init_masks(weights, tier, torch.Generator().manual_seed(0))
        out.append(("mask", tier, masked, masks, 1.0))
    return out


def run(models: list[str], batch_size: int, steps: int, repeats: int) -> list[dict[str, object]]:
    sgd = DisPFLParams().sgd(0)
    generator = torch.Generator().manual_seed(0)
    images = [torch.randn(batch_size, 3, 32, 32, generator=generator) for _ in range(steps)]
    batches = [(x, torch.randint(0, 10, (batch_size,), generator=generator)) for x in images]
    rows = []
    for name in models:
        settings = _settings(name)
        times: dict[int, list[float]] = {i: [] for i in range(len(settings))}
        for _mode, _tier, model, masks, _share in settings:
            train_masked(model, masks, batches[:1], sgd)  # warm-up
        for _ in range(repeats):
            for i, (_mode, _tier, model, masks, _share) in enumerate(settings):
                for batch in batches:
                    began = time.perf_counter()
                    train_masked(model, masks, [batch], sgd)
                    times[i].append(time.perf_counter() - began)
        for i, (mode, tier, _model, _masks, share) in enumerate(settings):
            rows.append({"model": name, "mode": mode, "tier": tier, "flop_share": round(share, 4),
                         "step_s": statistics.median(times[i])})  # fmt: skip
    for row in rows:
        dense = next(r for r in rows if r["model"] == row["model"] and r["mode"] == row["mode"] and r["tier"] == 1.0)
        row["ratio"] = float(row["step_s"]) / float(dense["step_s"])  # type: ignore[arg-type]
    return rows


def _in_group(cpu: float, argv: list[str]) -> list[dict[str, object]]:
    """This script's rows, run in a cgroup limited to ``cpu`` CPUs."""
    from edge_node.fleet.cgroups import check_available, device_group

    hierarchy = check_available()
    with device_group(hierarchy, "width-step", kind="bench", cpu=cpu, memory_bytes=None) as group:
        done = subprocess.run(group.wrap([sys.executable, __file__, *argv, "--inner"]), capture_output=True, text=True,
                              check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="steps per setting per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpu", default="none", help="comma-separated CPU quotas to run under; 'none': no quota")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = [m for m in args.models.split(",") if m]
    if args.inner:
        print(json.dumps(run(models, args.batch_size, args.steps, args.repeats)))
        return 0
    inner = ["--models", args.models, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
             "--repeats", str(args.repeats), "--threads", str(args.threads)]  # fmt: skip
    print(f"# threads {args.threads}, batch {args.batch_size}, {args.steps} steps x {args.repeats} repeats per setting")
    print(f"{'quota':>6} {'model':>9} {'mode':>5} {'tier':>4} {'FLOPs':>6} {'step s':>8} {'x tier 1.0':>10}")
    for quota in args.cpu.split(","):
        here = quota == "none"
        rows = run(models, args.batch_size, args.steps, args.repeats) if here else _in_group(float(quota), inner)
        for row in rows:
            print(f"{quota:>6} {row['model']:>9} {row['mode']:>5} {row['tier']:>4} {row['flop_share']:>6.3f} "
                  f"{row['step_s']:>8.4f} {row['ratio']:>10.2f}")  # fmt: skip
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
