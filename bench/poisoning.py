"""What poisoned peers cost honest nodes, with DisPFL's mean and with the robust aggregates (docs/RESULTS.md).

    .venv/bin/python bench/poisoning.py --output runs/poisoning                 # the issue's table (hours)
    .venv/bin/python bench/poisoning.py --output runs/poisoning --seeds 0 --rounds 5 --epochs 1 \\
        --aggregates mean,median --attackers 0,2                                 # a reduced table

Each cell is a DisPFL simulation of ``--clients`` clients (CIFAR-10 by default, Dir(0.3), ``--neighbours``
seeded neighbours per round: the synchronous algorithm a lock-step loopback fleet computes, tests/fleet/
test_lockstep.py) in which K clients attack: the last K, as ``edge-node loopback --attackers K`` picks them,
with the same functions (edge_node/algorithm/poison.py) keyed the same way (``Stream.ATTACK``, client, round).
A registered bench-only method, ``dispfl-poisoned``, poisons what the attackers publish (the method's
``published_models`` seam) and makes label-flip attackers train on flipped labels (``client_hooks``); nothing
else differs from ``dispfl``. The figure of a cell is the honest clients' mean final accuracy (after local
training, last round), per seed and the mean over seeds, beside the clean fleet's (K = 0) of the same aggregate
and seed. Writes ``poisoning.json`` and ``poisoning.md`` to ``--output``; cells already there are kept (a later
command adds the missing ones). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._provenance import commit, machine  # noqa: E402
from edge_node.algorithm.dispfl import ClientState, RoundHooks  # noqa: E402
from edge_node.algorithm.poison import Attack, StaleModels, flipped_labels, parse_attack, poisoned  # noqa: E402
from edge_node.api import read_records, run_simulation  # noqa: E402
from edge_node.seeding import Stream, torch_generator  # noqa: E402
from edge_node.sim.config import SimConfig  # noqa: E402
from edge_node.sim.methods import REGISTRY  # noqa: E402
from edge_node.sim.methods.base import SimContext  # noqa: E402
from edge_node.sim.methods.dispfl import DISPFL, DisPFL, Published  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"
ATTACK_LIST = "sign-flip,scale:0.1,noise,zero,label-flip,stale:3"
METHOD = "dispfl-poisoned"
CLASSES = 10


@dataclass(frozen=True)
class PoisonedDisPFL(DisPFL):
    """DisPFL with the last ``attackers`` clients attacking (set per cell by :func:`run_cell`)."""

    attack: Attack | None = None
    attackers: frozenset[int] = frozenset()
    stale: dict[int, StaleModels] = field(default_factory=dict)  # per attacker, the stale:R memory
    test_samples: dict[int, int] = field(default_factory=dict)  # each client's test samples (written down)

    def published_models(self, ctx: SimContext, t: int, at_start: list[ClientState]) -> list[Published]:
        models = super().published_models(ctx, t, at_start)
        self.test_samples.update({i: data.num_test for i, data in enumerate(ctx.data)})
        if self.attack is None:
            return models
        for j in sorted(self.attackers):
            weights, mask = models[j]
            if self.attack.kind == "stale":  # the daemon keeps its publications the same way (one per round)
                weights, mask = self.stale.setdefault(j, StaleModels(self.attack.rounds_back)).publish(weights, mask)
            generator = torch_generator(ctx.config.seed, Stream.ATTACK, j, t)  # the daemon's key: client, round
            models[j] = (poisoned(self.attack, weights, mask, generator), mask)
        return models

    def client_hooks(self, ctx: SimContext, i: int, **more: Any) -> RoundHooks:
        hooks = super().client_hooks(ctx, i, **more)
        if self.attack is None or not self.attack.flips_labels or i not in self.attackers:
            return hooks
        classes = CLASSES  # CIFAR-10 and the demo set both have 10
        source = hooks.batches
        return replace(hooks, batches=lambda epochs, generator: flipped_labels(source(epochs, generator), classes))


def run_cell(args: argparse.Namespace, attack: str | None, k: int, aggregate: str, seed: int) -> dict[str, Any]:
    """One simulation; the honest clients' final accuracies and what the robust setting refused."""
    parsed = parse_attack(attack, args.rounds) if attack else None
    attackers = frozenset(range(args.clients - k, args.clients))
    fields = {f: getattr(DISPFL, f) for f in DISPFL.__dataclass_fields__}
    method = PoisonedDisPFL(**{**fields, "name": METHOD}, attack=parsed, attackers=attackers)
    REGISTRY[METHOD] = method
    with tempfile.TemporaryDirectory(prefix="poisoning-") as tmp:
        config = SimConfig(
            method=METHOD, dataset=args.dataset, data_dir=args.data_dir, clients=args.clients,
            neighbours=args.neighbours, rounds=args.rounds, epochs=args.epochs, batch_size=args.batch_size,
            partition=args.partition, seed=seed, aggregate=aggregate, output=Path(tmp) / "run", progress=False,
            energy_backend="estimate", threads=args.threads, samples_per_client=args.samples_per_client,
        )  # fmt: skip
        started = time.monotonic()
        run_dir = run_simulation(config, fresh=True)
        records = read_records(run_dir)
        test_min = min(method.test_samples.values()) if method.test_samples else None
    last = records[-1]
    honest = [n["acc_after"] for i, n in enumerate(last["nodes"]) if i not in attackers]
    refusals: dict[str, int] = {}
    for r in records:
        for peers in (r.get("screen_refused") or {}).values():
            for reason in peers.values():
                kind = "distance" if reason.startswith("distance:") else "screened"
                refusals[kind] = refusals.get(kind, 0) + 1
    return {
        "attack": attack, "attackers": k, "aggregate": aggregate, "seed": seed,
        "honest_acc_final_mean": sum(honest) / len(honest), "honest_acc_final": honest,
        "test_samples_min": test_min,
        "refusals": refusals, "wall_s": round(time.monotonic() - started, 1),
    }  # fmt: skip


def table(cells: list[dict[str, Any]]) -> str:
    """Markdown: per aggregate and attack, the honest mean final accuracy for each K (mean over seeds)."""

    def mean_of(rows: list[dict[str, Any]]) -> float | None:
        return sum(r["honest_acc_final_mean"] for r in rows) / len(rows) if rows else None

    aggregates = sorted({c["aggregate"] for c in cells}, key=lambda a: (a != "mean", a))
    ks = sorted({c["attackers"] for c in cells})
    attacks = sorted({c["attack"] for c in cells if c["attack"]})
    lines = [f"| aggregate | attack | {' | '.join(f'K={k}' for k in ks)} | refusals (distance / screened) |",
             "|---|---|" + "---:|" * len(ks) + "---|"]  # fmt: skip
    for agg in aggregates:
        for attack in attacks:
            row = []
            refused = {"distance": 0, "screened": 0}
            for k in ks:
                rows = [c for c in cells if c["aggregate"] == agg and c["attackers"] == k
                        and (c["attack"] == attack or k == 0)]  # fmt: skip
                value = mean_of(rows)
                row.append("-" if value is None else f"{100 * value:.2f}% ({len(rows)} seeds)")
                for c in rows:
                    if k:
                        for kind in refused:
                            refused[kind] += c["refusals"].get(kind, 0)
            lines.append(f"| {agg} | {attack} | {' | '.join(row)} | {refused['distance']} / {refused['screened']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--dataset", default="cifar10")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--neighbours", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--partition", default="dir:0.3")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--samples-per-client", type=int, default=None, help="training quota (a reduced table)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--attacks", default=ATTACK_LIST)
    parser.add_argument("--attackers", default="0,1,2", help="K values (0: the clean fleet)")
    parser.add_argument("--aggregates", default="mean,median,trimmed:0.2")
    args = parser.parse_args()
    if args.dataset == "demo":
        args.data_dir = None
    out: Path = args.output
    out.mkdir(parents=True, exist_ok=True)
    path = out / "poisoning.json"
    saved = json.loads(path.read_text()) if path.exists() else {"cells": []}
    cells: list[dict[str, Any]] = saved["cells"]
    done = {(c["attack"], c["attackers"], c["aggregate"], c["seed"]) for c in cells}
    plan = []
    for seed in (int(s) for s in args.seeds.split(",")):  # each attack's aggregates side by side (a partial run)
        for k in (int(k) for k in args.attackers.split(",")):
            for attack in [None] if k == 0 else args.attacks.split(","):
                for agg in args.aggregates.split(","):
                    if (attack, k, agg, seed) not in done:
                        plan.append((attack, k, agg, seed))
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "output"}
    print(f"{len(plan)} cells to run; load average {os.getloadavg()}", flush=True)
    for attack, k, agg, seed in plan:
        load_before = os.getloadavg()[0]
        cell = run_cell(args, attack, k, agg, seed)
        cell["load_before"], cell["load_after"] = round(load_before, 2), round(os.getloadavg()[0], 2)
        cell["settings"] = settings
        cells.append(cell)
        print(json.dumps({k2: v for k2, v in cell.items() if k2 != "settings"}), flush=True)
        saved.update(cells=cells, commit=commit(), machine=machine())
        path.write_text(json.dumps(saved, indent=2) + "\n")
        (out / "poisoning.md").write_text(table(cells))
    print(table(cells))


if __name__ == "__main__":
    main()
