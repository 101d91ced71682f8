"""``SimConfig``: every setting of a simulation run, checked once, before anything is written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.algorithm.masks import MASK_METHODS, check_density
from edge_node.algorithm.prune_regrow import REGROW_RULES
from edge_node.algorithm.sparse_to_sparser import S2SParams
from edge_node.algorithm.topology import TOPOLOGIES, check_topology
from edge_node.data import DATASET_NAMES, PartitionSpec, parse_partition_spec
from edge_node.energy.detect import BACKENDS
from edge_node.errors import ConfigError
from edge_node.models import MODEL_NAMES

# The learning methods of the paper's table: DisPFL (+ DA-DPFL's sparse-to-sparser) and its baselines.
METHODS = ("dispfl", "dispfl-s2s", "local", "dpsgd", "dpsgd-ft", "fedavg", "fedavg-ft")
SPARSE_METHODS = frozenset({"dispfl", "dispfl-s2s"})  # the rest train dense models, as in the paper
DECENTRALISED_METHODS = frozenset({"dispfl", "dispfl-s2s", "dpsgd", "dpsgd-ft"})  # pull from neighbours
CENTRALISED_METHODS = frozenset({"fedavg", "fedavg-ft"})  # a server samples clients
SETTINGS = ("i", "ii")
DEVICES = ("cpu", "cuda")
# Settings that may change when a run is resumed (the rest must match the checkpoint).
RESUMABLE_CHANGES = frozenset({"rounds", "device", "output", "data_dir", "progress", "energy_backend"})
# Values of settings added after runs were saved, for a saved config that lacks them (what those runs did): the
# baselines' and sparse-to-sparser's settings came with them (the DisPFL runs before used none of them: today's
# defaults), the receive-path screen later (runs before ran without). A saved config without
# "partition_variant" predates the reference partitions: see saved_settings.
LEGACY_DEFAULTS: dict[str, Any] = {
    "fedavg_clients": 10, "target_density": 0.2, "s2s_stable_threshold": 0.02, "screen": False,
    "micro_batch": 0,
}  # fmt: skip
# Keys config.json holds beyond the fields (derived, written for readers; ignored when the file is read back).
DERIVED_KEYS = frozenset({"partition_variant"})
# The run directory when --output is not given (one pattern, for the help text and the code).
OUTPUT_PATTERN = "runs/{dataset}-{model}-{method}-{partition}-seed{seed}"


@dataclass(frozen=True)
class SimConfig:
    """A simulation run. Defaults are sized for a first run (4 clients, 5 rounds of 1 epoch at batch 32 on the
    built-in demo set: 31 s of CPU time in all with one thread, and it learns, 35 % -> 57 %); the paper's
    CIFAR settings are 100 clients, 10 neighbours, 5 epochs, batch 128, 500 rounds."""

    method: str = "dispfl"
    dataset: str = "demo"
    data_dir: Path | None = None
    model: str = "cnn"
    clients: int = 4  # paper: 100
    neighbours: int = 2  # peers pulled per round, random topology only (paper: 10)
    topology: str = "random"
    max_in_degree: int | None = None  # cap on pulls a node serves per round (paper: 10); None = uncapped
    rounds: int = 5  # paper: 500
    planned_rounds: int | None = None  # T of the cosine prune schedule; None = rounds
    epochs: int = 1  # paper: 5
    batch_size: int = 32  # paper: 128 (32: enough SGD steps on a first run's small slices to learn in 5 rounds)
    micro_batch: int = 0  # slices of a batch through the model at once (a device's memory); 0: the whole batch
    lr: float = 0.1
    lr_decay: float = 0.998  # per round
    weight_decay: float = 5e-4
    clip_norm: float = 10.0
    density: float = 0.5  # DisPFL methods; the dense baselines train at 1.0 whatever is given
    setting: str = "i"  # "ii": heterogeneous tiers 0.2..1.0, client i gets tier i mod 5
    mask_init: str = "erk"
    regrow: str = "random"
    prune_alpha: float = 0.5
    partition: str = "dir:0.3"  # see edge_node.data.partition: dir|dir-reuse|dir-balanced:ALPHA, path|path-balanced:K
    samples_per_client: int | None = None  # quota; None = training set size // clients (paper: 500)
    fedavg_clients: int = 10  # clients a FedAvg server trains per round (paper: 10)
    target_density: float = 0.2  # dispfl-s2s: prune further down to this density, never below (paper: 0.2)
    s2s_stable_threshold: float = 0.02  # dispfl-s2s: a client votes "stable" when s_t <= this (paper: 0.02)
    screen: bool = True  # DisPFL methods: screen peers' models before aggregating, as a device does (robust.py)
    seed: int = 0
    device: str = "cpu"
    output: Path | None = None  # None: OUTPUT_PATTERN, filled in on construction
    eval_batch_size: int = 1000
    energy_backend: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        def choice(name: str, choices: tuple[str, ...]) -> None:
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(f"{name.replace('_', ' ')} {value!r} must be one of {', '.join(choices)}")

        choice("method", METHODS)
        choice("dataset", DATASET_NAMES)
        if self.model not in MODEL_NAMES:
            raise ConfigError(f"unknown model {self.model!r}; choose one of {', '.join(MODEL_NAMES)}")
        choice("setting", SETTINGS)
        choice("device", DEVICES)
        choice("energy_backend", BACKENDS)
        choice("topology", TOPOLOGIES)
        choice("regrow", REGROW_RULES)
        choice("mask_init", MASK_METHODS)
        check_density(self.density)
        for name in ("clients", "rounds", "eval_batch_size", "fedavg_clients"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.planned_rounds is not None and self.planned_rounds < 1:
            raise ConfigError(f"planned_rounds={self.planned_rounds} must be at least 1")
        if self.method not in SPARSE_METHODS:
            if self.setting == "ii":
                raise ConfigError(f"setting ii (tiers of densities) is a DisPFL setting; method {self.method} is dense")
            object.__setattr__(self, "density", 1.0)  # the paper's baselines are dense
        self.dispfl_params()  # the round's own checks: epochs, batch size, lr, decay, clipping, regrow, mask init
        self.s2s_params()
        if self.method == "dispfl-s2s" and self.setting == "i" and self.target_density > self.density:
            raise ConfigError(f"target_density={self.target_density} must not exceed density={self.density}")
        if self.method in DECENTRALISED_METHODS:
            check_topology(self.topology, self.clients, self.neighbours, self.max_in_degree)
        spec = parse_partition_spec(self.partition)
        object.__setattr__(self, "partition", spec.name)  # canonical: "DIR:0.30" and "dir:0.3" are one run
        if self.samples_per_client is not None:
            if not spec.takes_quota:
                raise ConfigError("samples_per_client does not apply to path-balanced partitions (fixed shares)")
            if self.samples_per_client < 1:
                raise ConfigError(f"samples_per_client={self.samples_per_client} must be at least 1")
        if self.output is None:
            object.__setattr__(self, "output", default_output(self))
        else:
            object.__setattr__(self, "output", Path(self.output))

    @property
    def run_dir(self) -> Path:
        """``output`` (always set after construction)."""
        assert self.output is not None
        return self.output

    @property
    def schedule_rounds(self) -> int:
        return self.planned_rounds or self.rounds

    @property
    def partition_variant(self) -> str:
        """``reference``, ``reuse`` or ``balanced`` (see ``edge_node.data.partition``)."""
        return parse_partition_spec(self.partition).variant

    def dispfl_params(self) -> DisPFLParams:
        """The shared client round's hyper-parameters."""
        return DisPFLParams(
            epochs=self.epochs,
            batch_size=self.batch_size,
            micro_batch=self.micro_batch,
            lr=self.lr,
            lr_decay=self.lr_decay,
            weight_decay=self.weight_decay,
            clip_norm=self.clip_norm,
            planned_rounds=self.schedule_rounds,
            prune_alpha=self.prune_alpha,
            regrow=self.regrow,
            mask_init=self.mask_init,
        )

    def s2s_params(self) -> S2SParams:
        """DA-DPFL's further-pruning settings (used by ``dispfl-s2s``)."""
        return S2SParams(target_density=self.target_density, stable_threshold=self.s2s_stable_threshold)

    def ignored(self, given: set[str]) -> list[str]:
        """Warnings for settings in ``given`` (field names the user set) that this run does not use."""
        out = []
        method, topo = self.method, self.topology
        if "neighbours" in given:
            if method in ("local", "fedavg", "fedavg-ft"):
                out.append(f"neighbours is ignored by method {method} (it pulls from no neighbours)")
            elif topo != "random":
                pulls = "its 2 ring neighbours" if topo == "ring" else "every other client"
                out.append(f"neighbours is ignored with topology {topo} (each client pulls from {pulls})")
        if "max_in_degree" in given and (topo != "random" or method not in DECENTRALISED_METHODS):
            out.append("max_in_degree applies to the random topology of decentralised methods only; ignored")
        if "topology" in given and method not in DECENTRALISED_METHODS:
            out.append(f"topology is ignored by method {method}")
        if method not in SPARSE_METHODS:
            for name in ("density", "regrow", "mask_init", "prune_alpha", "planned_rounds"):
                if name in given:
                    out.append(f"{name} is ignored by method {method} (a dense baseline: density 1, no mask updates)")
        if "fedavg_clients" in given and method not in CENTRALISED_METHODS:
            out.append(f"fedavg_clients is ignored by method {method}")
        if "screen" in given and method not in SPARSE_METHODS:
            out.append(f"screen is ignored by method {method} (the receive-path screen is DisPFL's, as on a device)")
        if method != "dispfl-s2s":
            for name in ("target_density", "s2s_stable_threshold"):
                if name in given:
                    out.append(f"{name} is ignored by method {method} (dispfl-s2s only)")
        return out

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values, plus the derived ``partition_variant`` (see DERIVED_KEYS)."""
        out = dataclasses.asdict(self)
        out["data_dir"] = str(self.data_dir) if self.data_dir else None
        out["output"] = str(self.output)
        out["partition_variant"] = self.partition_variant
        return out

    def differences(self, saved: dict[str, Any]) -> list[str]:
        """Settings that differ from a checkpoint's saved config (read by :func:`saved_settings`; ignoring
        resumable ones)."""
        mine = self.to_json()
        then = saved_settings(saved)
        return sorted(k for k in mine if k not in RESUMABLE_CHANGES and then.get(k) != mine[k])

    def resumed_as(self, saved: dict[str, Any]) -> tuple[SimConfig, list[str]]:
        """This config, adapted to resume a run saved before some settings existed, and a note per adaptation.

        Such a run goes on as it ran: one saved before partitions had variants ran the balanced ones under
        the names ``dir:``/``path:``, so the same command (which today means the reference procedure)
        resumes it as ``dir-balanced:``/``path-balanced:``; one saved before the receive-path screen ran
        without it. Anything else that differs is left for :meth:`differences` to refuse.
        """
        then = saved_settings(saved)
        changes: dict[str, Any] = {}
        notes = []
        old_name = saved.get("partition")
        if then.get("partition") != old_name and self.partition == parse_partition_spec(str(old_name)).name:
            changes["partition"] = then["partition"]  # the old name, as today's parser writes it: the old command
            notes.append(
                f"this run was saved before partitions had variants: its {old_name} was the balanced "
                f"procedure, resumed as --partition {then['partition']} (pass that to say so)"
            )
        if "screen" not in saved and self.screen != then["screen"]:
            changes["screen"] = then["screen"]
            if self.method in SPARSE_METHODS:
                notes.append("this run was saved before the receive-path screen existed and ran without it; "
                             "resumed without it (--no-screen)")  # fmt: skip
        if not changes:
            return self, notes
        return dataclasses.replace(self, **changes), notes


def saved_settings(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config (a checkpoint's, or a run's ``config.json``) in today's terms.

    One without ``partition_variant`` predates the reference partitions: its ``dir:``/``path:`` were the
    balanced procedure, today ``dir-balanced:``/``path-balanced:``. Settings of ``LEGACY_DEFAULTS`` it
    lacks get the value such runs had. ConfigError when its partition cannot be read.
    """
    out = {**LEGACY_DEFAULTS, **saved}
    if "partition_variant" not in saved and "partition" in saved:
        spec = parse_partition_spec(str(saved["partition"]))
        if spec.variant == "reference":
            out["partition"] = PartitionSpec(spec.kind, spec.value, "balanced").name
        out["partition_variant"] = "balanced"
    return out


def default_output(config: SimConfig) -> Path:
    """``OUTPUT_PATTERN`` for ``config``: ``runs/demo-cnn-dispfl-dir0.3-seed0``."""
    partition = config.partition.replace(":", "")
    return Path(OUTPUT_PATTERN.format(
        dataset=config.dataset, model=config.model, method=config.method, partition=partition, seed=config.seed
    ))  # fmt: skip
