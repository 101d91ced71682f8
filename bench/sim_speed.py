"""How fast the simulation runs, and where a round's time goes: 1 and K processes, optimised and naive, one run.

Each setting is a fresh ``edge-node simulate`` (under ``torchrun --standalone`` for K > 1 processes) on the
same configuration, each ``--repeats`` times, settings interleaved (the median run counts: a machine that
gets busier slows each alike); the total thread count is the same for every setting (``--threads``, split
evenly over the K processes), so K=2 vs K=1 compares splitting the clients with splitting each convolution. For
each it prints seconds per round (median of the rounds' ``wall_s``, after ``--skip`` warm-up rounds),
training images per second, the executed training FLOP/s (dense: masked training computes every weight;
3 x forward FLOPs per image) and its fraction of this device's matmul peak measured here (float32
``torch.mm`` of 4096 x 4096 at the same total threads), and the peak host memory of the process tree
(and, on CUDA, the device memory NVML sees in use above the idle level). ``--compare-naive`` adds the
straightforward path: one process, each batch in the daemon's slices of 16 samples (its default
``--micro-batch``, bitwise equal to a device's step) against the whole batch at once (``--micro-batch 0``,
the same algorithm up to float noise), ratios printed. ``--cuda-graphs`` (CUDA) adds one process with the
optimised setting's step replayed as a CUDA graph (``edge-node simulate --cuda-graphs``). ``--breakdown``
profiles one round of the optimised setting in process (``--breakdown graphs``: the captured one) and splits
its wall time into training compute, evaluation, data, aggregation, mask update, copies, energy-meter reads and
the rest, from the main thread's stack sampled every millisecond (not cProfile: on the GPU machine's Python
its parts came out negative, as when a profiler takes the round's helper threads' calls for the main
thread's, which Python 3.12's cProfile, built on ``sys.monitoring``, presumably did); on CUDA a part
holds the time the main thread waited in it, including kernels queued before it. With ``--repeats 0`` that
round is all that runs.

    .venv/bin/python bench/sim_speed.py --processes 1 2 --compare-naive --breakdown       # tiny demo run
    .venv/bin/python bench/sim_speed.py --dataset cifar10 --data-dir CIFAR.tar.gz --clients 100 \\
        --neighbours 10 --epochs 5 --batch-size 128 --rounds 2 --skip 0 --processes 1 2 --compare-naive
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _provenance import commit, machine  # noqa: E402

from edge_node.records import read_records  # noqa: E402

NAIVE_MICRO_BATCH = 16  # the daemon's slices (DisPFLParams.micro_batch): bitwise equal to a device's step
PROFILE_PARTS = {  # category: functions in which the main thread's time counts to it (the innermost wins)
    "training compute (forward, backward, SGD)": ["train_masked"],
    "evaluation (forward)": ["count_correct"],
    "data (batches drawn, uint8 -> float)": ["train_batches", "eval_batches"],
    "aggregation (screen, aggregate)": ["screen_peer_models", "aggregate_peers", "neighbourhood_average"],
    "mask update (prune, regrow)": ["update_mask"],
    "copies (weights in and out of the model)": ["load_weights", "read_weights"],
    "energy meter reads": ["_charge"],
}
REST = "rest (Python, bookkeeping, records)"
SAMPLE_INTERVAL_S = 0.001


class MainThreadSampler:
    """Where the calling thread's wall time goes: its stack sampled from a thread of its own.

    Each sample weighs the time since the one before and counts to the innermost frame named in
    :data:`PROFILE_PARTS`, else to :data:`REST` when a method's ``round`` is on the stack; samples
    outside a round (start-up, the records after it) count to nothing.
    """

    def __init__(self, interval: float = SAMPLE_INTERVAL_S) -> None:
        self.interval = interval
        self.seconds: dict[str, float] = dict.fromkeys([*PROFILE_PARTS, REST], 0.0)
        self.samples = 0
        self._category = {name: label for label, names in PROFILE_PARTS.items() for name in names}
        self._ident = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-speed-sampler", daemon=True)

    def __enter__(self) -> MainThreadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _classify(self, frame: Any) -> str | None:
        while frame is not None:
            code = frame.f_code
            label = self._category.get(code.co_name)
            if label is not None:
                return label
            if code.co_name == "round" and "methods" in code.co_filename:
                return REST
            frame = frame.f_back
        return None

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            label = self._classify(sys._current_frames().get(self._ident))
            now = time.perf_counter()
            if label is not None:
                self.seconds[label] += now - last
                self.samples += 1
            last = now


def matmul_peak(device: str, threads: int, n: int = 4096, repeats: int = 5) -> float:
    """Float32 FLOP/s of ``torch.mm`` (n x n) on ``device`` at ``threads`` threads: the best of ``repeats``."""
    torch.set_num_threads(threads)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.mm(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


class PeakMemory:
    """Peak summed RSS of a process and its descendants (and NVML used device memory), sampled every 0.2 s."""

    def __init__(self, proc: subprocess.Popen, cuda: bool) -> None:
        self.proc, self.host, self.device = psutil.Process(proc.pid), 0, 0
        self._stop = threading.Event()
        self._nvml: Any = None
        self._idle = 0
        if cuda:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._idle = pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                tree = [self.proc, *self.proc.children(recursive=True)]
                self.host = max(self.host, sum(p.memory_info().rss for p in tree))
            except psutil.Error:
                pass  # a process ended between listing and reading
            if self._nvml is not None:
                import pynvml

                used = pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used
                self.device = max(self.device, used - self._idle)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def simulate_args(args: argparse.Namespace) -> list[str]:
    """The ``edge-node simulate`` flags of the benchmarked configuration."""
    flags = [
        "--dataset", args.dataset, "--model", args.model, "--clients", str(args.clients), "--neighbours",
        str(args.neighbours), "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--density",
        str(args.density), "--partition", args.partition, "--rounds", str(args.rounds), "--seed", "0",
        "--device", args.device, "--energy-backend", args.energy_backend, "--no-progress", "--fresh",
    ]  # fmt: skip
    if args.data_dir:
        flags += ["--data-dir", args.data_dir]
    if args.samples_per_client:
        flags += ["--samples-per-client", str(args.samples_per_client)]
    return flags


def run_setting(
    args: argparse.Namespace, processes: int, micro_batch: int, out: Path, graphs: bool = False
) -> dict[str, Any]:
    """One fresh run of the configuration (with ``graphs``: ``--cuda-graphs``): its rounds' figures and peak
    memory."""
    threads = max(args.threads // processes, 1)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    command = [*launcher, "-m", "edge_node", "simulate", *simulate_args(args), "--micro-batch", str(micro_batch),
               *(["--cuda-graphs"] if graphs else []), "--output", str(out)]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    memory = PeakMemory(proc, args.device == "cuda")
    try:
        output, _ = proc.communicate(timeout=args.timeout)
    finally:
        memory.stop()
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise SystemExit(f"sim_speed: {' '.join(command)} exited {proc.returncode}:\n{output[-3000:]}")
    records = read_records(out)
    clients = json.loads((out / "clients.json").read_text())["clients"]
    timed = records[args.skip :] or records
    s_round = statistics.median(r["wall_s"] for r in timed)
    images = args.epochs * sum(c["train"] for c in clients)  # training images a round (evaluation not counted)
    executed = 3 * records[0]["forward_flops_dense"] * images
    return {
        "processes": processes, "threads_per_process": threads, "micro_batch": micro_batch, "cuda_graphs": graphs,
        "rounds_timed": len(timed), "s_per_round": s_round, "images_per_s": images / s_round,
        "flops_executed_per_s": executed / s_round,
        "flops_sparse_per_s": sum(r["flops_per_client_mean"] * r["trained_clients"] for r in timed) / len(timed)
        / s_round,
        "host_peak_gib": memory.host / 2**30, "device_peak_gib": memory.device / 2**30 if args.device == "cuda"
        else None, "acc_mean_last": records[-1]["acc_mean"], "total_s": time.perf_counter() - started,
    }  # fmt: skip


def median_row(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """One setting's figures over its repeats: the run of median seconds per round, with every run's seconds."""
    ordered = sorted(samples, key=lambda r: r["s_per_round"])
    return {**ordered[(len(ordered) - 1) // 2], "s_per_round_runs": [r["s_per_round"] for r in samples]}


def breakdown(args: argparse.Namespace, micro_batch: int, out: Path, of: str = "eager") -> dict[str, float]:
    """One round of the configuration, in this process, its wall time split by :class:`MainThreadSampler`.

    ``of``: the setting profiled: eager steps, or ``graphs`` (``--cuda-graphs``).
    """
    from edge_node.api import run_simulation
    from edge_node.sim.config import SimConfig

    torch.set_num_threads(args.threads)
    config = SimConfig(
        dataset=args.dataset, data_dir=Path(args.data_dir) if args.data_dir else None, model=args.model,
        clients=args.clients, neighbours=args.neighbours, epochs=args.epochs, batch_size=args.batch_size,
        density=args.density, partition=args.partition, rounds=1, seed=0, device=args.device,
        energy_backend=args.energy_backend, progress=False, micro_batch=micro_batch, output=out,
        samples_per_client=args.samples_per_client, cuda_graphs=of == "graphs",
    )  # fmt: skip
    with MainThreadSampler() as sampler:
        run_simulation(config, fresh=True)
    if sampler.samples < 20:
        raise SystemExit(f"sim_speed: the breakdown's round gave {sampler.samples} samples: too short to split")
    return {"round_s": sum(sampler.seconds.values()), **sampler.seconds}


def print_rows(rows: list[dict[str, Any]], peak: float) -> None:
    """The settings' table; ratios against the first row."""
    base = rows[0]
    print(f"{'K':>2} {'thr':>4} {'micro':>5} {'graphs':>6} {'s/round':>8} {'x':>6} {'img/s':>8} "
          f"{'GFLOP/s':>8} {'% peak':>7} {'host GiB':>8} {'dev GiB':>8} {'acc':>6}")  # fmt: skip
    for row in rows:
        device_gib = "-" if row["device_peak_gib"] is None else f"{row['device_peak_gib']:.2f}"
        print(f"{row['processes']:>2} {row['threads_per_process']:>4} {row['micro_batch']:>5} "
              f"{'yes' if row['cuda_graphs'] else 'no':>6} "
              f"{row['s_per_round']:>8.2f} {row['s_per_round'] / base['s_per_round']:>6.2f} "
              f"{row['images_per_s']:>8.0f} {row['flops_executed_per_s'] / 1e9:>8.2f} "
              f"{100 * row['flops_executed_per_s'] / peak:>6.1f}% {row['host_peak_gib']:>8.2f} {device_gib:>8} "
              f"{100 * row['acc_mean_last']:>5.1f}%")  # fmt: skip
    print("x: seconds per round (median of the repeats) over the first row's; GFLOP/s: executed dense training "
          "FLOPs (3 x forward per image); the naive row (micro 16) is one process in the daemon's slices")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="demo")
    parser.add_argument("--data-dir")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--neighbours", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--density", type=float, default=0.5)
    parser.add_argument("--partition", default="dir:0.3")
    parser.add_argument("--samples-per-client", type=int)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip", type=int, default=1, help="warm-up rounds not timed [default: 1]")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--energy-backend", default="estimate")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="total threads, split over K")
    parser.add_argument("--micro-batch", type=int, default=0, help="the optimised setting [default: 0, whole batch]")
    parser.add_argument("--compare-naive", action="store_true")
    parser.add_argument("--cuda-graphs", action="store_true", help="add a row with --cuda-graphs (CUDA, micro 0)")
    parser.add_argument(
        "--breakdown",
        nargs="?",
        const="eager",
        choices=["eager", "graphs"],
        help="profile one round of a setting: eager steps (no value) or --cuda-graphs'",
    )
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each setting, interleaved; the median (0: only --breakdown's round)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per setting")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    if args.cuda_graphs and (args.device != "cuda" or args.micro_batch != 0):
        parser.error("--cuda-graphs needs --device cuda and --micro-batch 0 (what edge-node simulate accepts it with)")
    if args.repeats < 0 or (args.repeats == 0 and not args.breakdown):
        parser.error("--repeats must be >= 1, or 0 with --breakdown (its round alone, no timed rows)")
    if args.breakdown == "graphs" and not args.cuda_graphs:
        parser.error("--breakdown graphs profiles that row: give --cuda-graphs too")
    peak = matmul_peak(args.device, args.threads)
    if args.dataset != "demo":  # decode (and cache) the data set here first: its worker processes would count in
        from edge_node.data import load_dataset  # the first setting's host memory (4.7-5.3 GiB against 1.9 for cnn)

        load_dataset(args.dataset, Path(args.data_dir) if args.data_dir else None)
    settings = [(k, args.micro_batch, False) for k in args.processes]
    if args.cuda_graphs:
        settings.append((1, args.micro_batch, True))
    if args.compare_naive:
        settings.append((1, NAIVE_MICRO_BATCH, False))
    runs: list[list[dict[str, Any]]] = [[] for _ in settings]
    with tempfile.TemporaryDirectory(prefix="sim_speed-") as tmp:
        for _ in range(args.repeats):  # settings interleaved: a machine that gets busier slows each alike
            for n, (k, micro, graphs) in enumerate(settings):
                out = Path(tmp) / f"k{k}-m{micro}-g{int(graphs)}"
                runs[n].append(run_setting(args, k, micro, out, graphs))
        parts = breakdown(args, args.micro_batch, Path(tmp) / "profile", args.breakdown) if args.breakdown else None
    rows = [median_row(samples) for samples in runs] if args.repeats else []
    print(f"sim_speed: {args.model} on {args.dataset}, {args.clients} clients, {args.neighbours} neighbours, "
          f"{args.epochs} epoch(s), batch {args.batch_size}, {args.device}, {args.threads} threads in all; "
          f"matmul peak {peak / 1e9:.1f} GFLOP/s; commit {commit()}; {machine()}")  # fmt: skip
    if rows:
        print_rows(rows, peak)
    if parts is not None:
        setting = {"eager": "eager steps", "graphs": "--cuda-graphs"}[args.breakdown]
        print(f"\nwhere one round's {parts['round_s']:.2f} s go ({setting}; 1 process, the main thread's stack "
              f"sampled every {SAMPLE_INTERVAL_S * 1e3:.0f} ms):")  # fmt: skip
        for label, seconds in parts.items():
            if label != "round_s":
                print(f"  {label:<44} {seconds:>8.2f} s {100 * seconds / max(parts['round_s'], 1e-9):>5.1f} %")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "matmul_peak_flops": peak, "rows": rows,
                                               "breakdown": parts, "commit": commit(), "machine": machine()},
                                              indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
