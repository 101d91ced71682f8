"""How close honest models come to the receive-path screen's limits (``edge_node/algorithm/robust.py``).

Runs a DisPFL simulation (the built-in demo set by default, setting ii: tier densities 0.2 .. 1.0) and,
after every round, screens every client's published model (trained weights, the mask it trained with)
as each other client would if it had pulled all of them. For each (node, round) it finds, by bisection
on the screen itself, the smallest rms ratio and the smallest max-|w| ratio at which no peer is
refused: the honest margin. The screen's defaults are 10x; a margin near them would refuse honest
peers. Also printed: the largest spread of a tensor's statistic between clients (largest over
smallest, each raised to the floor the screen uses).

    .venv/bin/python bench/screen_margin.py                                   # demo, 10 clients, 8 rounds
    .venv/bin/python bench/screen_margin.py --dataset cifar10 --data-dir ../shared/datasets/cifar10-jpeg.tar.gz \\
        --clients 20 --rounds 5 --epochs 1 --batch-size 32 --samples-per-client 500
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._provenance import commit, machine  # noqa: E402
from edge_node.algorithm.robust import (  # noqa: E402
    DEFAULT_MAX_ABS_RATIO,
    DEFAULT_MAX_RMS_RATIO,
    model_stats,
    screen_peer_models,
)
from edge_node.data import load_dataset  # noqa: E402
from edge_node.sim.checkpoint import load_checkpoint  # noqa: E402
from edge_node.sim.config import SimConfig  # noqa: E402
from edge_node.sim.runner import run_simulation  # noqa: E402

HUGE = 1e30  # the other statistic's ratio while one is bisected: never the reason for a refusal


def smallest_passing_ratio(own: tuple[dict, dict], peers: list[tuple[str, dict, dict]], kind: str) -> float:
    """The smallest ratio (to 0.5 %) of ``kind`` (``rms`` or ``amax``) at which the screen refuses no peer."""

    def passes(ratio: float) -> bool:
        rms, amax = (ratio, HUGE) if kind == "rms" else (HUGE, ratio)
        return not screen_peer_models(*own, peers, max_rms_ratio=rms, max_abs_ratio=amax).refused

    low, high = 1.0, 2.0
    if passes(low):
        return low
    while not passes(high):
        low, high = high, high * 2
        if high > 1e12:
            return math.inf
    while high / low > 1.005:
        middle = math.sqrt(low * high)
        low, high = (low, middle) if passes(middle) else (middle, high)
    return high


def spread(models: list[tuple[dict, dict]]) -> tuple[float, str]:
    """The largest over the smallest client statistic of any tensor (rms or max |w|, floored), and where.

    The statistics are the screen's own (``model_stats``); the floor is the smallest client's overall rms.
    """
    names = list(models[0][0])
    stats = [model_stats(w, m, names)[0] for w, m in models]
    assert all(st is not None for st in stats), "an honest model with non-finite values"
    floor = min(math.sqrt(st.sum_squares / max(1, st.active)) for st in stats if st is not None)
    worst, where = 1.0, ""
    for name in names:
        for kind in ("rms", "amax"):
            values = [max(getattr(st, kind)[name], floor) for st in stats if st is not None]
            ratio = max(values) / min(values)
            if ratio > worst:
                worst, where = ratio, f"{name} {kind}"
    return worst, where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="demo")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--neighbours", type=int, help="peers per round (default: simulate's)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--epochs", type=int, help="default: simulate's")
    parser.add_argument("--batch-size", type=int, help="default: simulate's")
    parser.add_argument("--samples-per-client", type=int)
    parser.add_argument("--partition", default=SimConfig.partition)
    parser.add_argument("--json", type=Path, help="also write the per-round figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="screen-margin-") as tmp:
        config = SimConfig(
            dataset=args.dataset,
            data_dir=args.data_dir,
            clients=args.clients,
            neighbours=args.neighbours,
            rounds=args.rounds,
            epochs=args.epochs,
            batch_size=args.batch_size,
            samples_per_client=args.samples_per_client,
            partition=args.partition,
            setting="ii",
            output=Path(tmp) / "run",
            progress=False,
            energy_backend="estimate",
        )
        print(f"setting: {args.dataset}, cnn, {args.clients} clients, setting ii, {args.rounds} rounds, "
              f"{args.epochs} epoch(s) of batch {args.batch_size}, {args.partition}")  # fmt: skip
        rows: list[dict[str, Any]] = []
        started = time.perf_counter()

        def after_round(record: dict[str, Any]) -> None:
            saved = load_checkpoint(config.run_dir / "checkpoint.pt", torch.device("cpu"))
            models = list(zip(saved["weights"], saved["train_masks"], strict=True))
            margins = {"rms": 0.0, "amax": 0.0}
            for i, own in enumerate(models):
                peers = [(f"c{j}", w, m) for j, (w, m) in enumerate(models) if j != i]
                for kind in margins:
                    margins[kind] = max(margins[kind], smallest_passing_ratio(own, peers, kind))
            worst, where = spread(models)
            row = {"round": record["round"], "acc_mean": record["acc_mean"], "rms_margin": margins["rms"],
                   "amax_margin": margins["amax"], "spread": worst, "spread_at": where}  # fmt: skip
            rows.append(row)
            print(f"round {row['round']}: acc {100 * row['acc_mean']:.1f} %, honest margin rms {margins['rms']:.2f}x "
                  f"max|w| {margins['amax']:.2f}x, spread {worst:.2f}x ({where})", flush=True)  # fmt: skip

        run_simulation(config, load_dataset(config.dataset, config.data_dir), on_round=after_round)
    rms = max(r["rms_margin"] for r in rows)
    amax = max(r["amax_margin"] for r in rows)
    largest = max(rows, key=lambda r: r["spread"])
    print(f"largest honest margin over {len(rows)} rounds: rms {rms:.2f}x of the limit {DEFAULT_MAX_RMS_RATIO:g}x, "
          f"max|w| {amax:.2f}x of {DEFAULT_MAX_ABS_RATIO:g}x; largest spread between clients {largest['spread']:.2f}x "
          f"({largest['spread_at']}, round {largest['round']}); {time.perf_counter() - started:.0f} s")  # fmt: skip
    print(f"commit {commit()}, {machine()}")
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"commit": commit(), "args": settings, "rounds": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
