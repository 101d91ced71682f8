"""The capacity probe times the steps the node will take: DP-SGD's for a private node."""

from __future__ import annotations

import torch

from edge_node.algorithm.dp import DPConfig
from edge_node.data.batches import ClientData, ImagePool
from edge_node.models import build_model
from edge_node.node import capacity
from edge_node.node.capacity import _timing_dp, probe
from edge_node.node.config import NodeConfig


def _data() -> ClientData:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    pool = ImagePool(x, y, x[:8], y[:8], (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), 10)
    return ClientData(pool, torch.arange(64), torch.arange(8))


def test_a_private_probe_takes_dp_sgd_steps(monkeypatch):
    taken: list = []
    real = capacity.train_masked

    def recording(model, masks, batches, config, noise=None, **kw):
        taken.append((config.dp, noise is not None))
        return real(model, masks, batches, config, noise, **kw)

    monkeypatch.setattr(capacity, "train_masked", recording)
    dp = DPConfig(clip=1.0, noise_multiplier=1.0)
    measured = probe(build_model("cnn", 10, seed=0), _data(), 8, probe_s=0.5, dp=dp)
    assert measured.probe_steps >= 1 and taken and all(step == (dp, True) for step in taken)
    taken.clear()
    probe(build_model("cnn", 10, seed=0), _data(), 8, probe_s=0.5)
    assert taken and all(step == (None, False) for step in taken)


def test_the_probe_of_a_node_is_private_exactly_when_the_node_is(tmp_path):
    plain = NodeConfig(state_dir=tmp_path)
    private = NodeConfig(state_dir=tmp_path, privacy="dp-sgd", epsilon=8.0, dp_clip=2.0)
    assert _timing_dp(plain) is None
    assert _timing_dp(private) == DPConfig(2.0, 1.0)
