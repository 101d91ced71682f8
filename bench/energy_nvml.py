"""NVML energy of a short GPU training run, checked against nvidia-smi power x duration.

Run on a machine with an NVIDIA GPU (Volta or newer)::

    .venv/bin/python bench/energy_nvml.py --seconds 30 --output runs/bench/energy_nvml.json

It trains an MLP on random data for ``--seconds`` (after a warm-up), meters the training phase
with ``open_meter("nvml")`` + ``EnergyAccountant``, and meanwhile streams
``nvidia-smi --query-gpu=power.draw --loop-ms=200``; the nvidia-smi energy is the trapezoid integral of
those readings over the same window. It prints both figures and their ratio, writes them as
JSON, and exits 0 when they agree within 20 %, 1 when not, 2 when there is no NVIDIA GPU.
The CUDA device is chosen in PCI bus order so that it is the GPU NVML calls ``--gpu-index``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_node.energy import EnergyAccountant, open_meter
from edge_node.energy.base import Meter
from edge_node.errors import MeterUnavailable

TOLERANCE = 0.20


def _no_gpu(reason: str) -> None:
    print(f"energy_nvml: no NVIDIA GPU usable here ({reason}); this benchmark needs one", file=sys.stderr)
    sys.exit(2)


class SmiPower:
    """Streams ``nvidia-smi`` power readings (W) with monotonic timestamps in a daemon thread."""

    def __init__(self, gpu_index: int, interval_ms: int, executable: str = "nvidia-smi") -> None:
        self.samples: list[tuple[float, float]] = []
        self._proc = subprocess.Popen(
            [
                executable,
                f"--id={gpu_index}",
                "--query-gpu=power.draw",
                "--format=csv,noheader,nounits",
                f"--loop-ms={interval_ms}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, name="nvidia-smi-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                self.samples.append((time.monotonic(), float(line.strip())))
            except ValueError:  # "[N/A]" and the like
                continue

    def energy_j(self, t0: float, t1: float) -> tuple[float, int]:
        """Trapezoid integral of the readings inside [t0, t1], and how many readings that was."""
        inside = [(t, w) for t, w in self.samples if t0 <= t <= t1]
        if len(inside) < 2:
            raise RuntimeError(f"only {len(inside)} nvidia-smi readings in the window")
        energy = sum(0.5 * (w0 + w1) * (ta1 - ta0) for (ta0, w0), (ta1, w1) in zip(inside, inside[1:], strict=False))
        # the window's edges: hold the first and last readings out to t0 and t1
        energy += inside[0][1] * (inside[0][0] - t0) + inside[-1][1] * (t1 - inside[-1][0])
        return energy, len(inside)

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._thread.join(timeout=5)


def measure(
    meter: Meter,
    smi: SmiPower,
    step: Callable[[], None],
    sync: Callable[[], None],
    *,
    seconds: float,
    warmup_s: float,
    settle_s: float,
) -> dict[str, Any]:
    """Warm up, then meter ``step`` for ``seconds`` with the accountant and with ``smi``; the figures.

    ``sync`` waits for queued device work so that the window's edges are where the work is.
    The accountant takes ownership of ``meter`` and closes it; ``smi`` is left running.
    """
    end_warmup = time.monotonic() + warmup_s
    while time.monotonic() < end_warmup:
        step()
    sync()
    steps = 0
    with EnergyAccountant(meter, None) as acct:
        t0 = time.monotonic()
        with acct.phase("train"):
            while time.monotonic() - t0 < seconds:
                for _ in range(10):
                    step()
                steps += 10
                sync()
        t1 = time.monotonic()
        record = acct.close_round(0, steps=steps)
    time.sleep(settle_s)  # let the last readings arrive
    smi_j, smi_n = smi.energy_j(t0, t1)
    nvml_j = record["joules"]["train"]
    ratio = nvml_j / smi_j if smi_j > 0 else float("inf")
    within = abs(ratio - 1) <= TOLERANCE
    return {
        "window_s": round(t1 - t0, 3),
        "steps": steps,
        "nvml_j": round(nvml_j, 3),
        "nvml_mean_w": round(nvml_j / (t1 - t0), 3),
        "nvidia_smi_j": round(smi_j, 3),
        "nvidia_smi_mean_w": round(smi_j / (t1 - t0), 3),
        "nvidia_smi_readings": smi_n,
        "ratio_nvml_over_smi": round(ratio, 4),
        "within_20pct": within,
        "ok": within and nvml_j > 0 and record["measured"] and record["source"] == "nvml",
        "record": record,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured training time (s)")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="unmeasured warm-up before the window (s)")
    parser.add_argument("--gpu-index", type=int, default=0, help="NVML index of the GPU to use")
    parser.add_argument("--width", type=int, default=4096, help="MLP width (bigger draws more power)")
    parser.add_argument("--batch", type=int, default=4096, help="batch size")
    parser.add_argument("--smi-interval-ms", type=int, default=200, help="nvidia-smi sampling period")
    parser.add_argument("--output", type=Path, default=Path("runs/bench/energy_nvml.json"), help="JSON result file")
    args = parser.parse_args()
    if not args.seconds > 0 or args.warmup_s < 0:
        parser.error(f"--seconds={args.seconds} must be > 0 and --warmup-s={args.warmup_s} >= 0")

    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA index == NVML index
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # training then runs on cuda:0, the first GPU listed there
        first = visible.split(",")[0].strip()
        if os.environ["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID" or not first.isdigit() or int(first) != args.gpu_index:
            parser.error(
                f"CUDA_VISIBLE_DEVICES={visible!r} (CUDA_DEVICE_ORDER={os.environ['CUDA_DEVICE_ORDER']}) may put "
                f"training on another GPU than the NVML --gpu-index={args.gpu_index} that is metered; unset it "
                "and pass --gpu-index, or list that index first"
            )
    if shutil.which("nvidia-smi") is None:
        _no_gpu("nvidia-smi not found on PATH")
    try:
        meter = open_meter("nvml", gpu_index=args.gpu_index)
    except MeterUnavailable as exc:
        _no_gpu(str(exc))
    import torch

    if not torch.cuda.is_available():
        meter.close()
        _no_gpu(f"torch {torch.__version__} sees no CUDA device")
    device = torch.device("cuda:0" if visible is not None else f"cuda:{args.gpu_index}")
    torch.backends.cuda.matmul.allow_tf32 = True
    generator = torch.Generator(device=device).manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width, device=device, generator=generator)
    y = torch.randint(0, 10, (args.batch,), device=device, generator=generator)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    smi = SmiPower(args.gpu_index, args.smi_interval_ms)
    try:
        result = measure(
            meter, smi, step, lambda: torch.cuda.synchronize(device), seconds=args.seconds, warmup_s=args.warmup_s,
            settle_s=2 * args.smi_interval_ms / 1000,
        )  # fmt: skip
    finally:
        smi.stop()
    result = {"device": torch.cuda.get_device_name(device), "gpu_index": args.gpu_index, **result}
    record, steps, nvml_j, smi_j, smi_n, ratio = (
        result["record"], result["steps"], result["nvml_j"], result["nvidia_smi_j"], result["nvidia_smi_readings"],
        result["ratio_nvml_over_smi"],
    )  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['device']}: {result['window_s']} s, {steps} steps; NVML {nvml_j:.1f} J "
        f"({result['nvml_mean_w']:.1f} W mean); nvidia-smi power x time {smi_j:.1f} J "
        f"({result['nvidia_smi_mean_w']:.1f} W mean, {smi_n} readings); ratio {ratio:.3f}; "
        f"record label={record['label']} source={record['source']}; written to {args.output}"
    )
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
