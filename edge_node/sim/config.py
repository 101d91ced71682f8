"""``SimConfig``: every setting of a simulation run, checked once, before anything is written."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.algorithm.ditto import LAMBDA as DITTO_LAMBDA
from edge_node.algorithm.ditto import PERSONAL_SHARE as DITTO_PERSONAL_SHARE
from edge_node.algorithm.dp import PRIVACY_MODES
from edge_node.algorithm.fedp3 import AGGREGATIONS, SCHEDULES
from edge_node.algorithm.heterogeneous import client_densities
from edge_node.algorithm.masks import MASK_METHODS, check_density
from edge_node.algorithm.norm_stats import DEFAULT_NORM_STATS, NORM_STATS, batch_normalised, has_running_stats
from edge_node.algorithm.prune_regrow import REGROW_RULES
from edge_node.algorithm.sub_fedavg import ACC_THRESHOLD as SUBFEDAVG_ACC
from edge_node.algorithm.sub_fedavg import DIST_THRESHOLD as SUBFEDAVG_DIST
from edge_node.algorithm.sub_fedavg import PRUNE_RATE as SUBFEDAVG_PRUNE_RATE
from edge_node.algorithm.topology import TOPOLOGIES, check_topology
from edge_node.data import DATASET_NAMES, PartitionSpec, check_dataset_name, parse_partition_spec
from edge_node.defaults import DEFAULTS, PRESETS, neighbours_of, preset
from edge_node.energy.detect import BACKENDS
from edge_node.errors import ConfigError, DataError, ModelError
from edge_node.models import MODEL_NAMES, check_model_name
from edge_node.protocol import TIER_DENSITIES, TIER_MODES
from edge_node.robust_names import AGGREGATE_HELP, check_aggregate
from edge_node.sim.methods import METHOD_SETTINGS, REGISTRY, Method, get_method, users_of
from edge_node.task_names import check_task_name
from edge_node.tomlconf import key
from edge_node.torch_threads import THREADS_HELP

# The learning methods (edge_node.sim.methods' registry): DisPFL (+ DA-DPFL's sparse-to-sparser) and its baselines.
METHODS = tuple(REGISTRY)
SETTINGS = ("i", "ii")
DEVICES = ("cpu", "cuda")
# Settings that may change when a run is resumed (the rest must match the checkpoint).
RESUMABLE_CHANGES = frozenset(
    {"rounds", "device", "output", "data_dir", "progress", "energy_backend", "cuda_graphs", "threads"}
)
# Values of settings added after runs were saved, for a saved config that lacks them (what those runs did): the
# baselines' and sparse-to-sparser's settings came with them (the DisPFL runs before used none of them: today's
# defaults; so did Ditto's and Sub-FedAvg's), the receive-path screen later (runs before ran without). A saved
# config without "partition_variant" predates the reference partitions: see saved_settings.
LEGACY_DEFAULTS: dict[str, Any] = {
    "fedavg_clients": 10, "target_density": 0.2, "s2s_stable_threshold": 0.02, "screen": False,
    "micro_batch": 0, "fedp3_layers": "opu2", "fedp3_keep": 0.9, "fedp3_aggregation": "mean", "privacy": "none",
    "epsilon": None, "delta": 1e-5, "dp_clip": 1.0,
    "ditto_lambda": DITTO_LAMBDA, "ditto_personal_share": DITTO_PERSONAL_SHARE,
    "subfedavg_prune_rate": SUBFEDAVG_PRUNE_RATE, "subfedavg_dist_threshold": SUBFEDAVG_DIST,
    "subfedavg_acc_threshold": SUBFEDAVG_ACC, "cuda_graphs": False, "norm_stats": DEFAULT_NORM_STATS,
    "aggregate": "mean", "task": "classification", "init_weights": None, "trainable": [], "tier_mode": "mask",
}  # fmt: skip
# Keys config.json holds beyond the fields (derived, written for readers; ignored when the file is read back).
DERIVED_KEYS = frozenset({"partition_variant"})
# The run directory when --output is not given (one pattern, for the help text and the code).
OUTPUT_PATTERN = "runs/{dataset}-{model}-{method}-{partition}-seed{seed}"
COMMAND = "simulate"  # its name in the demo preset's table (edge_node.defaults.PRESETS)


def _demo(name: str) -> str:
    """How a flag's help names the demo preset's value of ``name``."""
    return f"demo quick-start preset: {PRESETS[COMMAND][name]}"


@dataclass(frozen=True)
class SimConfig:
    """A simulation run. The settings it shares with ``edge-node start`` and ``loopback`` take the shared defaults
    (edge_node.defaults); with no flag at all it is a first run, on the built-in demo set with the demo
    quick-start preset (4 clients, 2 neighbours, 5 rounds of 1 epoch at batch 32: 19 s on 2 idle cores, and it
    learns, 35 % -> 56 %). The paper's CIFAR settings are 100 clients, 10 neighbours, 5 epochs, batch 128, 500
    rounds. Each key's help is its ``edge-node simulate`` flag's (edge_node/cli/_config_options.py)."""

    method: str = key("dispfl", "Learning method [default: {default}].", choices=METHODS)
    dataset: str = key(
        DEFAULTS.dataset,
        f"Data set: {', '.join(DATASET_NAMES)} ('demo' is built in and needs no download), or a data factory "
        "package.module:function [default: {default}].",
    )
    # What is learnt (edge_node.algorithm.tasks): classification, regression, multilabel or a factory; it reads a
    # data factory's labels, and names the loss and the records' headline metric (acc_*, see docs/API.md).
    task: str = key(
        DEFAULTS.task,
        "What is learnt: classification, regression, multilabel or a factory package.module:function (its loss, "
        "how a data factory's labels are read, the records' headline metric) [default: {default}].",
    )
    data_dir: Path | None = key(
        None, "Data set location: python batches, an image-folder or Tiny-ImageNet tree, or a .tar.gz of one."
    )
    model: str = key(
        DEFAULTS.model,
        f"Model: {', '.join(MODEL_NAMES)}, an installed plug-in's name or a factory package.module:function "
        "[default: {default}].",
    )
    # Every client's start (edge_node.pretrained): a safetensors file or a weights-only state_dict; None: the seed's.
    init_weights: Path | None = key(
        None,
        "Every client's start: a safetensors file or a weights-only state_dict (never a pickle); parameters it "
        "leaves out (a new head) come from --seed [default: none, all from --seed].",
    )
    # fnmatch globs of the parameters that train (edge_node.algorithm.frozen); empty: all of them. DisPFL only.
    trainable: tuple[str, ...] = key(
        (),
        "Train only the parameters matching these globs (layer4.*,linear.*); the rest stay frozen and are never "
        "sent (dispfl only) [default: all train].",
        metavar="GLOB[,GLOB]",
    )
    clients: int = key(4, "Number of clients [default: {default}; paper: 100].")
    # Peers pulled per round, random topology only (paper: 10). None: the shared default, at most the other
    # clients (the demo preset's on the demo set).
    neighbours: int | None = key(
        None,
        "Peers each client pulls per round, random topology [default: "
        f"{DEFAULTS.neighbours}, at most clients - 1; {_demo('neighbours')}; paper: 10].",
    )
    topology: str = key("random", "Who pulls from whom [default: {default}].", choices=TOPOLOGIES)
    max_in_degree: int | None = key(None, "Cap pulls a node serves per round (paper: 10) [default: none].")
    rounds: int = key(5, "Rounds to run; resume: run up to this [default: {default}; paper: 500].")
    # T of the cosine prune schedule; None = rounds. Unlike a daemon (the shared 500: it runs until stopped), a
    # simulation knows its last round, where the paper's schedule ends.
    planned_rounds: int | None = key(None, "T of the cosine prune schedule [default: --rounds].")
    # The client round's hyper-parameters: the shared defaults (edge_node.defaults), a device's and the paper's
    # (5 epochs of batch 128); on the demo set the quick-start preset's 1 epoch of 32, a first run that finishes
    # in about a minute on 2 cores and shows learning. None: that default, filled in on construction.
    epochs: int | None = key(None, f"Local epochs per round [default: {DEFAULTS.epochs}; {_demo('epochs')}].")
    batch_size: int | None = key(None, f"Training batch size [default: {DEFAULTS.batch_size}; {_demo('batch_size')}].")
    # Slices of a batch through the model at once; 0: the whole batch. None: ``default_micro_batch`` (0 where the
    # steps take whole batches: cuda_graphs; else a device's slices, the shared default).
    micro_batch: int | None = key(
        None,
        "Send a batch through the model in slices of this many samples, summing their gradients (a device's "
        "memory; the same default as edge-node start); 0: the whole batch [default: "
        f"{DEFAULTS.micro_batch}; 0 with --cuda-graphs]. A BatchNorm model always trains whole batches (its "
        "statistics come from the batch, not from slices) and skips a last batch of one sample.",
    )
    lr: float = key(DEFAULTS.lr, f"Initial learning rate, x{DEFAULTS.lr_decay} per round [default: {{default}}].")
    lr_decay: float = key(DEFAULTS.lr_decay, "Learning-rate decay per round [default: {default}].")
    weight_decay: float = key(DEFAULTS.weight_decay, "Weight decay [default: {default}].")
    clip_norm: float = key(DEFAULTS.clip_norm, "Gradient-norm clipping [default: {default}].")
    # Sparse methods; the dense ones train at 1.0 whatever is given. A simulation has no device to measure, so
    # it has no capacity (a daemon's shared default, auto): its fixed density is the paper's setting (i).
    density: float = key(
        0.5,
        "Model density in (0, 1] of the sparse methods (sub-fedavg: the density it prunes down to) "
        "[default: {default}; the dense baselines use 1].",
    )
    setting: str = key(
        "i", "'ii': heterogeneous tiers 0.2..1.0, client i gets tier i mod 5 [default: {default}].", choices=SETTINGS
    )
    # What a client's tier buys (edge_node.algorithm.width): "mask", a DisPFL mask at the tier's density on the full
    # model (dense kernels: bytes, not compute); "width", the tier's narrow model, whole; "both", the narrow model
    # with a mask at ``density`` inside it.
    tier_mode: str = key(
        "mask",
        "What a tier buys: mask (a mask at the tier's density, dense kernels), width (the tier's narrow model, "
        "whose dense FLOPs are the tier's share: its compute shrinks), both (the narrow model, a mask at --density "
        "inside it) [default: {default}].",
        choices=TIER_MODES,
    )
    mask_init: str = key(
        DEFAULTS.mask_init,
        "erk, uniform (random positions) or magnitude (the start's largest |w|, ERK's counts) [default: {default}]",
        choices=MASK_METHODS,
    )
    regrow: str = key(
        DEFAULTS.regrow, "gradient (the paper) or random (reference code) [default: {default}].", choices=REGROW_RULES
    )
    prune_alpha: float = key(
        DEFAULTS.prune_alpha, "Initial prune fraction of the cosine schedule [default: {default}]."
    )
    # See edge_node.data.partition: dir|dir-reuse|dir-balanced:ALPHA, path|path-balanced:K.
    partition: str = key(
        DEFAULTS.partition,
        "dir:ALPHA, path:K (the reference code's procedure), dir-reuse:ALPHA, dir-balanced:ALPHA, "
        "path-balanced:K (see docs) [default: {default}].",
    )
    # Quota; None = training set size // clients (paper: 500).
    samples_per_client: int | None = key(None, "Quota per client [default: training set size // clients].")
    # Clients a FedAvg server trains per round (paper: 10).
    fedavg_clients: int = key(
        10, "fedavg, fedspa, ditto, sub-fedavg: clients a server trains per round [default: {default}]."
    )
    # dispfl-s2s: prune further down to this density, never below (paper: 0.2).
    target_density: float = key(0.2, "dispfl-s2s: prune further down to this density [default: {default}].")
    # dispfl-s2s: a client votes "stable" when s_t <= this (paper: 0.02).
    s2s_stable_threshold: float = key(
        0.02, "dispfl-s2s: a client votes stable when |D_t - D_t-1| / D_0 <= this [default: {default}]."
    )
    fedp3_layers: str = key(
        "opu2",
        "fedp3: hidden layers each client owns: lowerb (1), opu2/opu3 (2/3 consecutive), opr2 (2 random a "
        "round); all also train and upload the final layer [default: {default}].",
        choices=SCHEDULES,
    )
    # fedp3: fraction of each non-owned weight tensor the server sends (paper: 0.9).
    fedp3_keep: float = key(
        0.9, "fedp3: fraction of each non-owned weight tensor the server sends [default: {default}]."
    )
    fedp3_aggregation: str = key(
        "mean", "fedp3: per-layer mean, or weighted by layers owned [default: {default}].", choices=AGGREGATIONS
    )
    # "ldp": LDP-FedP3 (DP-SGD on every client at the budget below); a file may name a device's "dp-sgd" (refused).
    privacy: str = key(
        "none",
        "ldp: LDP-FedP3, every client trains with DP-SGD (per-sample clip + Gaussian noise) at the noise that "
        "spends --epsilon at --delta by the last round (fedp3 only) [default: {default}].",
        choices=("none", "ldp"),
    )
    epsilon: float | None = key(None, "Privacy budget of the whole run, per client's data set.")
    delta: float = key(1e-5, "Privacy delta [default: {default}].")
    dp_clip: float = key(1.0, "DP-SGD per-sample gradient clip C [default: {default}].")
    # ditto: the proximal pull of the personal model (FedSpa paper: 0.5).
    ditto_lambda: float = key(
        DITTO_LAMBDA, "ditto: pull of the personal model towards the global one [default: {default}]."
    )
    # ditto: share of E epochs' steps on the personal model (3/5).
    ditto_personal_share: float = key(
        DITTO_PERSONAL_SHARE,
        "ditto: share of a round's E epochs of steps that train the personal model, the rest the global one "
        "[default: {default}: 3 of 5 epochs].",
    )
    subfedavg_prune_rate: float = key(
        SUBFEDAVG_PRUNE_RATE, "sub-fedavg: fraction of active weights one prune removes [default: {default}]."
    )
    subfedavg_dist_threshold: float = key(
        SUBFEDAVG_DIST,
        "sub-fedavg: prune only when the first and last epochs' candidate masks differ by more than this "
        "[default: {default}].",
    )
    subfedavg_acc_threshold: float = key(
        SUBFEDAVG_ACC,
        "sub-fedavg: keep a prune only when the pruned model's accuracy is at least this [default: {default}].",
    )
    # BatchNorm's running statistics (edge_node.algorithm.norm_stats): "local" (FedBN) keeps each client's own,
    # never sent nor averaged; "average" sends them with the weights and averages them with the neighbours'
    # (DisPFL's methods; refused for a model without them). Nothing to a model without them.
    norm_stats: str = key(
        DEFAULTS.norm_stats,
        "A BatchNorm model's running statistics: local (FedBN: each client keeps its own, used in its evaluation, "
        "checkpointed, never sent nor averaged; dispfl, dispfl-s2s, local, dpsgd and dpsgd-ft) [default: {default}].",
        choices=NORM_STATS,
    )
    # DisPFL's methods: the per-coordinate aggregate over the holders (edge_node.algorithm.robust_aggregation).
    aggregate: str = key(
        DEFAULTS.aggregate,
        AGGREGATE_HELP + " [default: {default}].",
        metavar="mean|median|trimmed:BETA",
    )
    # DisPFL's methods: screen peers' models before aggregating, as a device does (robust.py).
    screen: bool = key(
        True,
        "DisPFL: refuse a peer's model whose scale is far outside the client's own and its other peers' before "
        "aggregating, as a device does (edge_node/algorithm/robust.py) [default: screen].",
    )
    seed: int = key(DEFAULTS.seed, "[default: {default}]")
    device: str = key(DEFAULTS.device, "[default: {default}]", choices=DEVICES)
    threads: int | None = key(DEFAULTS.threads, THREADS_HELP)
    # Replay each full training batch's step as one captured CUDA graph (edge_node.algorithm.graphed): the
    # same steps up to float rounding, fewer kernel launches. CUDA only; DisPFL's family of methods only.
    cuda_graphs: bool = key(
        False,
        "CUDA only: replay each full training batch's SGD step as one captured CUDA graph instead of hundreds of "
        "kernel launches (the same steps up to float rounding). Needs --device cuda and no --privacy, and sets "
        "--micro-batch 0 unless it is given (another value is refused); "
        "DisPFL, dispfl-s2s, fedp3, dpsgd, dpsgd-ft and local use it [default: off].",
    )
    # None: OUTPUT_PATTERN, filled in on construction.
    output: Path | None = key(
        None, f"Run directory [default: {OUTPUT_PATTERN}, ':' dropped]. Resumed if it holds a run."
    )
    eval_batch_size: int = key(1000, "Evaluation batch size (memory) [default: {default}].")
    energy_backend: str = key("auto", "Energy meter [default: {default}].", choices=BACKENDS)
    progress: bool = key(
        True,
        "Progress bars when stderr is a terminal; without them (a pipe, a service, --no-progress) one line "
        "per round [default: progress].",
    )

    def __post_init__(self) -> None:
        def choice(name: str, choices: tuple[str, ...]) -> None:
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(f"{name.replace('_', ' ')} {value!r} must be one of {', '.join(choices)}")

        self.method_spec  # noqa: B018 -- checks `method` against the registry (as it is now: tests add to it)
        self._fill_defaults()
        self._check_start()
        if self.micro_batch is None:
            object.__setattr__(self, "micro_batch", self.default_micro_batch)
        try:
            check_dataset_name(self.dataset)
            check_model_name(self.model)
        except (DataError, ModelError) as exc:
            raise ConfigError(str(exc)) from None
        check_task_name(self.task)
        choice("setting", SETTINGS)
        choice("device", DEVICES)
        choice("energy_backend", BACKENDS)
        choice("topology", TOPOLOGIES)
        choice("regrow", REGROW_RULES)
        choice("mask_init", MASK_METHODS)
        choice("fedp3_layers", SCHEDULES)
        choice("fedp3_aggregation", AGGREGATIONS)
        choice("privacy", PRIVACY_MODES)
        choice("norm_stats", NORM_STATS)
        choice("tier_mode", TIER_MODES)
        self._check_tier_mode()
        check_aggregate(self.aggregate)
        if not 0 < self.fedp3_keep <= 1:
            raise ConfigError(f"fedp3_keep={self.fedp3_keep!r} must be in (0, 1]")
        if not math.isfinite(self.dp_clip) or self.dp_clip <= 0:
            raise ConfigError(f"dp_clip={self.dp_clip!r} must be a positive number")
        if self.privacy != "none" and "privacy" not in self.method_spec.uses:
            # Never a warning: a run believed private that is not would be worse than no run.
            users = ", ".join(users_of("privacy"))
            raise ConfigError(f"privacy {self.privacy!r} is not implemented for method {self.method} (only {users})")
        check_density(self.density)
        self._check_cuda_graphs()
        for name in ("clients", "rounds", "eval_batch_size", "fedavg_clients"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.planned_rounds is not None and self.planned_rounds < 1:
            raise ConfigError(f"planned_rounds={self.planned_rounds} must be at least 1")
        method = self.method_spec
        if not method.sparse:
            if self.setting == "ii" and not method.width_tiers:
                raise ConfigError(f"setting ii (tiers of densities) is a sparse setting; method {self.method} is dense")
            object.__setattr__(self, "density", 1.0)  # the paper's baselines are dense
        self.dispfl_params()  # the round's own checks: epochs, batch size, lr, decay, clipping, regrow, mask init
        method.check(self)
        if "topology" in method.uses:
            check_topology(self.topology, self.clients, self.neighbour_count, self.max_in_degree)
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

    def _fill_defaults(self) -> None:
        """Set the settings left None whose default depends on the data set: the demo preset's on the demo set,
        else the shared table's (neighbours: at most the other clients)."""
        demo = preset(COMMAND, self.dataset)
        shared = {"epochs": DEFAULTS.epochs, "batch_size": DEFAULTS.batch_size, **demo}
        shared["neighbours"] = neighbours_of(self.clients - 1, shared.get("neighbours", DEFAULTS.neighbours))
        for name, value in shared.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ConfigError(f"threads={self.threads!r} must be at least 1")

    @property
    def default_micro_batch(self) -> int:
        """``micro_batch`` when none is given: 0 where the steps take whole batches (captured, which refuses
        slices), else a device's slices (DisPFLParams' default: the lock-step fleet equals the simulation)."""
        return 0 if self.cuda_graphs else DEFAULTS.micro_batch

    def _check_start(self) -> None:
        """Normalise ``init_weights`` and ``trainable``; refuse frozen layers where they are not implemented."""
        from edge_node.algorithm.frozen import parse_globs

        if self.init_weights is not None:
            object.__setattr__(self, "init_weights", Path(self.init_weights))
        object.__setattr__(self, "trainable", parse_globs(self.trainable))
        if not self.trainable:
            return
        if "trainable" not in self.method_spec.uses:
            users = ", ".join(users_of("trainable"))
            raise ConfigError(f"trainable (frozen layers) is not implemented for method {self.method} (only {users})")
        if self.cuda_graphs:
            raise ConfigError("cuda_graphs captures a step of every parameter; trainable (frozen layers) needs eager "
                              "steps")  # fmt: skip
        if self.privacy != "none":
            raise ConfigError(f"privacy {self.privacy!r} trains every parameter; trainable (frozen layers) excludes it")

    def _check_tier_mode(self) -> None:
        """Refuse width tiers where they are not implemented (one line each)."""
        if self.method_spec.width_tiers:
            if self.tier_mode == "both":
                raise ConfigError(f"method {self.method} trains whole narrow models: tier_mode both is not one of its "
                                  "modes (tier_mode width)")  # fmt: skip
            object.__setattr__(self, "tier_mode", "width")
        if self.tier_mode == "mask":
            return
        if "tier_mode" not in self.method_spec.uses:
            users = ", ".join(users_of("tier_mode"))
            raise ConfigError(f"tier_mode {self.tier_mode} is not implemented for method {self.method} (only {users})")
        if self.tier_mode == "both" and self.setting != "ii":
            raise ConfigError("tier_mode both takes the width from a client's tier and the mask from --density: it "
                              "needs setting ii (tiers); with setting i use tier_mode width")  # fmt: skip
        if self.setting == "i" and not any(math.isclose(self.density, d) for d in TIER_DENSITIES):
            tiers = ", ".join(f"{d:g}" for d in TIER_DENSITIES)
            raise ConfigError(f"tier_mode {self.tier_mode} under setting i trains every client at --density's width: "
                              f"it must be a tier ({tiers}), as a stream names its tier")  # fmt: skip
        if self.trainable:
            raise ConfigError(f"tier_mode {self.tier_mode} trains narrow models of every layer; trainable (frozen "
                              "layers) is refused with it")  # fmt: skip
        if self.privacy != "none":
            raise ConfigError(f"tier_mode {self.tier_mode} with privacy {self.privacy!r} is not implemented")
        if self.cuda_graphs:
            raise ConfigError(f"cuda_graphs captures one model's step; tier_mode {self.tier_mode} trains one model "
                              "per width: leave cuda_graphs off")  # fmt: skip

    def _check_cuda_graphs(self) -> None:
        """ConfigError unless a run with ``cuda_graphs`` can capture its step (whole batches of plain SGD on CUDA)."""
        if not self.cuda_graphs:
            return
        if self.device != "cuda":
            raise ConfigError(f"cuda_graphs needs device cuda (it replays CUDA kernels), not {self.device!r}")
        self._check_plain_whole_batches("cuda_graphs", "does not capture", "captures", "needs eager steps")

    def _check_plain_whole_batches(self, name: str, refuses: str, takes: str, instead: str) -> None:
        """ConfigError unless the steps are whole batches of plain SGD (what ``name``'s step computes)."""
        if self.privacy != "none":
            raise ConfigError(f"{name} {refuses} DP-SGD steps; privacy {self.privacy!r} {instead}")
        if self.micro_batch != 0:
            raise ConfigError(f"{name} {takes} whole batches: it needs micro_batch 0, not {self.micro_batch}")

    def check_model(self, model: Any) -> None:
        """ConfigError (one line) unless this run can train ``model``'s BatchNorm layers, if it has any: a method
        that keeps each client's running statistics (``Method.keeps_norm_stats``), no DP-SGD (a per-sample
        gradient is undefined where a sample is normalised by its batch's statistics). ``norm_stats`` average
        needs running statistics to average and a method that averages them (``Method.averages_norm_stats``)."""
        if self.norm_stats == "average":
            if not has_running_stats(model):
                raise ConfigError(f"norm_stats average: model {self.model} has no running statistics (BatchNorm "
                                  "buffers) to average; use norm_stats local (the default)")  # fmt: skip
            if not self.method_spec.averages_norm_stats:
                averaging = ", ".join(name for name, m in REGISTRY.items() if m.averages_norm_stats)
                raise ConfigError(f"norm_stats average is not implemented for method {self.method} "
                                  f"(only {averaging}); use norm_stats local")  # fmt: skip
        if not batch_normalised(model):
            return
        if self.tier_mode != "mask":
            raise ConfigError(f"tier_mode {self.tier_mode} cannot train model {self.model}: a narrow model's BatchNorm "
                              "statistics are not the full model's; use GroupNorm or tier_mode mask")  # fmt: skip
        if self.privacy != "none":
            raise ConfigError(f"privacy {self.privacy!r} cannot train model {self.model}: DP-SGD's per-sample "
                              "gradients are undefined for BatchNorm layers; use GroupNorm or LayerNorm")  # fmt: skip
        if not self.method_spec.keeps_norm_stats:
            keeping = ", ".join(name for name, m in REGISTRY.items() if m.keeps_norm_stats)
            raise ConfigError(f"method {self.method} does not keep each client's BatchNorm running statistics "
                              f"(norm_stats {self.norm_stats}): model {self.model} needs one of {keeping}, "
                              "or GroupNorm instead of BatchNorm")  # fmt: skip

    @property
    def method_spec(self) -> Method:
        """The registered method this run uses."""
        return get_method(self.method)

    @property
    def run_dir(self) -> Path:
        """``output`` (always set after construction)."""
        assert self.output is not None
        return self.output

    @property
    def neighbour_count(self) -> int:
        """``neighbours`` (always set after construction)."""
        assert self.neighbours is not None
        return self.neighbours

    @property
    def schedule_rounds(self) -> int:
        return self.planned_rounds or self.rounds

    @property
    def partition_variant(self) -> str:
        """``reference``, ``reuse`` or ``balanced`` (see ``edge_node.data.partition``)."""
        return parse_partition_spec(self.partition).variant

    @property
    def densities(self) -> list[float]:
        """Each client's target density: setting ii's tier ``i mod 5``, else ``density`` (a dense method's is 1)."""
        return client_densities(self.clients) if self.setting == "ii" else [self.density] * self.clients

    def dispfl_params(self) -> DisPFLParams:
        """The shared client round's hyper-parameters."""
        return DisPFLParams.of(self, planned_rounds=self.schedule_rounds)

    def ignored(self, given: set[str]) -> list[str]:
        """Warnings for settings in ``given`` (field names the user set) that this run does not use."""
        out = []
        method, topo = self.method_spec, self.topology
        for name in sorted(given & METHOD_SETTINGS - method.uses):
            out.append(f"{name} is ignored by method {method.name} (used by {', '.join(users_of(name))})")
        if "topology" in method.uses and topo != "random":
            if "neighbours" in given:
                pulls = "its 2 ring neighbours" if topo == "ring" else "every other client"
                out.append(f"neighbours is ignored with topology {topo} (each client pulls from {pulls})")
            if "max_in_degree" in given:
                out.append("max_in_degree applies to the random topology only; ignored")
        return out

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values, plus the derived ``partition_variant`` (see DERIVED_KEYS)."""
        out = dataclasses.asdict(self)
        out["data_dir"] = str(self.data_dir) if self.data_dir else None
        out["init_weights"] = str(self.init_weights) if self.init_weights is not None else None
        out["trainable"] = list(self.trainable)
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
            if "screen" in self.method_spec.uses:
                notes.append("this run was saved before the receive-path screen existed and ran without it; "
                             "resumed without it (--no-screen)")  # fmt: skip
        # A resume keeps the saved micro_batch when the command leaves it at its default (a note says so): it changes
        # how a step is computed (memory), not what it computes, and its default changed. Not where this command's
        # steps take whole batches (captured: a setting a resume may change), which refuse slices.
        default, saved_micro_batch = self.default_micro_batch, then["micro_batch"]
        if default != 0 and self.micro_batch == default != saved_micro_batch:
            changes["micro_batch"] = saved_micro_batch
            notes.append(f"this run was saved with micro_batch {saved_micro_batch!r} (the default is {default!r} now); "
                         f"resumed with it (pass --micro-batch {saved_micro_batch!r} to say so)")  # fmt: skip
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
    dataset, model = (name.rpartition(":")[2] for name in (config.dataset, config.model))  # a factory: its function
    return Path(OUTPUT_PATTERN.format(
        dataset=dataset, model=model, method=config.method, partition=partition, seed=config.seed
    ))  # fmt: skip
