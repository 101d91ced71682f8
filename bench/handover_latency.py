"""What the handover costs and gives: inference latency of the handed-over model in onnxruntime against torch
eager, and the time from a round's end to the new model being readable by an application.

A model (default cnn, random weights at density 1) is handed over as a node does it
(``edge_node.node.handover.Handover.after_round``: export, score on ``--test-samples`` local test images in
onnxruntime, publish the pair behind the pointer); the seconds of that call are the time from a round's end
to the new model readable, under ``latest`` and under ``best`` (which also re-scores the handed-over model).
Then ``--calls`` single-sample predictions through ``load_handover`` (onnxruntime, the raw [0, 1] input, the
normalisation inside the graph) and through the torch module (normalisation and model, eager,
``torch.no_grad``), in alternating blocks of ``BLOCK`` calls (call by call, torch's pool threads still
spinning after its call took the cores from onnxruntime's next one: 0.71 ms at p50 against 0.27 ms alone),
on ``--threads`` threads each: p50 and p99 in milliseconds and their ratio.
With ``--beside-training``, the onnxruntime calls are timed again while an ``edge-node start`` node trains on
the same machine (the demo set, client 0 of 4, the daemon's own epochs and batch, the thread policy, no peers:
it pauses 1 s between rounds of about 10 s), after its first round: how much a training node slows the
application, against as many calls in a row on the idle machine just before (no torch call between them).

    .venv/bin/python bench/handover_latency.py                    # cnn, 2 threads, 1000 calls
    .venv/bin/python bench/handover_latency.py --model resnet18 --calls 200 --json out.json
    .venv/bin/python bench/handover_latency.py --beside-training
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _provenance import commit, machine  # noqa: E402

from edge_node.algorithm.tasks import CLASSIFICATION  # noqa: E402
from edge_node.data.batches import ClientData, ImagePool  # noqa: E402
from edge_node.handover_model import load_handover  # noqa: E402
from edge_node.models import build_model  # noqa: E402
from edge_node.node.export import with_weights  # noqa: E402
from edge_node.node.handover import OUTPUT_NAME, Handover, RawInput, RawSpec  # noqa: E402

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # CIFAR-10's


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


TRAINING_NODE = ["--fleet", "bench", "--num-clients", "4", "--client-index", "0", "--capacity", "1.0",
                 "--discovery", "static", "--peers", "127.0.0.1:1", "--insecure", "--no-export-onnx",
                 "--energy-backend", "estimate", "--listen", "127.0.0.1:0"]  # fmt: skip


BLOCK = 100


def _onnx_latencies(served: object, sample: np.ndarray, calls: int) -> list[float]:
    """Milliseconds of ``calls`` single-sample predictions."""
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        served.predict(sample)  # type: ignore[attr-defined]
        out.append(1000 * (time.perf_counter() - started))
    return out


def _beside_training(served: object, sample: np.ndarray, calls: int, scratch: Path) -> list[float]:
    """The latencies while a node trains beside them (started here, stopped after)."""
    state = scratch / "node"
    cmd = [str(Path(sys.executable).with_name("edge-node")), "start", *TRAINING_NODE, "--state-dir", str(state)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    node = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        records = state / "rounds.jsonl"
        while not (records.exists() and records.read_text().strip()):  # past start-up: rounds follow each other
            if node.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the training node ended or did not finish a round in 600 s")
            time.sleep(0.5)
        return _onnx_latencies(served, sample, calls)
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1000, help="single-sample predictions per runtime")
    parser.add_argument("--test-samples", type=int, default=200, help="the node's local test set, scored per round")
    parser.add_argument("--rounds", type=int, default=5, help="handovers timed per policy")
    parser.add_argument("--beside-training", action="store_true", help="also time predictions beside a training node")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build_model(args.model, 10, seed=0).eval()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    images = torch.randint(0, 256, (args.test_samples, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator())
    labels = torch.randint(0, 10, (args.test_samples,))
    data = ClientData.from_indices(ImagePool(images, labels, images, labels, MEAN, STD, 10),
                                   np.arange(args.test_samples), np.arange(args.test_samples))  # fmt: skip
    about = {"node_id": "bench", "fleet": "bench", "arch_id": args.model, "class_names": None,
             "output": {"name": OUTPUT_NAME, "shape": ["batch", 10]}}  # fmt: skip
    figures: dict[str, object] = {"model": args.model, "threads": args.threads, "test_samples": args.test_samples}
    with tempfile.TemporaryDirectory(prefix="handover-bench-") as scratch:
        for mode in ("latest", "best"):
            state = Path(scratch) / mode
            node = Handover(state, model, RawSpec((3, 32, 32), MEAN, STD), CLASSIFICATION, about, mode=mode)
            node.after_round(0, weights, {}, data)  # untimed: the exporter's first call loads its modules
            seconds = []
            for r in range(1, args.rounds + 1):
                started = time.perf_counter()
                node.after_round(r, weights, {}, data)
                seconds.append(time.perf_counter() - started)
            figures[f"round_end_to_readable_s_{mode}"] = statistics.median(seconds)
        served = load_handover(Path(scratch) / "latest", threads=args.threads)
        eager = RawInput(with_weights(model, weights), MEAN, STD).eval()
        sample = images[:1].float().div(255.0)
        sample_np = sample.numpy()
        onnx_ms, torch_ms = [], []
        for _ in range(10):  # warm-up: allocators, kernels
            served.predict(sample_np)
            with torch.no_grad():
                eager(sample)
        for block in range(0, args.calls, BLOCK):  # alternating blocks: each runtime alone, both under the same drift
            n = min(BLOCK, args.calls - block)
            onnx_ms += _onnx_latencies(served, sample_np, n)
            for _ in range(n):
                started = time.perf_counter()
                with torch.no_grad():
                    eager(sample)
                torch_ms.append(1000 * (time.perf_counter() - started))
        alone_ms = _onnx_latencies(served, sample_np, args.calls) if args.beside_training else []  # no torch before
        training_ms = _beside_training(served, sample_np, args.calls, Path(scratch)) if args.beside_training else []
    series = {
        "onnxruntime": onnx_ms,
        "torch": torch_ms,
        "onnxruntime_alone": alone_ms,
        "onnxruntime_beside_training": training_ms,
    }
    for name, values in series.items():
        if values:
            figures[f"{name}_p50_ms"] = _percentile(values, 50)
            figures[f"{name}_p99_ms"] = _percentile(values, 99)
    figures["p50_ratio_torch_over_onnxruntime"] = figures["torch_p50_ms"] / figures["onnxruntime_p50_ms"]  # type: ignore[operator]
    figures["commit"], figures["machine"] = commit(), machine()
    print(
        f"{args.model}, {args.threads} threads, single-sample predictions ({args.calls} each, in alternating "
        f"blocks of {BLOCK}):"
    )
    for name in ("onnxruntime", "torch"):
        print(f"  {name:12s} p50 {figures[f'{name}_p50_ms']:.3f} ms  p99 {figures[f'{name}_p99_ms']:.3f} ms")
    print(f"  torch / onnxruntime at p50: {figures['p50_ratio_torch_over_onnxruntime']:.2f}x")
    if training_ms:
        p50, p99 = _percentile(training_ms, 50), _percentile(training_ms, 99)
        idle50, idle99 = _percentile(alone_ms, 50), _percentile(alone_ms, 99)
        print(
            f"  onnxruntime alone (idle machine, {args.calls} calls in a row): p50 {idle50:.3f} ms  p99 {idle99:.3f} ms"
        )
        print(
            f"  onnxruntime beside a training node: p50 {p50:.3f} ms ({p50 / idle50:.2f}x idle), "
            f"p99 {p99:.3f} ms ({p99 / idle99:.2f}x idle)"
        )
    print(f"round end -> new model readable ({args.test_samples} test samples scored; median of {args.rounds}):")
    for mode in ("latest", "best"):
        print(f"  handover {mode:6s} {figures[f'round_end_to_readable_s_{mode}']:.3f} s")
    print(f"{figures['commit']} on {figures['machine']}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
