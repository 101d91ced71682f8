"""What a training step costs on this device without the simulation around it: the ceiling a round can reach.

Per model (CIFAR-sized input, batch ``--batch-size``, masks of density 0.5), on batches already on the device:

- ``per-client``: images/s of ``train_masked`` (the simulation's step with ``--micro-batch 0``: whole batch,
  masks, clipping, weight decay), one client's batches after another: what a round of the simulation does
  with its Python around it taken away;
- ``bf16`` and ``bf16+cl``: the same step under bf16 autocast, and with channels_last too: not what the
  simulation does (it trains in float32), what a precision option would buy;
- ``compiled`` and ``compiled+graphs``: the per-client step with the model under ``torch.compile`` (inductor;
  ``+graphs``: mode ``reduce-overhead``, CUDA graphs, on CUDA only), the same ``train_masked`` around it; its
  compile time (the warm-up calls) is printed, and its weights after one step are checked against eager's.

(A ``vmap Cx`` row, C clients stepped at once, went with the simulation's ``--batch-clients``, removed when it
did not beat ``--cuda-graphs`` on an H100: docs/RESULTS.md.)

Run on the GPU machine (the ratios against ``per-client`` are measured in the same run)::

    python3 bench/train_ceiling.py --device cuda --json runs/train_ceiling.json
    .venv/bin/python bench/train_ceiling.py --device cpu --steps 3     # a smoke run here
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _provenance import commit, machine  # noqa: E402

from edge_node.algorithm.training import SGDConfig, train_masked  # noqa: E402
from edge_node.models import build_model  # noqa: E402

SGD = SGDConfig(lr=0.1)
BATCHES = 4  # distinct batches the timed steps cycle through


def random_masks(model: nn.Module, density: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A random mask of ``density`` per parameter (bool), on the model's device."""
    return {n: (torch.rand(p.shape, generator=generator) < density).to(p.device) for n, p in model.named_parameters()}


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(device: str, steps: int, run: Callable[[int], None]) -> float:
    """Seconds for ``steps`` calls of ``run`` after two warm-up calls, the device synchronised around them."""
    run(2)
    synchronize(device)
    started = time.perf_counter()
    run(steps)
    synchronize(device)
    return time.perf_counter() - started


def measure(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    device, batch = args.device, args.batch_size
    generator = torch.Generator().manual_seed(0)
    model = build_model(name, 10, seed=0).to(device)
    masks = random_masks(model, 0.5, generator)
    x = torch.randn(BATCHES, batch, 3, 32, 32, generator=generator).to(device)
    y = torch.randint(0, 10, (BATCHES, batch), generator=generator).to(device)
    rows: list[dict[str, Any]] = []

    def single(autocast: bool, channels_last: bool) -> Callable[[int], None]:
        net = model.to(memory_format=torch.channels_last) if channels_last else model
        xs = x.contiguous(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x
        context = torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()

        def run(steps: int) -> None:
            with context:
                train_masked(net, masks, ((xs[k % len(xs)], y[k % len(xs)]) for k in range(steps)), SGD)

        return run

    for label, autocast, channels_last in (("per-client", False, False), ("bf16", True, False),
                                           ("bf16+cl", True, True)):  # fmt: skip
        seconds = timed(device, args.steps, single(autocast, channels_last))
        rows.append({"model": name, "setting": label, "clients": 1, "images_per_s": args.steps * batch / seconds})
        model = model.to(memory_format=torch.contiguous_format)

    for mode in ("default", "reduce-overhead") if device == "cuda" else ("default",):
        if args.no_compile:
            break
        try:
            rows.append(measure_compiled(name, model, masks, x, y, mode, args))
        except Exception as exc:  # a compiler missing on this machine: the row says why, the others still run
            label = "compiled" if mode == "default" else "compiled+graphs"
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            rows.append({"model": name, "setting": label, "clients": 1, "images_per_s": None, "error": error})
    return rows


def measure_compiled(
    name: str,
    model: nn.Module,
    masks: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    mode: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The per-client step with ``model`` under ``torch.compile(mode=mode)``, checked against one eager step."""
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    compiled = copy.deepcopy(model)
    compiled.compile(mode=mode)  # in place: the parameters keep their names (train_masked reads them by name)
    began = time.perf_counter()
    train_masked(compiled, masks, [(x[0], y[0])], SGD)  # the first call compiles
    synchronize(args.device)
    compile_s = time.perf_counter() - began
    train_masked(model, masks, [(x[0], y[0])], SGD)
    worst = max(float((p.detach() - dict(compiled.named_parameters())[n].detach()).abs().max())
                for n, p in model.named_parameters())  # fmt: skip
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])

    def run(steps: int) -> None:
        train_masked(compiled, masks, ((x[k % len(x)], y[k % len(x)]) for k in range(steps)), SGD)

    seconds = timed(args.device, args.steps, run)
    label = "compiled" if mode == "default" else "compiled+graphs"
    return {"model": name, "setting": label, "clients": 1, "images_per_s": args.steps * args.batch_size / seconds,
            "max_abs_diff_vs_single": worst, "compile_s": compile_s}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", nargs="+", default=["cnn", "resnet18"])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per setting")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [row for name in args.models for row in measure(name, args)]
    print(f"train_ceiling: batch {args.batch_size}, {args.device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if args.device == 'cuda' else ''}, torch {torch.__version__}; "
          f"commit {commit()}; {machine()}")  # fmt: skip
    print(f"{'model':<9} {'setting':<15} {'img/s':>9} {'x':>6}  check")
    base: dict[str, float] = {}
    for row in rows:
        base.setdefault(row["model"], row["images_per_s"])
        if row["images_per_s"] is None:
            why = row.get("error", "out of device memory")
            print(f"{row['model']:<9} {row['setting']:<15} {'-':>9} {'-':>6}  {why}")
            continue
        check = f"max |w - single| {row['max_abs_diff_vs_single']:.2e}" if "max_abs_diff_vs_single" in row else ""
        check += f", compiled in {row['compile_s']:.1f} s" if "compile_s" in row else ""
        print(f"{row['model']:<9} {row['setting']:<15} {row['images_per_s']:>9.0f} "
              f"{row['images_per_s'] / base[row['model']]:>6.2f}  {check}")  # fmt: skip
    print("x: images/s over the model's per-client row (train_masked, whole batch, float32), same run")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "commit": commit()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
