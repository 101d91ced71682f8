"""``FleetConfig``: the settings of a loopback fleet, checked once before anything is started or written.

Each node ``i`` (id ``node<i>``) runs ``edge-node start`` with the fleet-wide settings below and its own
state directory (``OUTPUT/node<i>``), port and data slice (``--dataset X --num-clients N --client-index i
--partition P``): the slice the simulation gives client ``i``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_node.defaults import DEFAULTS, neighbours_of, preset, threads_of
from edge_node.errors import ConfigError
from edge_node.robust_names import ATTACKS, check_aggregate, parse_attack
from edge_node.task_names import check_task_name

if TYPE_CHECKING:
    from edge_node.fleet.devices import DeviceProfile

MAX_NODES = 64  # one machine; the bridge would take 250
DEFAULT_OUTPUT = Path("runs/loopback")
NODE_PREFIX = "node"
NETNS_PORT = 7878  # every node has its own network stack in --netns mode, so they share the port number
DEFAULT_SUBNET = "10.78.0"  # inside the fleet's own namespaces only, never on the machine's interfaces
CONFIG_FILE = "fleet-config.json"
# Settings a re-run of the same output directory may change (the rest must match the saved fleet).
RESUMABLE_CHANGES = frozenset({"rounds", "output", "progress", "pull_timeout_s", "round_budget_s", "daemon_args",
                               "link", "data_dir", "metrics", "threads"})  # fmt: skip
_SUBNET_RE = re.compile(r"^(\d{1,3})\.(\d{1,3})\.(\d{1,3})$")
COMMAND = "loopback"  # its name in the demo preset's table (edge_node.defaults.PRESETS)
# Settings left None take a default on construction: the demo preset's on the demo set, else the shared table's.
DEFAULTED = ("neighbours", "epochs", "batch_size", "lr", "capacity", "threads")


@dataclass(frozen=True)
class FleetConfig:
    """A loopback fleet; node settings mirror ``edge-node start``'s keys of the same names."""

    nodes: int = 4
    rounds: int = 5  # 0: until stopped
    output: Path = DEFAULT_OUTPUT
    netns: bool = False  # each node in its own namespace on a bridge, found over mDNS (root)
    link: str | None = None  # "rate=10mbit,delay=20ms,loss=1%" (needs netns)
    devices: str | None = None  # "pi4:2,pi5:1" or "cpu=0.25,mem=1g,rate=20mbit" (edge_node.fleet.devices)
    lockstep: bool = False  # the synchronous algorithm: seeded neighbours, wait for the fleet each round
    tls: bool = False  # mutual TLS with a fleet CA made in OUTPUT/tls
    metrics: bool = False  # each node's Prometheus endpoint (metrics_listen), listed in OUTPUT/metrics-targets.json
    fleet: str = "loopback"
    seed: int = DEFAULTS.seed
    model: str = DEFAULTS.model
    init_weights: Path | None = None  # every node's start (edge_node.pretrained); None: the fleet seed's
    trainable: tuple[str, ...] = ()  # globs of the parameters that train (edge_node.algorithm.frozen); (): all
    task: str = DEFAULTS.task  # edge_node.algorithm.tasks: every node's
    norm_stats: str = DEFAULTS.norm_stats  # a BatchNorm model's running statistics: local (FedBN) or average
    aggregate: str = (
        DEFAULTS.aggregate
    )  # every node's per-coordinate aggregate (edge_node.algorithm.robust_aggregation)
    dataset: str = DEFAULTS.dataset
    data_dir: Path | None = None
    partition: str = DEFAULTS.partition
    # None (``DEFAULTED``): filled in on construction, see ``defaults``.
    neighbours: int | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    capacity: str | None = None  # every node's density in (0, 1], or "auto" (each measures its own and picks a tier)
    tier_mode: str = "mask"  # what a tier buys, the fleet's one mode: mask, width or both (edge_node.node.width_tiers)
    density: float | None = None  # tier_mode both: the mask's density inside the narrow model (None: start's default)
    planned_rounds: int | None = None  # None: rounds (or the shared 500 when running until stopped)
    threads: int | None = None  # torch threads per daemon
    pull_timeout_s: float = DEFAULTS.pull_timeout_s
    round_budget_s: float = DEFAULTS.round_budget_s
    energy_backend: str = "estimate"  # a machine-wide meter would count the same joules once per node
    progress: bool = True
    daemon_args: tuple[str, ...] = ()  # more `edge-node start` flags, given to every node
    subnet: str = DEFAULT_SUBNET
    # Poisoning (edge_node.algorithm.poison): the last ``attackers`` nodes publish poisoned models. Never a node
    # setting: passed to the daemons by edge_node.cli._attacker, which ``edge-node start`` does not accept.
    attackers: int = 0
    attack: str | None = None

    def __post_init__(self) -> None:
        check_task_name(self.task)
        check_aggregate(self.aggregate)
        for name, value in self.defaults().items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if not 2 <= self.nodes <= MAX_NODES:
            raise ConfigError(f"--nodes {self.nodes} must be in 2..{MAX_NODES}")
        if self.rounds < 0:
            raise ConfigError(f"--rounds {self.rounds} must be >= 0 (0: run until stopped)")
        if self.link is not None and not self.netns:
            raise ConfigError("--link needs --netns: shaping 127.0.0.1 would slow down every program of this machine")
        if self.neighbours is not None and self.neighbours < 1:
            raise ConfigError(f"--neighbours {self.neighbours} must be at least 1")
        if self.lockstep and self.neighbours is not None and self.neighbours > self.nodes - 1:
            raise ConfigError(f"--neighbours {self.neighbours}: a lock-step fleet of {self.nodes} has "
                              f"{self.nodes - 1} others to pick from")  # fmt: skip
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads {self.threads} must be at least 1")
        if self.dataset in ("cifar10", "cifar100", "tiny-imagenet") and self.data_dir is None:
            raise ConfigError(f"--dataset {self.dataset} needs --data-dir (only the demo set is built in)")
        if self.data_dir is not None and not Path(self.data_dir).exists():
            raise ConfigError(f"--data-dir {self.data_dir} does not exist")
        match = _SUBNET_RE.match(self.subnet)
        if match is None or not all(0 <= int(g) <= 255 for g in match.groups()):
            raise ConfigError(f"subnet {self.subnet!r} must be three octets, e.g. 10.78.0")
        if self.link is not None:
            from edge_node.fleet.link import LinkSpec

            LinkSpec.parse(self.link)
        if self.devices is not None:
            shaped = [p.name for p in self.profiles if p.link.describe()]
            if shaped and not self.netns:
                raise ConfigError(f"--devices: {shaped[0]} has a link rate or loss, which needs --netns (shaping "
                                  "127.0.0.1 would slow down every program of this machine)")  # fmt: skip
        self._check_poisoning()
        object.__setattr__(self, "output", Path(self.output))
        object.__setattr__(self, "daemon_args", tuple(self.daemon_args))
        parts = [self.trainable] if isinstance(self.trainable, str) else list(self.trainable)
        object.__setattr__(self, "trainable", tuple(g.strip() for p in parts for g in str(p).split(",") if g.strip()))
        if self.init_weights is not None:
            if not Path(self.init_weights).is_file():
                raise ConfigError(f"--init-weights {self.init_weights}: no such file")
            object.__setattr__(self, "init_weights", Path(self.init_weights).resolve())  # the daemons' cwd may differ

    def _check_poisoning(self) -> None:
        if isinstance(self.attackers, bool) or not isinstance(self.attackers, int) or self.attackers < 0:
            raise ConfigError(f"--attackers {self.attackers!r} must be an integer >= 0")
        if self.attackers >= self.nodes:
            raise ConfigError(f"--attackers {self.attackers} must be below the fleet's {self.nodes} nodes (an honest "
                              "node is what is measured)")  # fmt: skip
        if self.attackers and self.attack is None:
            raise ConfigError(f"--attackers {self.attackers} needs --attack (one of {', '.join(ATTACKS)})")
        if self.attack is not None and not self.attackers:
            raise ConfigError(f"--attack {self.attack} needs --attackers K (K >= 1)")
        if self.attack is not None:
            parse_attack(self.attack, self.rounds)  # ConfigError naming the value
            if self.attack == "label-flip" and self.task != "classification":
                raise ConfigError(f"--attack label-flip flips class labels: task {self.task} has none")

    @property
    def attacker_ids(self) -> list[str]:
        """The nodes that attack: the last ``attackers`` of the fleet (node0 is always honest)."""
        return self.node_ids[self.nodes - self.attackers :] if self.attackers else []

    @property
    def profiles(self) -> list[DeviceProfile]:
        """Each node's device profile (node i: element i); empty without ``devices``."""
        from edge_node.fleet.devices import parse_devices

        return parse_devices(self.devices, self.nodes) if self.devices is not None else []

    @property
    def node_ids(self) -> list[str]:
        return [f"{NODE_PREFIX}{i}" for i in range(self.nodes)]

    def defaults(self) -> dict[str, Any]:
        """The default of each ``DEFAULTED`` setting for this fleet: the demo preset's on the demo set, else the
        shared table's; neighbours at most the other nodes, and the machine's cores shared among the nodes."""
        shared = {"neighbours": neighbours_of(self.nodes - 1), "epochs": DEFAULTS.epochs,
                  "batch_size": DEFAULTS.batch_size, "lr": DEFAULTS.lr, "capacity": DEFAULTS.capacity,
                  "threads": threads_of(self.nodes)}  # fmt: skip
        return {**shared, **preset(COMMAND, self.dataset)}

    @property
    def effective_neighbours(self) -> int:
        assert self.neighbours is not None  # filled in on construction
        return self.neighbours

    @property
    def effective_planned_rounds(self) -> int | None:
        if self.planned_rounds is not None:
            return self.planned_rounds
        return self.rounds or None

    def node_settings(self, i: int) -> dict[str, Any]:
        """``edge-node start`` config keys of node ``i`` that do not depend on where it runs."""
        settings: dict[str, Any] = {
            "node_id": self.node_ids[i],
            "fleet": self.fleet,
            "seed": self.seed,
            "client_index": i,
            "model": self.model,
            "task": self.task,
            "dataset": self.dataset,
            "partition": self.partition,
            "num_clients": self.nodes,
            "neighbours": self.effective_neighbours,
            "rounds": self.rounds,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "capacity": self.capacity,
            # The fleet's nodes share this machine: each would see the others' rounds as another program's load
            # and move tiers with them; a loopback node keeps the tier it measured at start.
            "capacity_recheck_rounds": 0,
            "threads": self.threads,
            "pull_timeout_s": self.pull_timeout_s,
            "round_budget_s": self.round_budget_s,
            "energy_backend": self.energy_backend,
            "export_onnx": False,  # one model.onnx per round per node costs CPU the fleet shares
            "lockstep": self.lockstep,
            "norm_stats": self.norm_stats,
            "aggregate": self.aggregate,
            "tier_mode": self.tier_mode,
        }
        optional = {
            "density": self.density,
            "data_dir": self.data_dir,
            "planned_rounds": self.effective_planned_rounds,
            "init_weights": self.init_weights,
            "trainable": self.trainable or None,
        }
        settings.update({k: v for k, v in optional.items() if v is not None})
        return settings

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["output"] = str(self.output)
        out["data_dir"] = str(self.data_dir) if self.data_dir is not None else None
        out["init_weights"] = str(self.init_weights) if self.init_weights is not None else None
        out["trainable"] = list(self.trainable)
        out["daemon_args"] = list(self.daemon_args)
        return out

    def differences(self, saved: dict[str, Any]) -> list[str]:
        """Settings that differ from a saved fleet's (those a re-run may change are ignored)."""
        mine = self.to_json()
        # A fleet saved before the shared defaults kept None for "the default" of some of these; that default
        # was the one they have now.
        then = {**saved, **{k: v for k, v in self.defaults().items() if saved.get(k) is None}}
        then.setdefault("attackers", 0)  # a fleet saved before poisoning had none
        then.setdefault("attack", None)
        then.setdefault("tier_mode", "mask")  # a fleet saved before width tiers ran mask tiers
        then.setdefault("density", None)
        return sorted(k for k in mine if k not in RESUMABLE_CHANGES and k != "progress" and then.get(k) != mine[k])


def settings_to_flags(settings: dict[str, Any]) -> list[str]:
    """``edge-node start`` flags for config keys (``{"pull_timeout_s": 5}`` -> ``--pull-timeout-s 5``)."""
    flags: list[str] = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, (list, tuple)):
            if value:
                flags += [flag, ",".join(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags
