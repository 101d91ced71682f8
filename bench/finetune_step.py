"""What training only the last blocks saves: a training step with every parameter trainable against one with
``--trainable`` globs (the rest frozen: no gradient, no backward pass below the lowest trainable layer).

The same model, weights and batches in one process, settings interleaved over ``--repeats``; each step is
edge-node's own (``train_masked`` on all-true masks, the node's SGD settings), the model frozen by
``edge_node.pretrained.prepare_start`` as ``--trainable`` does. Prints seconds per step per setting, the
ratio to all-trainable, and the bytes a node publishes per round at ``--density`` (travelling tensors only).

    .venv/bin/python bench/finetune_step.py                                      # resnet18 and the example
    .venv/bin/python bench/finetune_step.py --models resnet18 --threads 1 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "mobilenet_finetune" / "src"))

from edge_node.algorithm.dispfl import DisPFLParams  # noqa: E402
from edge_node.algorithm.training import train_masked  # noqa: E402
from edge_node.models import arch_name, build_checked_model  # noqa: E402
from edge_node.pretrained import prepare_start, wire_spec  # noqa: E402
from edge_node.wire import encoded_model_size  # noqa: E402

SETTINGS = {
    "resnet18": ("resnet18", (("all", ()), ("layer4+linear", ("layer4.*", "linear.*")), ("linear", ("linear.*",)))),
    "mobilenet_v2": ("mobilenet_finetune:mobilenet_v2", (
        ("all", ()), ("features.16-18+classifier", ("features.16.*", "features.17.*", "features.18.*",
                                                    "classifier.*")),
        ("features.17-18+classifier", ("features.17.*", "features.18.*", "classifier.*")),
        ("classifier", ("classifier.*",)))),
}  # fmt: skip


def step_seconds(
    model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], params: DisPFLParams
) -> float:
    """Median seconds of one of edge-node's training steps over ``batches`` (one warm-up step first)."""
    masks = {n: torch.ones_like(p, dtype=torch.bool) for n, p in model.named_parameters()}
    sgd = params.sgd(0)
    train_masked(model, masks, batches[:1], sgd)
    times = []
    for batch in batches:
        began = time.perf_counter()
        train_masked(model, masks, [batch], sgd)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per setting and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--density", type=float, default=0.5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    params = DisPFLParams(micro_batch=0)
    g = torch.Generator().manual_seed(0)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key in args.models.split(","):
        name, settings = SETTINGS[key]
        batches = [(torch.randn(args.batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (args.batch_size,),
                    generator=g)) for _ in range(args.steps)]  # fmt: skip
        models, sizes = {}, {}
        for label, globs in settings:
            model = build_checked_model(name, 10, (3, 32, 32), seed=0)
            started = prepare_start(model, None, globs, model_name=name)
            spec = wire_spec(arch_name(name), 10, model, started)
            nnz = {n: round(args.density * spec.numel(n)) for n in spec.shapes}
            models[label], sizes[label] = model, encoded_model_size(spec, nnz)
        seconds: dict[str, list[float]] = {label: [] for label in models}
        for _ in range(args.repeats):  # interleaved: load changes hit every setting alike
            for label, model in models.items():
                seconds[label].append(step_seconds(model, batches, params))
        base = statistics.median(seconds["all"])
        out[key] = {}
        for label in models:
            s = statistics.median(seconds[label])
            out[key][label] = {"step_s": s, "ratio": s / base, "published_bytes": sizes[label]}
            print(f"{key:13s} trainable {label:28s} {s:7.3f} s/step ({min(seconds[label]):.3f}-"
                  f"{max(seconds[label]):.3f})  {s / base:5.2f}x  publishes {sizes[label] / 1e6:6.2f} MB at "
                  f"density {args.density:g}", flush=True)  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
