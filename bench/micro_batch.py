"""What training a batch in slices (``micro_batch``) costs and saves: one process per setting.

Each setting runs in a fresh process (peak RSS is per process) doing ``--steps`` masked SGD steps of
``--batch-size`` on random 32x32 images, whole batch vs slices; it prints seconds per step and the
peak RSS over the steps, and their ratios to the whole batch, measured side by side in this run
(settings interleaved over ``--repeats`` so a busy machine slows each alike).

    .venv/bin/python bench/micro_batch.py                       # cnn, batch 128, slices 0 (whole), 32, 16
    .venv/bin/python bench/micro_batch.py --model resnet18 --steps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time, resource, torch
from edge_node.algorithm import SGDConfig, init_masks, read_weights, train_masked
from edge_node.models import build_model
model_name = sys.argv[1]
batch, micro, steps, threads = (int(a) for a in sys.argv[2:6])
torch.set_num_threads(threads)
model = build_model(model_name, seed=0)
masks = init_masks(read_weights(model), 0.5, torch.Generator().manual_seed(0))
g = torch.Generator().manual_seed(0)
batches = [
    (torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(steps + 1)
]
sgd = SGDConfig(lr=0.01, micro_batch=micro)
train_masked(model, masks, batches[:1], sgd)  # warm-up: allocator, kernels
t0 = time.perf_counter()
train_masked(model, masks, batches[1:], sgd)
dt = (time.perf_counter() - t0) / steps
print(json.dumps({"s_per_step": dt, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--micro", type=int, nargs="+", default=[0, 32, 16], help="slice sizes; 0: the whole batch")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    runs: dict[int, list[dict]] = {m: [] for m in args.micro}
    for _ in range(args.repeats):
        for micro in args.micro:
            argv = [
                sys.executable,
                "-c",
                CHILD,
                args.model,
                str(args.batch_size),
                str(micro),
                str(args.steps),
                str(args.threads),
            ]
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            runs[micro].append(json.loads(out.strip().splitlines()[-1]))
    rows = {}
    for micro, samples in runs.items():
        rows[micro] = {
            "s_per_step": statistics.median(s["s_per_step"] for s in samples),
            "peak_rss_mb": statistics.median(s["peak_rss_mb"] for s in samples),
        }
    base = rows[args.micro[0]]
    print(
        f"{args.model}, batch {args.batch_size}, {args.steps} steps, {args.threads} thread(s), "
        f"median of {args.repeats} runs"
    )
    print(f"{'slice':>8} {'s/step':>8} {'x time':>7} {'peak RSS MB':>12} {'x RSS':>6}")
    for micro, row in rows.items():
        print(
            f"{micro or 'whole':>8} {row['s_per_step']:8.3f} {row['s_per_step'] / base['s_per_step']:7.2f} "
            f"{row['peak_rss_mb']:12.0f} {row['peak_rss_mb'] / base['peak_rss_mb']:6.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
