"""What the cnn's pooling costs on a CPU: the model as built against the paper's layer order with PyTorch's pool.

The baseline is the ``cnn`` as the paper writes it (ReLU, then ``torch.max_pool2d``, which on a CPU runs the
scalar NCHW kernel); the model as built pools first, by the channels-last kernel (``edge_node/pooling.py``).
Both run on the same weights and batches in one process, settings interleaved over ``--repeats``; the script
prints seconds per training step (loss and gradients) and per evaluation forward, their ratios, and checks
that loss and every gradient are the same bits (exit 1 if not).

    .venv/bin/python bench/pool_step.py                           # batches of 128 and 16, 2 threads
    .venv/bin/python bench/pool_step.py --batch-sizes 16 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch

from edge_node.models import CNN

Forward = Callable[[torch.Tensor], torch.Tensor]
BASELINE = "paper order, torch.max_pool2d"
BUILT = "as built"


def paper_order(model: CNN) -> Forward:
    """The cnn's forward with ReLU before each pool and torch's own pool: the baseline."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(model.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(model.conv2(x)), 2)
        x = torch.relu(model.fc1(torch.flatten(x, 1)))
        return model.fc3(torch.relu(model.fc2(x)))

    return forward


def seconds_per_call(call: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


def measure(batch: int, repeats: int, images_per_timing: int) -> dict:
    torch.manual_seed(0)
    model = CNN(10)
    params = list(model.parameters())
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, 32, 32, generator=generator)
    y = torch.randint(0, 10, (batch,), generator=generator)
    forwards: dict[str, Forward] = {BASELINE: paper_order(model), BUILT: model}

    def step(forward: Forward) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        loss = torch.nn.functional.cross_entropy(forward(x), y)
        return loss, torch.autograd.grad(loss, params)

    want_loss, want_grads = step(forwards[BASELINE])
    loss, grads = step(forwards[BUILT])
    equal = torch.equal(loss, want_loss) and all(torch.equal(g, w) for g, w in zip(grads, want_grads, strict=True))
    calls = max(3, images_per_timing // batch)
    train: dict[str, list[float]] = {name: [] for name in forwards}
    evaluate: dict[str, list[float]] = {name: [] for name in forwards}
    for _ in range(repeats):
        for name, forward in forwards.items():
            train[name].append(seconds_per_call(lambda f=forward: step(f), calls))
            with torch.no_grad():
                evaluate[name].append(seconds_per_call(lambda f=forward: f(x), calls))
    return {
        "batch": batch,
        "bitwise_equal": equal,
        "train_s": {name: statistics.median(v) for name, v in train.items()},
        "eval_s": {name: statistics.median(v) for name, v in evaluate.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=1280, help="images per timing (calls = images / batch)")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"pool_step: cnn, {args.threads} thread(s), median of {args.repeats} interleaved timings, "
          f"torch {torch.__version__}")  # fmt: skip
    print(f"{'batch':>5}  {'step, paper order':>17}  {'step, as built':>14}  {'x':>5}  "
          f"{'eval, paper':>11}  {'eval, built':>11}  {'x':>5}  bitwise")  # fmt: skip
    results = []
    for batch in args.batch_sizes:
        r = measure(batch, args.repeats, args.images)
        results.append(r)
        base_t, built_t = r["train_s"][BASELINE], r["train_s"][BUILT]
        base_e, built_e = r["eval_s"][BASELINE], r["eval_s"][BUILT]
        print(f"{batch:>5}  {base_t * 1e3:>14.2f} ms  {built_t * 1e3:>11.2f} ms  {base_t / built_t:>4.2f}x  "
              f"{base_e * 1e3:>8.2f} ms  {built_e * 1e3:>8.2f} ms  {base_e / built_e:>4.2f}x  "
              f"{'equal' if r['bitwise_equal'] else 'DIFFERENT'}")  # fmt: skip
    print("x: the paper order's time over the model's as built (above 1: the model as built is faster)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"threads": args.threads, "torch": torch.__version__, "results": results}, handle, indent=2)
    return 0 if all(r["bitwise_equal"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
