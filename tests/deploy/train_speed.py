"""Seconds for six masked-SGD steps of the cnn at batch 32 on one thread (JSON on stdout).

Run by tests/deploy/test_emulated_arm64.py with the same file on the controller (native) and on an
emulated arm64 host: their ratio is what emulation costs a training step. Imports only edge_node and torch.
"""

import json
import time

import torch

from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.algorithm.training import train_masked
from edge_node.models import build_checked_model

STEPS = 6

torch.set_num_threads(1)
model = build_checked_model("cnn", 10, (3, 32, 32))
masks = {name: torch.ones_like(p, dtype=torch.bool) for name, p in model.named_parameters()}
generator = torch.Generator().manual_seed(0)
batches = [
    (torch.randn(32, 3, 32, 32, generator=generator), torch.randint(0, 10, (32,), generator=generator))
    for _ in range(STEPS)
]
train_masked(model, masks, batches[:1], DisPFLParams().sgd(0))  # warm-up: first-call allocations
start = time.perf_counter()
stats = train_masked(model, masks, batches, DisPFLParams().sgd(0))
seconds = time.perf_counter() - start
print(json.dumps({"steps": STEPS, "seconds": seconds, "loss": stats.mean_loss, "torch": torch.__version__}))
