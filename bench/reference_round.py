"""The DisPFL authors' round, written out from reading their code, on edge-node's data (issue 23 audit).

An independent second implementation of what ``rong-dai/DisPFL`` does per round (``dispfl_api.py``
``train`` and ``_aggregate_func``, ``client.py`` ``train``/``fire_mask``/``regrow_mask`` with random
regrowth, ``my_model_trainer.py`` ``train``/``test``): one shared model, ``torch.optim.SGD`` with weight
decay and ``clip_grad_norm_``, weights times the mask after each step, ``torch.sort`` pruning,
``torch.multinomial`` regrowth, the ``1 / count`` aggregation over the neighbours and the client itself,
the authors' normalisation constants on CIFAR-10 and their augmentation written per sample. It starts
from what edge-node's simulation starts from with the same seed: the partition and per-client test
sets, the initial weights, every client's initial mask and the neighbour lists of every round. So
``edge-node simulate`` with the same settings differs from it only in the round's code and in random
draws (shuffles, crops, regrowth): the gap between the two is what the round's code contributes.

    python bench/reference_round.py --data-dir ../shared/datasets/cifar10-jpeg.tar.gz --json ref.json
    edge-node simulate --dataset cifar10 --data-dir ... --clients 20 --samples-per-client 500 --neighbours 5 \\
        --rounds 5 --planned-rounds 30 --partition path:2 --regrow random --seed 0   # the same settings
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_node.algorithm.dispfl import start  # noqa: E402
from edge_node.algorithm.topology import round_neighbours  # noqa: E402
from edge_node.data.datasets import load_dataset  # noqa: E402
from edge_node.data.partition import partition_clients  # noqa: E402
from edge_node.models import build_model  # noqa: E402

# The authors' CIFAR-10 normalisation (data_loader.py, _data_transforms_cifar10); other data sets use their own.
AUTHORS_CIFAR10 = ((0.49139968, 0.48215827, 0.44653124), (0.24703233, 0.24348505, 0.26158768))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--samples-per-client", type=int, default=500)
    ap.add_argument("--neighbours", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--density", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--planned-rounds", type=int, default=30)
    ap.add_argument("--partition", default="path:2")
    ap.add_argument("--seed", type=int, default=0, help="edge-node's seed: partition, weights, masks, neighbours")
    ap.add_argument("--torch-seed", type=int, default=1024, help="the global torch RNG: shuffles, crops, regrowth")
    ap.add_argument("--data-norm", action="store_true", help="normalise by the data's own statistics (edge-node's)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    torch.manual_seed(a.torch_seed)
    ds = load_dataset(a.dataset, a.data_dir)
    mean, std = (ds.mean, ds.std) if a.data_norm or a.dataset != "cifar10" else AUTHORS_CIFAR10
    shift, scale = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    train_parts, test_parts = partition_clients(
        ds.train_y, ds.test_y, ds.num_classes, a.partition, a.clients, a.seed, a.samples_per_client
    )
    train_x, train_y = torch.as_tensor(ds.train_x), torch.as_tensor(ds.train_y).long()
    test_x, test_y = torch.as_tensor(ds.test_x), torch.as_tensor(ds.test_y).long()

    def normalise(x: torch.Tensor) -> torch.Tensor:
        return (x.float() / 255.0 - shift) / scale

    def train_batches(i: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch: DataLoader(shuffle=True, drop_last=False), RandomCrop(32, padding=4), RandomHorizontalFlip."""
        idx = torch.as_tensor(train_parts[i])
        order = idx[torch.randperm(len(idx))]
        for s in range(0, len(order), a.batch_size):
            b = order[s : s + a.batch_size]
            padded = nn.functional.pad(train_x[b], (4, 4, 4, 4))
            out = torch.empty_like(train_x[b])
            tops, lefts = torch.randint(0, 9, (len(b),)), torch.randint(0, 9, (len(b),))
            flips = torch.rand(len(b)) < 0.5
            for k in range(len(b)):
                crop = padded[k, :, tops[k] : tops[k] + 32, lefts[k] : lefts[k] + 32]
                out[k] = crop.flip(2) if flips[k] else crop
            yield normalise(out), train_y[b]

    def test(model: nn.Module, i: int) -> float:
        idx = torch.as_tensor(test_parts[i])
        model.eval()
        with torch.no_grad():
            return float((model(normalise(test_x[idx])).argmax(1) == test_y[idx]).float().mean())

    model = build_model("cnn", ds.num_classes, seed=a.seed)
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    masks = [
        {k: m.float() for k, m in start(init, a.density, seed=a.seed, client=i).train_mask.items()}
        for i in range(a.clients)
    ]
    published = [{k: init[k] * masks[i][k] for k in init} for i in range(a.clients)]
    shared_masks = copy.deepcopy(masks)
    rows = []
    for t in range(a.rounds):
        started = time.perf_counter()
        nbrs = round_neighbours("random", a.clients, a.neighbours, a.seed, t)
        snapshot, snapshot_masks = copy.deepcopy(published), copy.deepcopy(shared_masks)
        lr = 0.1 * 0.998**t
        drop = 0.5 / 2 * (1 + math.cos(t * math.pi / a.planned_rounds))
        before, after = [], []
        for i in range(a.clients):
            group = sorted([*nbrs[i], i])
            with torch.no_grad():
                for k, p in model.named_parameters():
                    count = sum(snapshot_masks[j][k] for j in group)
                    inverse = torch.where(count != 0, 1.0 / count.clamp_min(1), torch.zeros_like(count))
                    p.copy_(sum(inverse * snapshot[j][k] for j in group) * masks[i][k])
            shared_masks[i] = copy.deepcopy(masks[i])
            before.append(test(model, i))
            model.train()
            optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0, weight_decay=5e-4)
            for _ in range(a.epochs):
                for x, y in train_batches(i):
                    model.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    nn.utils.clip_grad_norm_(model.parameters(), 10)
                    optimizer.step()
                    with torch.no_grad():
                        for k, p in model.named_parameters():
                            p.mul_(masks[i][k])
            after.append(test(model, i))
            weights = {k: p.detach().clone() for k, p in model.named_parameters()}
            new = copy.deepcopy(masks[i])
            for k in new:  # fire_mask, then regrow_mask with random regrowth
                remove = math.ceil(drop * torch.sum(new[k]))
                magnitude = torch.where(new[k] > 0, weights[k].abs(), 100000 * torch.ones_like(weights[k]))
                new[k].view(-1)[torch.sort(magnitude.view(-1)).indices[:remove]] = 0
                if remove:
                    free = torch.where(new[k] == 0, torch.ones_like(new[k]), torch.zeros_like(new[k]))
                    new[k].view(-1)[torch.multinomial(free.flatten(), remove, replacement=False)] = 1
            published[i], masks[i] = weights, new
        row = {"round": t, "acc_before_mean": float(np.mean(before)), "acc_after_mean": float(np.mean(after)),
               "wall_s": time.perf_counter() - started}  # fmt: skip
        rows.append(row)
        print(f"round {t}: before {100 * row['acc_before_mean']:.2f} %, after {100 * row['acc_after_mean']:.2f} %, "
              f"{row['wall_s']:.0f} s", flush=True)  # fmt: skip
    if a.json is not None:
        a.json.write_text(json.dumps({"settings": vars(a) | {"json": str(a.json)}, "rounds": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
