"""``SimConfig``: every setting of a simulation run, checked once, before anything is written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.algorithm.masks import check_density
from edge_node.algorithm.topology import check_topology
from edge_node.data import parse_partition
from edge_node.energy.detect import BACKENDS
from edge_node.errors import ConfigError
from edge_node.models import MODEL_NAMES

METHODS = ("dispfl",)
SETTINGS = ("i", "ii")
DEVICES = ("cpu", "cuda")
# Settings that may change when a run is resumed (the rest must match the checkpoint).
RESUMABLE_CHANGES = frozenset({"rounds", "device", "output", "data_dir", "progress", "energy_backend"})


@dataclass(frozen=True)
class SimConfig:
    method: str = "dispfl"
    dataset: str = "demo"
    data_dir: Path | None = None
    model: str = "cnn"
    clients: int = 100
    neighbours: int = 10
    topology: str = "random"
    max_in_degree: int | None = None  # cap on pulls a node serves per round (paper: 10); None = uncapped
    rounds: int = 500
    planned_rounds: int | None = None  # T of the cosine prune schedule; None = rounds
    epochs: int = 5
    batch_size: int = 128
    lr: float = 0.1
    lr_decay: float = 0.998  # per round
    weight_decay: float = 5e-4
    clip_norm: float = 10.0
    density: float = 0.5
    setting: str = "i"  # "ii": heterogeneous tiers 0.2..1.0, client i gets tier i mod 5
    mask_init: str = "erk"
    regrow: str = "random"
    prune_alpha: float = 0.5
    partition: str = "dir:0.3"
    samples_per_client: int | None = None  # dir quota; None = training set size // clients (paper: 500)
    seed: int = 0
    device: str = "cpu"
    output: Path = Path("runs/sim")
    eval_batch_size: int = 1000
    energy_backend: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"method {self.method!r} must be one of {', '.join(METHODS)}")
        if self.model not in MODEL_NAMES:
            raise ConfigError(f"unknown model {self.model!r}; choose one of {', '.join(MODEL_NAMES)}")
        check_density(self.density)
        if self.setting not in SETTINGS:
            raise ConfigError(f"setting {self.setting!r} must be one of {', '.join(SETTINGS)}")
        if self.device not in DEVICES:
            raise ConfigError(f"device {self.device!r} must be one of {', '.join(DEVICES)}")
        for name in ("clients", "rounds", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.planned_rounds is not None and self.planned_rounds < 1:
            raise ConfigError(f"planned_rounds={self.planned_rounds} must be at least 1")
        self.dispfl_params()  # the round's own checks: epochs, batch size, lr, decay, clipping, regrow, mask init
        if self.energy_backend not in BACKENDS:
            raise ConfigError(f"energy backend {self.energy_backend!r} must be one of {', '.join(BACKENDS)}")
        check_topology(self.topology, self.clients, self.neighbours, self.max_in_degree)
        kind, _ = parse_partition(self.partition)
        if self.samples_per_client is not None:
            if kind != "dir":
                raise ConfigError("samples_per_client applies to dir partitions only (path splits classes evenly)")
            if self.samples_per_client < 1:
                raise ConfigError(f"samples_per_client={self.samples_per_client} must be at least 1")

    @property
    def schedule_rounds(self) -> int:
        return self.planned_rounds or self.rounds

    def dispfl_params(self) -> DisPFLParams:
        """The shared client round's hyper-parameters."""
        return DisPFLParams(
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            lr_decay=self.lr_decay,
            weight_decay=self.weight_decay,
            clip_norm=self.clip_norm,
            planned_rounds=self.schedule_rounds,
            prune_alpha=self.prune_alpha,
            regrow=self.regrow,
            mask_init=self.mask_init,
        )

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["data_dir"] = str(self.data_dir) if self.data_dir else None
        out["output"] = str(self.output)
        return out

    def differences(self, saved: dict[str, Any]) -> list[str]:
        """Settings that differ from a checkpoint's saved config (ignoring resumable ones)."""
        mine = self.to_json()
        return sorted(k for k in mine if k not in RESUMABLE_CHANGES and saved.get(k) != mine[k])
