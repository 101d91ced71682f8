"""``NodeConfig``: every setting of a device's daemon, from a TOML file and flags, checked once at start.

Layers, later ones winning: the defaults below, the config file (``--config``, default
``/etc/edge-node/config.toml`` when it exists), the flags given. Keys are the flag names with
underscores (``--round-budget-s`` is ``round_budget_s``). ``edge-node start --print-config`` prints the
effective config as TOML that reads back.
"""

from __future__ import annotations

import math
import re
import socket
import zlib
from dataclasses import dataclass
from pathlib import Path

from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.algorithm.dp import DPConfig, check_budget
from edge_node.algorithm.norm_stats import NORM_STATS
from edge_node.data import check_dataset_name, parse_partition
from edge_node.defaults import DEFAULTS
from edge_node.energy.detect import BACKENDS
from edge_node.errors import ConfigError, DataError, ModelError
from edge_node.handover import DEFAULT_KEEP, HANDOVER_MODES, MIN_KEEP
from edge_node.models import check_model_name
from edge_node.net.discovery.bounds import parse_networks
from edge_node.net.discovery.exchange import DEFAULT_EXCHANGE_S, check_interval
from edge_node.net.discovery.static import parse_peers
from edge_node.net.server import ServerLimits
from edge_node.plugins import is_factory_path
from edge_node.protocol import (
    NODE_ID_PATTERN,
    TIER_DENSITIES,
    TIER_MODES,
    check_density,
    check_fleet_id,
    is_valid_node_id,
)
from edge_node.robust_names import AGGREGATE_HELP, check_aggregate
from edge_node.task_names import check_task_name
from edge_node.tomlconf import key
from edge_node.torch_threads import THREADS_HELP

DEFAULT_CONFIG_FILE = Path("/etc/edge-node/config.toml")
DEFAULT_STATE_DIR = Path("/var/lib/edge-node")
DEFAULT_PORT = 7878
DISCOVERY_MODES = ("mdns", "static", "both")
DEVICES = ("cpu", "cuda")
VALUE_TYPES = ("float32", "float16", "bfloat16")
PRIVACY_CHOICES = ("none", "dp-sgd")
DATA_REFRESH_MODES = ("off", "round")
DEFAULT_MAX_TRAIN_SAMPLES = 20_000  # data_refresh round: the newest this many (a CIFAR-sized image: ~3 KB each)
DEFAULT_MAX_TEST_SAMPLES = 5_000


def client_index_of(node_id: str) -> int:
    """The client index a node without one configured uses: a stable hash of its id."""
    return zlib.crc32(node_id.encode()) & 0x7FFFFFFF


def node_id_from_hostname(hostname: str | None = None) -> str:
    """This host's name as a node id: its first label, characters outside [A-Za-z0-9_-] as ``-``, <= 63."""
    name = (hostname if hostname is not None else socket.gethostname()).split(".")[0]
    candidate = re.sub(r"[^A-Za-z0-9_-]", "-", name)[:63].strip("-_")
    if not is_valid_node_id(candidate):
        raise ConfigError(
            f"cannot derive a node id from the host name {name!r}; set node_id (pattern {NODE_ID_PATTERN})"
        )
    return candidate


@dataclass(frozen=True)
class NodeConfig:
    """Everything ``edge-node start`` needs; see the module docstring for where values come from."""

    # Identity: who this node is, in which fleet, and the fleet-wide seed (same initial weights everywhere).
    node_id: str = key("", "This node's id, mDNS name and TLS name [default: from the host name].")
    fleet: str = key("", "Fleet id (required): nodes of other fleets are ignored.")
    seed: int = key(DEFAULTS.seed, "Fleet seed: every node starts from the same initial weights.")
    client_index: int | None = key(None, "Its random streams and data slice [default: from the node id].")
    # Model and local data.
    model: str = key(
        DEFAULTS.model,
        "Model: cnn, resnet18, vgg11, an installed plug-in's name or a factory package.module:function (the same "
        "on every node of a fleet).",
    )
    task: str = key(
        DEFAULTS.task,
        "What is learnt: classification, regression, multilabel or a factory package.module:function (its loss, "
        "labels and headline metric; the same on every node of a fleet).",
    )
    init_weights: Path | None = key(
        None,
        "Every node's start: a safetensors file or a weights-only state_dict (never a pickle); parameters it leaves "
        "out (a new head) come from the fleet seed. The same file on every node of a fleet.",
    )
    trainable: tuple[str, ...] = key(
        (),
        "Train only the parameters matching these globs (layer4.*,linear.*); the rest stay frozen, are never sent "
        "[default: all train]. The same on every node of a fleet.",
    )
    num_classes: int | None = key(None, "Fleet-wide number of classes [default: from the data].")
    classes: tuple[str, ...] = key((), "Fleet-wide class names; an image folder's class folders map onto them.")
    data: Path | None = key(None, "Own data: image-folder tree (train/, test/), CIFAR batches, or a .tar.gz.")
    dataset: str = key(
        DEFAULTS.dataset,
        "Without --data: cifar10, cifar100, tiny-imagenet, demo or a data factory package.module:function, sliced "
        "by --partition.",
    )
    data_dir: Path | None = key(None, "Where --dataset's files are.")
    partition: str = key(DEFAULTS.partition, "How --dataset is split among --num-clients: dir:ALPHA or path:K.")
    num_clients: int = key(1, "Clients --dataset is split among (1: all of it is this node's).")
    data_refresh: str = key(
        "off",
        "round: re-read --data (or call the data factory again) at each round boundary and train on what is there "
        "now, decoding only new or changed files; needs the fleet's classes (a factory: num_classes). off: read "
        "once at start, so that runs are reproducible.",
        choices=DATA_REFRESH_MODES,
    )
    data_test_fraction: float = key(
        0.2,
        "Test share of a flat data folder (<class>/*, with data_refresh round) and of a data factory that returns "
        "(samples, None): a sample's side follows a hash of its bytes and never moves.",
    )
    max_train_samples: int = key(
        DEFAULT_MAX_TRAIN_SAMPLES,
        "With data_refresh round: train on the newest N samples (by file mtime; a factory's last N), so memory "
        "does not grow with the folder. 0: all.",
    )
    max_test_samples: int = key(DEFAULT_MAX_TEST_SAMPLES, "With data_refresh round: test on the newest N. 0: all.")
    # State, network, discovery.
    state_dir: Path = key(
        DEFAULT_STATE_DIR,
        "Checkpoint, rounds.jsonl, energy.jsonl, status socket, handover/ (the model for applications).",
    )
    listen: str = key(f"0.0.0.0:{DEFAULT_PORT}", "HOST:PORT of the peer gRPC service (port 0: any free port).")
    discovery: str = key("mdns", "mdns, static (--peers) or both.")
    interfaces: tuple[str, ...] = key((), "mDNS interfaces, names or addresses [default: those with a default route].")
    peers: tuple[str, ...] = key((), "Static peers: HOST:PORT,... (ID@HOST:PORT with TLS or lockstep).")
    peer_exchange_s: float = key(
        DEFAULT_EXCHANGE_S,
        "Peer exchange (protocol 1.4): every this many seconds ask the peers the node reaches for the peers they "
        "reached, and list those it verifies itself (fleets beyond one link). 0: off (always off under lockstep).",
    )
    allowed_subnets: tuple[str, ...] = key(
        (),
        "CIDR subnets peers may be in, for mDNS and peer exchange (10.1.0.0/16,fd00::/64) [default: mDNS the "
        "node's own subnets; peer exchange those plus each seed address's /24 or /64].",
    )
    server_max_connections: int = key(512, "TCP connections the peer service holds at once; the fd limit must fit.")
    server_max_calls_per_host: int = key(8, "Calls one host may have open on the peer service (of 64 in all).")
    server_max_connections_per_host: int = key(32, "TCP connections one host may hold; the newest beyond are shut.")
    server_max_connection_age_s: float = key(60.0, "A connection is ended this long (+60 s grace) after it opened.")
    server_request_timeout_s: float = key(2.0, "A peer's call must send its request within this; else it is ended.")
    server_host_rate: float = key(
        ServerLimits().host_rate,
        "Calls per second one host (an IPv4 address, an IPv6 /64) may start on the peer service, 2 s worth at once;"
        " beyond: refused (host-rate). Sized for 10 lock-step nodes behind one NAT address.",
    )
    # Rounds.
    neighbours: int = key(DEFAULTS.neighbours, "Peers pulled per round.")
    rounds: int = key(0, "Stop after this many completed rounds (0: run until stopped).")
    planned_rounds: int = key(DEFAULTS.planned_rounds, "T of the prune schedule.")
    round_budget_s: float = key(
        DEFAULTS.round_budget_s, "Target seconds per round (capacity rule); longest wait for slower peers."
    )
    pull_timeout_s: float = key(
        DEFAULTS.pull_timeout_s, "Longest wait for a round's pulls; the round goes on with what arrived."
    )
    staleness: int = key(5, "Drop snapshots more than this many rounds behind this node's round.")
    lockstep: bool = key(False, "The synchronous algorithm: wait for the fleet each round, seeded neighbours.")
    # Capacity (DisPFL setting ii).
    capacity: str | float = key(
        DEFAULTS.capacity, "auto (measure; picks a tier 0.2 .. 1.0) or a fixed density in (0, 1]."
    )
    tier_mode: str = key(
        "mask",
        "What a capacity tier buys (one mode per fleet): mask (a sparse mask at the tier's density over the full "
        "model: bytes on the wire), width (the tier's narrow model, the first channels of every hidden layer, dense "
        "inside: its compute shrinks too), both (the narrow model with a mask at --density inside it). Width modes "
        "take a tier for --capacity (0.2, 0.4, 0.6, 0.8, 1.0 or auto).",
        choices=TIER_MODES,
    )
    density: float = key(0.5, "tier_mode both: the density of the mask inside the tier's narrow model.")
    capacity_recheck_rounds: int = key(
        2,
        "capacity auto: measure again, and move to the tier that fits, when the CPU the node can get (its quota less "
        "other programs' load) changes by a quarter or more for this many rounds in a row. 0: only at start.",
    )
    # Training.
    epochs: int = key(DEFAULTS.epochs, "Local epochs per round.")
    batch_size: int = key(DEFAULTS.batch_size, "Training batch size.")
    micro_batch: int = key(
        DEFAULTS.micro_batch,
        "Samples through the model at once; a larger batch's gradient is summed over slices (memory). 0: all "
        "(always, for a BatchNorm model: its statistics come from the whole batch).",
    )
    lr: float = key(DEFAULTS.lr, "Initial learning rate (times --lr-decay per round).")
    lr_decay: float = key(DEFAULTS.lr_decay, "Learning-rate decay per round.")
    weight_decay: float = key(DEFAULTS.weight_decay, "Weight decay.")
    clip_norm: float = key(DEFAULTS.clip_norm, "Gradient-norm clipping.")
    prune_alpha: float = key(DEFAULTS.prune_alpha, "Initial prune fraction of the cosine schedule.")
    regrow: str = key(DEFAULTS.regrow, "Regrowth: random (reference code) or gradient (paper).")
    mask_init: str = key(
        DEFAULTS.mask_init, "Initial mask: erk, uniform or magnitude (the start's largest |w| at ERK's counts)."
    )
    norm_stats: str = key(
        DEFAULTS.norm_stats,
        "A BatchNorm model's running statistics: local (FedBN: kept by this node, checkpointed, used in its "
        "evaluation, never sent) or average (sent with the model to peers that average too, protocol 1.3, and "
        "averaged with theirs; refused for a model without them). A BatchNorm model trains whole batches "
        "(--micro-batch is 0 for it).",
    )
    aggregate: str = key(DEFAULTS.aggregate, AGGREGATE_HELP, metavar="mean|median|trimmed:BETA")
    device: str = key(DEFAULTS.device, "cpu or cuda.")
    threads: int | None = key(DEFAULTS.threads, THREADS_HELP)
    # Security.
    tls_ca: Path | None = key(None, "Fleet CA certificate (PEM).")
    tls_cert: Path | None = key(None, "This node's certificate, issued for its node id.")
    tls_key: Path | None = key(None, "This node's private key (mode 0600).")
    insecure: bool = key(False, "Plaintext, unauthenticated peer traffic (logged as a warning).")
    # Measurement and outputs.
    energy_backend: str = key("auto", "Energy meter: auto, nvml, rapl, jetson, rpi5 or estimate.")
    value_type: str = key("float32", "How published values travel: float32, float16 or bfloat16.")
    export_onnx: bool = key(
        True,
        "Hand the personalized model to the device's application after each round: STATE_DIR/handover/ (ONNX of "
        "raw input + model.json; see --handover) and model.onnx (normalised input; kept for one release). "
        "false: nothing is written.",
    )
    handover: str = key(
        "best",
        "Which round's model STATE_DIR/handover/ holds: best (a round's model replaces it only when it scores no "
        "worse on the node's current test set than the handed-over one, re-scored there, minus "
        "--handover-tolerance) or latest (every round's).",
        choices=HANDOVER_MODES,
    )
    handover_keep: int = key(
        DEFAULT_KEEP, f"Handed-over models kept in STATE_DIR/handover/, the current one always (at least {MIN_KEEP})."
    )
    handover_tolerance: float | None = key(
        None,
        "How much worse (in the task metric's units) a round's model may score and still be handed over under "
        "handover = best [default: one test sample's worth: 1/n for accuracy, MAE/n for an error].",
    )
    privacy: str = key(
        "none",
        "dp-sgd: train with per-sample clipping and Gaussian noise so that what the node publishes is "
        "(epsilon, delta)-DP for its local samples; it stops publishing when the budget is spent.",
    )
    epsilon: float | None = key(None, "Privacy budget (dp-sgd), spent by planned_rounds rounds.")
    delta: float = key(1e-5, "Privacy delta (dp-sgd).")
    dp_clip: float = key(1.0, "DP-SGD per-sample gradient clip C.")
    metrics_listen: str = key(
        "", "HOST:PORT of the Prometheus metrics endpoint [default: off]; 127.0.0.1:9478 keeps it on the device."
    )

    def __post_init__(self) -> None:
        if self.node_id and not is_valid_node_id(self.node_id):
            raise ConfigError(f"node_id={self.node_id!r} must match {NODE_ID_PATTERN}")
        if self.fleet:
            try:
                check_fleet_id(self.fleet)  # the rule discovery, headers and Hello apply
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        try:
            check_model_name(self.model)
            check_dataset_name(self.dataset)
        except (ModelError, DataError) as exc:
            raise ConfigError(str(exc)) from None
        check_task_name(self.task)
        self._check_start()
        if self.task != "classification" and self.data is not None:
            raise ConfigError(f"task={self.task!r} needs a data factory (dataset = \"package.module:function\"); "
                              "a data folder holds image classes")  # fmt: skip
        parse_partition(self.partition)
        _at_least("num_clients", self.num_clients, 1)
        self._check_data_refresh()
        if self.client_index is not None and not 0 <= self.client_index < max(self.num_clients, 2**31):
            raise ConfigError(f"client_index={self.client_index} must be >= 0")
        if self.data is None and self.num_clients > 1 and self.client_index is None:
            raise ConfigError(f"num_clients={self.num_clients} needs client_index: which slice is this node's")
        if self.client_index is not None and self.data is None and self.client_index >= self.num_clients:
            raise ConfigError(f"client_index={self.client_index} must be < num_clients={self.num_clients}")
        if self.num_classes is not None:
            _at_least("num_classes", self.num_classes, 2)
        if self.classes and self.num_classes is not None and len(self.classes) != self.num_classes:
            raise ConfigError(f"classes lists {len(self.classes)} names but num_classes={self.num_classes}")
        if self.discovery not in DISCOVERY_MODES:
            raise ConfigError(f"discovery={self.discovery!r} must be one of {', '.join(DISCOVERY_MODES)}")
        if self.discovery in ("static", "both") and not self.peers:
            raise ConfigError(f"discovery={self.discovery!r} needs peers (--peers HOST:PORT,...)")
        _check_listen(self.listen)
        check_interval(self.peer_exchange_s)
        parse_networks(self.allowed_subnets)  # ConfigError naming a bad subnet
        self.server_limits()  # ConfigError quoting a bad server_* value
        if self.metrics_listen:
            _check_listen(self.metrics_listen, "metrics_listen")
        _at_least("neighbours", self.neighbours, 1)
        _at_least("rounds", self.rounds, 0)
        _at_least("staleness", self.staleness, 0)
        if not math.isfinite(self.pull_timeout_s) or self.pull_timeout_s <= 0:
            raise ConfigError(f"pull_timeout_s={self.pull_timeout_s} must be a positive number of seconds")
        if not math.isfinite(self.round_budget_s) or self.round_budget_s <= 0:
            raise ConfigError(f"round_budget_s={self.round_budget_s} must be a positive number of seconds")
        self.fixed_density  # noqa: B018 -- checks `capacity`
        self._check_tier_mode()
        _at_least("capacity_recheck_rounds", self.capacity_recheck_rounds, 0)
        listed = parse_peers(list(self.peers)) if self.peers else []  # ConfigError naming a bad entry
        if self.lockstep and (
            self.client_index is None or self.discovery != "static" or not all(p.node_id for p in listed)
        ):
            raise ConfigError(
                'lockstep needs client_index and discovery = "static" with peers listing the whole fleet as'
                " ID@HOST:PORT in client-index order (this node included)"
            )
        if self.lockstep and (self.client_index or 0) >= len(listed):
            raise ConfigError(f"lockstep: client_index={self.client_index} but peers lists {len(listed)} nodes")
        if self.norm_stats not in NORM_STATS:
            raise ConfigError(f"norm_stats={self.norm_stats!r} must be one of {', '.join(NORM_STATS)}")
        check_aggregate(self.aggregate)
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r} must be one of {', '.join(DEVICES)}")
        if self.threads is not None:
            _at_least("threads", self.threads, 1)
        if self.energy_backend not in BACKENDS:
            raise ConfigError(f"energy_backend={self.energy_backend!r} must be one of {', '.join(BACKENDS)}")
        if self.handover not in HANDOVER_MODES:
            raise ConfigError(f"handover={self.handover!r} must be one of {', '.join(HANDOVER_MODES)}")
        _at_least("handover_keep", self.handover_keep, MIN_KEEP)
        if self.handover_tolerance is not None and not (
            math.isfinite(self.handover_tolerance) and self.handover_tolerance >= 0
        ):
            raise ConfigError(f"handover_tolerance={self.handover_tolerance} must be a number >= 0")
        if self.value_type not in VALUE_TYPES:
            raise ConfigError(f"value_type={self.value_type!r} must be one of {', '.join(VALUE_TYPES)}")
        tls = [self.tls_ca, self.tls_cert, self.tls_key]
        if any(tls) and not all(tls):
            raise ConfigError("TLS needs all three of tls_ca, tls_cert and tls_key")
        if all(tls) and self.insecure:
            raise ConfigError("tls_* files and insecure exclude each other")
        bare = [p.endpoint for p in listed if p.node_id is None]
        if all(tls) and bare and self.discovery in ("static", "both"):
            raise ConfigError(
                f"static peers need ID@HOST:PORT under TLS (the id is the certificate name the handshake verifies);"
                f" {', '.join(bare)} has none"
            )
        self.dispfl_params()  # the round's own checks: epochs, batch size, lr, schedule, regrow, mask init
        if self.privacy not in PRIVACY_CHOICES:
            raise ConfigError(f"privacy={self.privacy!r} must be one of {', '.join(PRIVACY_CHOICES)}")
        if self.privacy == "dp-sgd":
            check_budget(self.epsilon, self.delta)
            DPConfig(self.dp_clip, 1.0)  # checks dp_clip
            if self.regrow == "gradient":
                raise ConfigError("privacy dp-sgd needs regrow = random: gradient regrowth reads a batch without noise")

    def _check_data_refresh(self) -> None:
        """``data_refresh`` and its bounds: it re-reads the node's own data, into a model of fixed outputs."""
        if self.data_refresh not in DATA_REFRESH_MODES:
            raise ConfigError(f"data_refresh={self.data_refresh!r} must be one of {', '.join(DATA_REFRESH_MODES)}")
        fraction = self.data_test_fraction
        if not (isinstance(fraction, (int, float)) and math.isfinite(fraction) and 0 < fraction < 1):
            raise ConfigError(f"data_test_fraction={fraction!r} must be a share between 0 and 1 (exclusive)")
        _at_least("max_train_samples", self.max_train_samples, 0)
        _at_least("max_test_samples", self.max_test_samples, 0)
        if self.data_refresh == "off":
            for name, value, default in (
                ("max_train_samples", self.max_train_samples, DEFAULT_MAX_TRAIN_SAMPLES),
                ("max_test_samples", self.max_test_samples, DEFAULT_MAX_TEST_SAMPLES),
            ):
                if value != default:
                    raise ConfigError(f'{name}={value} bounds data that is re-read: it needs data_refresh = "round"')
            return
        factory = self.data is None and is_factory_path(self.dataset)
        if self.data is None and not factory:
            raise ConfigError(
                f'data_refresh = "round" re-reads the node\'s own data (data = FOLDER, or dataset = '
                f'"package.module:function"); dataset = {self.dataset!r} is a built-in set\'s slice'
            )
        if factory and self.num_clients > 1:
            raise ConfigError(f'data_refresh = "round" re-reads the node\'s own data: a data factory with '
                              f"num_clients={self.num_clients} is a slice of a shared set")  # fmt: skip
        if self.data is not None and not self.classes:
            raise ConfigError('data_refresh = "round" needs the fleet\'s classes (classes = ["cat", "dog", ...]): a '
                              "new class folder must not change the model's outputs")  # fmt: skip
        if factory and not self.classes and self.num_classes is None:
            raise ConfigError('data_refresh = "round" with a data factory needs num_classes (or classes): a new label '
                              "must not change the model's outputs")  # fmt: skip
        if self.privacy == "dp-sgd":
            raise ConfigError('privacy dp-sgd accounts for a fixed set of samples: data_refresh = "round" excludes it')

    def _check_tier_mode(self) -> None:
        """``tier_mode`` and what width tiers cannot run with (the model's own check comes at start: BatchNorm, a
        plug-in without ``width``)."""
        if self.tier_mode not in TIER_MODES:
            raise ConfigError(f"tier_mode={self.tier_mode!r} must be one of {', '.join(TIER_MODES)}")
        try:
            check_density(self.density)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.tier_mode == "mask":
            return
        fixed = self.fixed_density
        if fixed is not None and not any(math.isclose(fixed, d) for d in TIER_DENSITIES):
            tiers = ", ".join(f"{d:g}" for d in TIER_DENSITIES)
            raise ConfigError(f"tier_mode {self.tier_mode}: capacity={self.capacity!r} must be a tier ({tiers}) or "
                              "auto: a peer takes a stream's shapes from its tier")  # fmt: skip
        if self.trainable:
            raise ConfigError(f"tier_mode {self.tier_mode} trains narrow models of every layer; trainable (frozen "
                              "layers) is not implemented with it")  # fmt: skip
        if self.privacy != "none":
            raise ConfigError(f"tier_mode {self.tier_mode} with privacy {self.privacy!r} is not implemented")
        if self.norm_stats == "average":
            raise ConfigError(f"tier_mode {self.tier_mode} trains GroupNorm models only: norm_stats average needs "
                              "BatchNorm statistics")  # fmt: skip

    def _check_start(self) -> None:
        """Normalise ``init_weights`` and ``trainable`` (the file and globs are checked against the model at start)."""
        from edge_node.algorithm.frozen import parse_globs

        if self.init_weights is not None:
            object.__setattr__(self, "init_weights", Path(self.init_weights))
        object.__setattr__(self, "trainable", parse_globs(self.trainable))
        if self.trainable and self.privacy == "dp-sgd":
            raise ConfigError("privacy dp-sgd trains every parameter: trainable (frozen layers) excludes it")

    def server_limits(self) -> ServerLimits:
        """The peer service's limits from the ``server_*`` keys (the rest at their defaults)."""
        return _server_limits(self)

    def check_runnable(self) -> None:
        """What a running node needs beyond valid values: a fleet, and TLS material or an explicit --insecure."""
        if not self.fleet:
            raise ConfigError('fleet is required (--fleet, or fleet = "..." in the config file)')
        if not self.tls_enabled and not self.insecure:
            raise ConfigError(
                "no TLS material: give tls_ca, tls_cert and tls_key (see edge-node certs), or run plaintext"
                " with --insecure"
            )

    @property
    def fixed_density(self) -> float | None:
        """The density ``capacity`` fixes, any in (0, 1] (setting (i) runs every node at 0.5), or None for ``auto``."""
        text = str(self.capacity).strip().lower()
        if text == "auto":
            return None
        try:
            return check_density(float(text))
        except ValueError:
            tiers = ", ".join(f"{d:g}" for d in TIER_DENSITIES)
            raise ConfigError(
                f"capacity={self.capacity!r} must be auto (measure; picks a tier: {tiers}) or a density in (0, 1]"
            ) from None

    @property
    def tls_enabled(self) -> bool:
        return self.tls_ca is not None

    @property
    def resolved_node_id(self) -> str:
        """``node_id``, or the one derived from the host name."""
        return self.node_id or node_id_from_hostname()

    @property
    def resolved_client_index(self) -> int:
        """``client_index``, or a stable hash of the node id (which slice of the data set and which draws are its)."""
        if self.client_index is not None:
            return self.client_index
        return client_index_of(self.resolved_node_id)

    def dispfl_params(self) -> DisPFLParams:
        """The shared client round's hyper-parameters."""
        return DisPFLParams.of(self)


def _server_limits(config: NodeConfig) -> ServerLimits:
    try:
        return ServerLimits(
            max_connections=config.server_max_connections,
            max_calls_per_host=config.server_max_calls_per_host,
            request_timeout_s=config.server_request_timeout_s,
            max_connections_per_host=config.server_max_connections_per_host,
            max_connection_age_s=config.server_max_connection_age_s,
            host_rate=config.server_host_rate,
        )
    except ValueError as exc:
        raise ConfigError(f"server_{exc}") from None


def _at_least(name: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{name}={value} must be at least {low}")


def _check_listen(address: str, key: str = "listen") -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{key}={address!r} must be HOST:PORT with PORT in 0..65535 (0 picks a free port)")
