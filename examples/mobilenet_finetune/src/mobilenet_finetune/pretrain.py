"""Pretrain the network centrally on CIFAR-10 classes 0-4 and save it as safetensors for ``--init-weights``.

``python -m mobilenet_finetune.pretrain --out pretrained.safetensors [--epochs 5] [--batch-size 128]``
trains every parameter with SGD (momentum 0.9, cosine learning rate, CIFAR augmentation through edge-node's
batches), then writes every tensor but the head (``classifier.*``): a fleet of another five classes starts
from these features and its own head, drawn from the fleet seed. BatchNorm's running statistics are saved
too (they are the features' statistics on the pretraining images).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from edge_node.data import Dataset
from edge_node.data.batches import ClientData, ImagePool
from edge_node.data.datasets import channel_stats
from mobilenet_finetune.data import first_five
from mobilenet_finetune.model import mobilenet_v2

HEAD = "classifier."


def as_dataset(pairs: tuple[list[tuple[torch.Tensor, int]], list[tuple[torch.Tensor, int]]]) -> Dataset:
    """The factory's pairs as an edge-node Dataset (uint8 images, so batches are augmented and normalised)."""
    (train, test) = pairs
    tx = np.stack([x.numpy() for x, _ in train])
    vx = np.stack([x.numpy() for x, _ in test])
    mean, std = channel_stats(tx)
    return Dataset("first-five", tx, np.array([y for _, y in train], dtype=np.int64), vx,
                   np.array([y for _, y in test], dtype=np.int64), 5, tuple("01234"), mean, std)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    data = as_dataset(first_five())
    pool = ImagePool.from_dataset(data)
    client = ClientData.from_indices(pool, np.arange(len(data.train_y)), np.arange(len(data.test_y)))
    torch.manual_seed(args.seed)
    model = mobilenet_v2(5, data.input_shape)
    steps = args.epochs * -(-client.num_train // args.batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    generator = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        for x, y in client.train_batches(1, generator, args.batch_size):
            if x.shape[0] < 2:  # BatchNorm cannot normalise one sample
                continue
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            schedule.step()
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in client.eval_batches(500))
        print(f"epoch {epoch + 1}/{args.epochs}: test accuracy {100 * correct / client.num_test:.1f}% "
              f"({client.num_test} images), {time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    kept = {k: v.contiguous() for k, v in model.state_dict().items() if not k.startswith(HEAD)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(kept, str(args.out))
    print(f"wrote {args.out}: {len(kept)} tensors (the head {HEAD}* left out for the fleet's own)")


if __name__ == "__main__":
    main()
