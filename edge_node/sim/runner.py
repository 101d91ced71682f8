"""The synchronous simulation: N clients in one process, same ``algorithm`` functions as a device.

Every method of the paper's table runs here on the shared client round of
:mod:`edge_node.algorithm.dispfl`: ``dispfl`` (aggregate_peers, train_local, update_mask), ``dispfl-s2s``
(the same plus :func:`edge_node.algorithm.sparse_to_sparser.prune_state` on the rounds its vote and gaps
pick), and the dense baselines on all-ones masks (:mod:`edge_node.algorithm.dense`): ``local``
(train_local only), ``dpsgd``/``dpsgd-ft`` (:func:`edge_node.algorithm.dpsgd.neighbourhood_average`, then
train_local) and ``fedavg``/``fedavg-ft`` (train_local on the sampled clients,
:func:`edge_node.algorithm.fedavg.weighted_average` on the server). Every method writes the same record
fields (:data:`RECORD_KEYS`); what does not apply to a method is null.

State lives on the chosen device for the whole run: the decoded data set (uint8), every client's
weights (dense, zero outside the training mask) and bool masks. A round aggregates all clients from
the models as they were at its start, then trains and updates each client's mask; nothing is
deep-copied per peer. Randomness comes from generators derived from (seed, purpose, client, round)
and drawn on the CPU, so CPU and CUDA runs differ only by floating-point noise.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from edge_node.algorithm import (
    client_densities,
    count_correct,
    dense_nnz,
    forward_flops,
    load_weights,
    nnz_per_tensor,
    read_weights,
    round_training_flops,
    screen_peer_models,
    train_masked,
    weight_positions,
)
from edge_node.algorithm.dense import dense_state
from edge_node.algorithm.dispfl import (
    ClientState,
    DisPFLParams,
    TrainResult,
    aggregate_peers,
    published,
    start,
    train_local,
    update_mask,
)
from edge_node.algorithm.dpsgd import neighbourhood_average
from edge_node.algorithm.fedavg import sample_clients, weighted_average
from edge_node.algorithm.sparse_to_sparser import (
    is_prune_round,
    prune_state,
    stability,
    vote,
    weight_distance,
)
from edge_node.algorithm.topology import round_neighbours
from edge_node.data import Dataset, partition_clients
from edge_node.data.batches import Batch, ClientData, ImagePool
from edge_node.energy import EnergyAccountant, modelled_energy, open_meter
from edge_node.energy.base import Meter
from edge_node.errors import CheckpointError, ConfigError, ModelError, TrainingDiverged
from edge_node.models import build_model
from edge_node.seeding import Stream, torch_generator
from edge_node.sim.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from edge_node.sim.config import (
    CENTRALISED_METHODS,
    DECENTRALISED_METHODS,
    SPARSE_METHODS,
    SimConfig,
    saved_settings,
)
from edge_node.sim.report import ACCURACY_PLOT, COMMUNICATION_PLOT, ROUNDS_LOG, SUMMARY_FILE
from edge_node.storage import append_line, atomic_write_text, truncate_jsonl
from edge_node.wire import ModelSpec, ValueType, encoded_model_size

_LOGGER = logging.getLogger(__name__)

ENERGY_LOG = "energy.jsonl"
CONFIG_FILE = "config.json"
CLIENTS_FILE = "clients.json"  # each client's training/test sizes and class counts (report --masks reads it)
# Everything a run directory holds (what --fresh discards).
RUN_FILES = (
    CHECKPOINT_NAME, CHECKPOINT_NAME + ".tmp", ROUNDS_LOG, ENERGY_LOG, CONFIG_FILE, CLIENTS_FILE, SUMMARY_FILE,
    ACCURACY_PLOT, COMMUNICATION_PLOT,
)  # fmt: skip
SIM_FLEET_ID = "sim"  # header fields the byte count uses: node ids are client-<i>, the FedAvg server "server"
SERVER_ID = "server"
PAPER_BYTES_PER_VALUE = 4  # the paper's Comm (MB): fp32 values of the received models, 1 MB = 1e6 B
# What each method's headline accuracy ("acc_mean") is: the mean over clients of acc_before or acc_after.
HEADLINE = {
    "dispfl": "after", "dispfl-s2s": "after", "local": "after", "dpsgd": "before", "dpsgd-ft": "after",
    "fedavg": "before", "fedavg-ft": "after",
}  # fmt: skip
# What acc_before / acc_after measure, per method (also in every record as "acc_before_is" / "acc_after_is").
ACC_MEANING = {
    "dispfl": ("aggregated personal model, before local training", "after local training"),
    "dispfl-s2s": ("aggregated personal model, before local training", "after local training and any further prune"),
    "local": ("before this round's local training", "after local training"),
    "dpsgd": ("neighbourhood average", "neighbourhood average fine-tuned by the round's E local epochs"),
    "dpsgd-ft": ("neighbourhood average", "neighbourhood average fine-tuned by the round's E local epochs"),
    "fedavg": ("global model after the server's average", None),
    "fedavg-ft": ("global model after the server's average", "global model fine-tuned locally for E epochs"),
}
# The fields of every round record, whatever the method (null where one does not apply).
RECORD_KEYS = (
    "round", "method", "partition", "partition_variant", "lr", "prune_rate", "acc_mean", "acc_metric",
    "acc_before_mean", "acc_after_mean", "acc_before", "acc_after", "acc_before_is", "acc_after_is",
    "train_loss_mean", "trained_clients", "bytes_received", "bytes_sent", "server_bytes_received",
    "server_bytes_sent", "bytes_received_mean", "busiest_node", "busiest_node_bytes", "paper_comm_mb_mean",
    "paper_comm_mb_busiest", "flops_per_client_mean", "flops_per_client_max", "density_mean", "densities_target",
    "forward_flops_dense", "s2s_pruned", "s2s_start_round", "s2s_stable_fraction", "s2s_stability_median",
    "screen", "screen_refusals", "screen_refused", "modelled_energy", "wall_s",
)  # fmt: skip


def partition(config: SimConfig, dataset: Dataset) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Training and test index arrays per client for ``config`` (see ``data.partition_clients``)."""
    return partition_clients(
        dataset.train_y, dataset.test_y, dataset.num_classes, config.partition, config.clients, config.seed,
        config.samples_per_client,
    )  # fmt: skip


def accuracy(model: torch.nn.Module, data: ClientData, batch_size: int) -> float:
    """Top-1 accuracy of ``model`` as it is on the client's test samples."""
    correct, total = count_correct(model, data.eval_batches(batch_size))
    return correct / max(total, 1)


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work so energy and time land in the phase that caused them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_model_input(model: str, image_shape: tuple[int, int, int], num_classes: int = 10, seed: int = 0) -> nn.Module:
    """The model ``model`` built for ``num_classes``, once one image of ``image_shape`` went through it.

    ConfigError (one line) when it cannot take such images: ``cnn``'s fc1 is sized for 32x32, ``vgg11``'s
    classifier for a 1x1 map after five pools (32x32); ``resnet18`` pools globally and takes both sizes.
    Called before anything in the run directory changes, so a mismatch writes and deletes nothing.
    """
    channels, height, width = image_shape
    if model == "cnn" and (height, width) != (32, 32):
        raise ConfigError(f"model cnn takes 32x32 images; this data set's are {height}x{width}: use resnet18")
    try:
        built = build_model(model, num_classes, seed=seed)
    except ModelError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        with torch.no_grad():  # GroupNorm only: a forward pass changes no state
            logits = built(torch.zeros(1, channels, height, width))
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fits = "use resnet18" if model != "resnet18" else "use another --model"
        raise ConfigError(
            f"model {model} cannot take this data set's {height}x{width} images ({reason}): {fits}"
        ) from None
    if tuple(logits.shape) != (1, num_classes):
        raise ConfigError(f"model {model} gives outputs of shape {tuple(logits.shape)} for one {height}x{width} "
                          f"image; {num_classes} class scores were expected")  # fmt: skip
    return built


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' asked for but torch.cuda.is_available() is False")
    return torch.device(name)


def _open_meter(backend: str) -> Meter:
    """The energy meter, opened before the run directory is touched: a meter that cannot be used changes nothing."""
    try:
        return open_meter(backend)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def run_simulation(
    config: SimConfig,
    dataset: Dataset,
    *,
    fresh: bool = False,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[SimConfig, list[str]], None] | None = None,
    on_client: Callable[[int, int, int], None] | None = None,
) -> Path:
    """Run (or resume) a simulation into ``config.output``; returns the output directory.

    Writes ``config.json``, ``clients.json``, ``rounds.jsonl`` (one record per round), ``energy.jsonl`` and
    ``checkpoint.pt`` (after every round). Everything is validated (the model against the data set's images
    included), and the energy meter opened, before the first file is written or removed; ``fresh`` discards
    a previous run there only then. A run saved before a setting existed resumes with what it ran with
    (:meth:`SimConfig.resumed_as`). ``on_start`` gets the settings the run goes on with and notes on what a
    resume adapted (logged as warnings otherwise) once everything checked out; ``on_round`` gets each
    round's record once it is saved. Progress bars are drawn only when ``config.progress`` is set and stderr
    is a terminal; otherwise ``on_client(round index, clients done, clients)`` follows a round's clients.
    """
    device = resolve_device(config.device)
    model = check_model_input(config.model, dataset.image_shape, dataset.num_classes, config.seed)
    if config.method in DECENTRALISED_METHODS and config.neighbours >= config.clients and config.topology == "random":
        raise ConfigError(f"neighbours={config.neighbours} must be less than clients={config.clients}")
    out = config.run_dir
    ckpt_path = out / CHECKPOINT_NAME
    saved = None
    notes: list[str] = []
    if ckpt_path.exists() and not fresh:
        saved = load_checkpoint(ckpt_path, device)
        config, notes = config.resumed_as(saved["config"])
        diff = config.differences(saved["config"])
        if diff:
            then, now = saved_settings(saved["config"]), config.to_json()
            detail = ", ".join(f"{k}: {then.get(k)!r} saved, {now[k]!r} now" for k in diff)
            raise CheckpointError(f"{out} holds a run with other settings ({detail}); use another --output or --fresh")
    params = config.dispfl_params()
    train_parts, test_parts = partition(config, dataset)
    meter = _open_meter(config.energy_backend)
    try:
        if on_start is not None:
            on_start(config, notes)
        else:
            for note in notes:
                _LOGGER.warning("%s: %s", out, note)
        if fresh:
            for name in RUN_FILES:
                (out / name).unlink(missing_ok=True)
        start_round = 0 if saved is None else saved["round"] + 1
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / CONFIG_FILE, json.dumps(config.to_json(), indent=2) + "\n")
        clients_info = _clients_info(config, dataset, train_parts, test_parts)
        atomic_write_text(out / CLIENTS_FILE, json.dumps(clients_info) + "\n")
        truncate_jsonl(out / ROUNDS_LOG, start_round)
        truncate_jsonl(out / ENERGY_LOG, start_round)
    except BaseException:
        meter.close()
        raise
    accountant = EnergyAccountant(meter, out / ENERGY_LOG)
    model = model.to(device)
    init_weights = read_weights(model)
    pool = ImagePool.from_dataset(dataset, device)
    data = [ClientData.from_indices(pool, tr, te) for tr, te in zip(train_parts, test_parts, strict=True)]
    sim = _Sim(
        config=config,
        params=params,
        model=model,
        data=data,
        init_weights=init_weights,
        positions=weight_positions(model, pool.input_shape),
        dense=dense_nnz(model),
        spec=ModelSpec.from_tensors(config.model, dataset.num_classes, init_weights),
        accountant=accountant,
        on_client=on_client,
    )
    state = sim.initial_state() if saved is None else sim.restore(saved)
    if saved is not None:
        _LOGGER.info("resuming %s from round %d", out, start_round)
    bar = tqdm(
        range(start_round, config.rounds),
        desc=f"rounds ({config.method})",
        disable=not (config.progress and _stderr_is_tty()),
        unit="round",
        initial=start_round,
        total=config.rounds,
    )
    try:
        for t in bar:
            started = time.perf_counter()
            state, record = sim.round(t, state)
            record["wall_s"] = time.perf_counter() - started
            append_line(out / ROUNDS_LOG, json.dumps(record))
            save_checkpoint(ckpt_path, round_index=t, config=config.to_json(), **sim.checkpoint(state))
            accountant.close_round(t, modelled_j=record["modelled_energy"]["total_j"])
            bar.set_postfix(acc=f"{100 * record['acc_mean']:.1f}%")
            _LOGGER.info(
                "round %d: %s acc %.2f%% (%s), busiest node %s %.2f MB, %.1f s",
                t,
                config.method,
                100 * record["acc_mean"],
                record["acc_metric"],
                record["busiest_node"],
                record["busiest_node_bytes"] / 1e6,
                record["wall_s"],
            )
            if on_round is not None:
                on_round(record)
    finally:
        accountant.close()
        bar.close()
    return out


def progress_bars_shown(config: SimConfig) -> bool:
    """Whether :func:`run_simulation` draws progress bars (``progress`` set and stderr a terminal)."""
    return config.progress and _stderr_is_tty()


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def _clients_info(
    config: SimConfig, dataset: Dataset, train_parts: Sequence[np.ndarray], test_parts: Sequence[np.ndarray]
) -> dict[str, Any]:
    """Each client's sample counts and per-class training counts, for readers of a run (report --masks)."""
    classes = dataset.num_classes
    return {
        "partition": config.partition,
        "partition_variant": config.partition_variant,
        "num_classes": classes,
        "class_names": list(dataset.class_names),
        "clients": [
            {
                "train": int(len(tr)),
                "train_unique": int(len(np.unique(tr))),
                "test": int(len(te)),
                "train_class_counts": np.bincount(dataset.train_y[tr], minlength=classes).tolist(),
            }
            for tr, te in zip(train_parts, test_parts, strict=True)
        ],
    }


@dataclass
class RunState:
    """The state carried from round to round: client models (for FedAvg the server's global model as the
    one entry), and a method's own bookkeeping (``dispfl-s2s``: the distances and the vote's outcome)."""

    clients: list[ClientState]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Round:
    """What a method's round produced, before it becomes a record."""

    acc_before: list[float]
    acc_after: list[float] | None
    losses: list[float]
    flops: list[float]  # per trained client
    received: list[int]  # per client
    sent: list[int]
    paper_mb: list[float]  # per client
    server: tuple[int, int, float] | None = None  # (received, sent, paper MB) of a FedAvg server
    s2s_pruned: bool | None = None
    s2s_stable_fraction: float | None = None
    s2s_stability_median: float | None = None
    screen_refused: dict[str, dict[str, str]] | None = None  # client -> peer -> reason (screened methods only)


@dataclass
class _Sim:
    """What stays fixed over a run's rounds: settings, the shared model buffer, data, accounting."""

    config: SimConfig
    params: DisPFLParams
    model: torch.nn.Module  # one module; each client's weights are loaded into it in turn
    data: list[ClientData]
    init_weights: dict[str, torch.Tensor]  # the fleet's shared initial weights
    positions: dict[str, int]
    dense: dict[str, int]
    spec: ModelSpec
    accountant: EnergyAccountant
    on_client: Callable[[int, int, int], None] | None = None  # progress without bars (a pipe)
    densities: list[float] = field(init=False)

    def __post_init__(self) -> None:
        config = self.config
        n = config.clients
        if config.method not in SPARSE_METHODS:
            self.densities = [1.0] * n
        else:
            self.densities = client_densities(n) if config.setting == "ii" else [config.density] * n

    # ----- state

    def initial_state(self) -> RunState:
        config = self.config
        if config.method in SPARSE_METHODS:
            clients = [
                start(self.init_weights, d, seed=config.seed, client=i, mask_init=config.mask_init)
                for i, d in enumerate(self.densities)
            ]
        elif config.method in CENTRALISED_METHODS:
            clients = [dense_state(self.init_weights)]  # the server's global model
        else:
            clients = [dense_state(self.init_weights) for _ in range(config.clients)]
        extra: dict[str, Any] = {}
        if config.method == "dispfl-s2s":
            n = config.clients
            extra = {"first_distance": [0.0] * n, "last_distance": [0.0] * n, "start_round": None}
        return RunState(clients, extra)

    def restore(self, saved: dict[str, Any]) -> RunState:
        densities = [1.0] if self.config.method in CENTRALISED_METHODS else self.densities
        clients = [
            ClientState(w, tm, nm, d)
            for w, tm, nm, d in zip(saved["weights"], saved["train_masks"], saved["next_masks"], densities, strict=True)
        ]
        return RunState(clients, dict(saved.get("extra") or {}))

    def checkpoint(self, state: RunState) -> dict[str, Any]:
        clients = state.clients
        return {
            "weights": [c.weights for c in clients],
            "train_masks": [c.train_mask for c in clients],
            "next_masks": [c.next_mask for c in clients],
            "extra": state.extra,
        }

    # ----- accounting

    def model_bytes(self, nnz: dict[str, int], node_id: str, t: int) -> int:
        """Bytes the encoder produces for a model with ``nnz`` active values per tensor, sent by ``node_id``."""
        total = sum(self.dense.values())
        return encoded_model_size(
            self.spec,
            nnz,
            ValueType.FLOAT32,
            node_id=node_id,
            fleet_id=SIM_FLEET_ID,
            round=max(t - 1, 0),
            density=sum(nnz.values()) / total,
        )

    def traffic(self, t: int, clients: list[ClientState], nbrs: list[list[int]]) -> dict[str, Any]:
        """Bytes each node receives and sends in round ``t``: what the encoder puts on the wire per pull."""
        n = len(clients)
        published_nnz = [nnz_per_tensor(c.train_mask) for c in clients]
        model_active = [sum(nnz.values()) for nnz in published_nnz]
        model_bytes = [self.model_bytes(nnz, f"client-{j}", t) for j, nnz in enumerate(published_nnz)]
        received = [sum(model_bytes[j] for j in nbrs[i]) for i in range(n)]
        served = [0] * n
        for i in range(n):
            for j in nbrs[i]:
                served[j] += 1
        sent = [served[j] * model_bytes[j] for j in range(n)]
        paper_mb = [PAPER_BYTES_PER_VALUE * sum(model_active[j] for j in nbrs[i]) / 1e6 for i in range(n)]
        return {"received": received, "sent": sent, "paper_mb": paper_mb}

    def training_flops(self, nnz: dict[str, int], samples: int, regrow: bool) -> float:
        return round_training_flops(
            self.positions,
            nnz,
            self.dense,
            epochs=self.params.epochs,
            samples=samples,
            regrow_batch=self.params.batch_size if regrow else 0,
        )

    # ----- one round

    def round(self, t: int, state: RunState) -> tuple[RunState, dict[str, Any]]:
        """One synchronous round of every client; returns the new state and the round's record."""
        method = self.config.method
        if method in SPARSE_METHODS:
            state, result = self._round_dispfl(t, state)
        elif method == "local":
            state, result = self._round_local(t, state)
        elif method in ("dpsgd", "dpsgd-ft"):
            state, result = self._round_dpsgd(t, state)
        else:
            state, result = self._round_fedavg(t, state)
        return state, self._record(t, state, result)

    def _train(self, t: int, i: int, client: ClientState) -> tuple[float, TrainResult]:
        """Accuracy of ``client`` as it is, then its local training (the shared round's ``train_local``)."""
        data = self.data[i]
        load_weights(self.model, client.weights)
        before = accuracy(self.model, data, self.config.eval_batch_size)
        try:
            trained = train_local(
                client, self.model, _batch_source(data, self.params.batch_size), t, self.params, seed=self.config.seed,
                client=i,
            )  # fmt: skip
        except TrainingDiverged as exc:
            raise TrainingDiverged(
                f"{exc}; the run stops before recording round {t + 1}, earlier rounds are kept; lower --lr"
            ) from exc
        return before, trained

    def _round_dispfl(self, t: int, state: RunState) -> tuple[RunState, _Round]:
        config, params = self.config, self.params
        clients = state.clients
        n = len(clients)
        nbrs = round_neighbours(config.topology, n, config.neighbours, config.seed, t, config.max_in_degree)
        traffic = self.traffic(t, clients, nbrs)
        device = self.data[0].pool.device
        screen_refused: dict[str, dict[str, str]] = {}
        with self.accountant.phase("aggregate"):  # every client from the models as they were at the round's start
            peers = [self._peers(clients, i, nbrs[i], screen_refused) for i in range(n)]
            clients = [aggregate_peers(clients[i], peers[i]) for i in range(n)]
            _sync(device)
        s2s = config.s2s_params() if config.method == "dispfl-s2s" else None
        extra = dict(state.extra)
        prunes = s2s is not None and is_prune_round(t, extra.get("start_round"), s2s.gap_decay)
        stable: list[bool] = []
        stability_values: list[float] = []
        acc_before: list[float] = []
        acc_after: list[float] = []
        losses: list[float] = []
        flops: list[float] = []
        with self.accountant.phase("train"):
            for i in self._client_bar(t, n):
                before, trained = self._train(t, i, clients[i])
                acc_before.append(before)
                losses.append(trained.stats.mean_loss)
                client = trained.state
                if s2s is not None:
                    s_t = self._track_distance(t, i, client, extra)  # of the trained model, as the authors' code
                    stability_values.append(s_t)
                    stable.append(s_t <= s2s.stable_threshold)
                    if prunes:  # the client keeps and publishes the pruned model: that is the one evaluated
                        client = prune_state(client, s2s)
                        load_weights(self.model, client.weights)
                acc_after.append(accuracy(self.model, self.data[i], config.eval_batch_size))
                clients[i] = update_mask(client, t, params, seed=config.seed, client=i, gradients=trained.gradients)
                flops.append(
                    self.training_flops(
                        nnz_per_tensor(trained.state.train_mask), self.data[i].num_train, params.regrow == "gradient"
                    )
                )
            _sync(device)
        result = _Round(acc_before, acc_after, losses, flops, traffic["received"], traffic["sent"], traffic["paper_mb"])
        result.screen_refused = screen_refused if config.screen else None
        if s2s is not None:
            if extra.get("start_round") is None and t >= 1 and vote(stable, s2s.vote_fraction):
                extra["start_round"] = t + 1
                _LOGGER.info("sparse-to-sparser: %d of %d clients stable, pruning starts in round %d",
                             sum(stable), n, t + 1)  # fmt: skip
            result.s2s_pruned = prunes
            result.s2s_stable_fraction = sum(stable) / n if t >= 1 else None
            result.s2s_stability_median = float(np.median(stability_values)) if t >= 1 else None
        return RunState(clients, extra), result

    def _peers(
        self, clients: list[ClientState], i: int, nbrs: list[int], refused: dict[str, dict[str, str]]
    ) -> list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
        """Client ``i``'s neighbours' published models that it aggregates: with ``screen``, those the receive-path
        screen accepts against ``i``'s own (as a device's daemon does); refusals go into ``refused``."""
        models = {f"client-{j}": published(clients[j]) for j in nbrs}
        if not self.config.screen or not models:
            return list(models.values())
        own_weights, own_mask = published(clients[i])
        result = screen_peer_models(own_weights, own_mask, [(k, w, m) for k, (w, m) in models.items()])
        if result.refused:
            refused[f"client-{i}"] = dict(result.refused)
            for peer, reason in result.refused.items():
                _LOGGER.warning("round screen: client-%d refused %s: %s", i, peer, reason)
        return [models[k] for k in result.accepted]

    def _track_distance(self, t: int, i: int, client: ClientState, extra: dict[str, Any]) -> float:
        """Record client ``i``'s ``D_t``; returns ``s_t`` (infinite in round 0, which only sets ``D_0``)."""
        distance = weight_distance(client.weights, self.init_weights)
        first, last = extra["first_distance"], extra["last_distance"]
        if t == 0 or first[i] <= 0:
            first[i] = distance
            last[i] = distance
            return math.inf
        s = stability(distance, last[i], first[i])
        last[i] = distance
        return s

    def _round_local(self, t: int, state: RunState) -> tuple[RunState, _Round]:
        clients = list(state.clients)
        n = len(clients)
        acc_before, acc_after, losses, flops = [], [], [], []
        with self.accountant.phase("train"):
            for i in self._client_bar(t, n):
                before, trained = self._train(t, i, clients[i])
                acc_before.append(before)
                losses.append(trained.stats.mean_loss)
                acc_after.append(accuracy(self.model, self.data[i], self.config.eval_batch_size))
                clients[i] = trained.state
                flops.append(self.training_flops(self.dense, self.data[i].num_train, False))
            _sync(self.data[0].pool.device)
        zeros = [0] * n
        return RunState(clients, state.extra), _Round(acc_before, acc_after, losses, flops, zeros, zeros, [0.0] * n)

    def _round_dpsgd(self, t: int, state: RunState) -> tuple[RunState, _Round]:
        config = self.config
        clients = state.clients
        n = len(clients)
        nbrs = round_neighbours(config.topology, n, config.neighbours, config.seed, t, config.max_in_degree)
        traffic = self.traffic(t, clients, nbrs)
        with self.accountant.phase("aggregate"):
            clients = [neighbourhood_average(clients[i], [published(clients[j]) for j in nbrs[i]]) for i in range(n)]
            _sync(self.data[0].pool.device)
        acc_before, acc_after, losses, flops = [], [], [], []
        with self.accountant.phase("train"):
            for i in self._client_bar(t, n):
                before, trained = self._train(t, i, clients[i])
                acc_before.append(before)
                losses.append(trained.stats.mean_loss)
                acc_after.append(accuracy(self.model, self.data[i], config.eval_batch_size))
                clients[i] = trained.state
                flops.append(self.training_flops(self.dense, self.data[i].num_train, False))
            _sync(self.data[0].pool.device)
        result = _Round(acc_before, acc_after, losses, flops, traffic["received"], traffic["sent"], traffic["paper_mb"])
        return RunState(clients, state.extra), result

    def _round_fedavg(self, t: int, state: RunState) -> tuple[RunState, _Round]:
        config = self.config
        n = config.clients
        (server,) = state.clients
        chosen = sample_clients(n, config.fedavg_clients, config.seed, t)
        trained_models, counts, losses, flops = [], [], [], []
        with self.accountant.phase("train"):
            for i in self._client_bar(t, len(chosen), chosen):
                _, trained = self._train(t, i, server)
                trained_models.append(trained.state.weights)
                counts.append(self.data[i].num_train)
                losses.append(trained.stats.mean_loss)
                flops.append(self.training_flops(self.dense, self.data[i].num_train, False))
        with self.accountant.phase("aggregate"):
            server = dense_state(weighted_average(trained_models, counts))
            _sync(self.data[0].pool.device)
        acc_before: list[float] = []
        acc_after: list[float] | None = [] if config.method == "fedavg-ft" else None
        with self.accountant.phase("train"):
            for i in range(n):  # evaluation of the new global model (and, for -ft, its local fine-tune)
                load_weights(self.model, server.weights)
                acc_before.append(accuracy(self.model, self.data[i], config.eval_batch_size))
                if acc_after is not None:
                    acc_after.append(self._fine_tuned_accuracy(t, i, server))
            _sync(self.data[0].pool.device)
        dense_nnz_ = dict(self.dense)
        down = self.model_bytes(dense_nnz_, SERVER_ID, t)  # the global model, to each sampled client
        received, sent, paper_mb = [0] * n, [0] * n, [0.0] * n
        dense_mb = PAPER_BYTES_PER_VALUE * sum(self.dense.values()) / 1e6
        for i in chosen:
            received[i] = down
            sent[i] = self.model_bytes(dense_nnz_, f"client-{i}", t)
            paper_mb[i] = dense_mb
        server_traffic = (sum(sent), down * len(chosen), dense_mb * len(chosen))
        result = _Round(acc_before, acc_after, losses, flops, received, sent, paper_mb, server=server_traffic)
        return RunState([server], state.extra), result

    def _fine_tuned_accuracy(self, t: int, i: int, server: ClientState) -> float:
        """Client ``i``'s accuracy after fine-tuning ``server``'s model for E local epochs (discarded after)."""
        data = self.data[i]
        generator = torch_generator(self.config.seed, Stream.FINETUNE, i, t)
        load_weights(self.model, server.weights)
        batches = data.train_batches(self.params.epochs, generator, self.params.batch_size)
        train_masked(self.model, server.train_mask, batches, self.params.sgd(t))
        return accuracy(self.model, data, self.config.eval_batch_size)

    def _client_bar(self, t: int, n: int, items: Sequence[int] | None = None) -> Iterator[int]:
        show = progress_bars_shown(self.config)
        chosen = items if items is not None else range(n)
        if not show and self.on_client is not None:
            for done, i in enumerate(chosen):
                yield i
                self.on_client(t, done + 1, len(chosen))
            return
        yield from tqdm(chosen, desc=f"round {t + 1}", leave=False, disable=not show, unit="client")

    def _record(self, t: int, state: RunState, r: _Round) -> dict[str, Any]:
        config, params = self.config, self.params
        method = config.method
        n = config.clients
        received, sent, paper_mb = r.received, r.sent, r.paper_mb
        loads = [a + b for a, b in zip(received, sent, strict=True)]
        busiest = max(range(n), key=lambda i: loads[i])
        busiest_node, busiest_bytes = f"client-{busiest}", loads[busiest]
        paper_busiest = max(paper_mb) if paper_mb else 0.0
        server_recv = server_sent = None
        modelled = [modelled_energy(f, 0, 0) for f in r.flops] if r.server is not None else [
            modelled_energy(f, s, v) for f, s, v in zip(r.flops, sent, received, strict=True)
        ]  # fmt: skip
        if r.server is not None:
            server_recv, server_sent, server_mb = r.server
            modelled += [modelled_energy(0.0, s, v) for s, v in zip(sent, received, strict=True)]
            modelled.append(modelled_energy(0.0, server_sent, server_recv))
            if server_recv + server_sent >= busiest_bytes:
                busiest_node, busiest_bytes = SERVER_ID, server_recv + server_sent
            paper_busiest = max(paper_busiest, server_mb)
        modelled_total = sum(m.total_j for m in modelled)
        before_is, after_is = ACC_MEANING[method]
        acc_before_mean = float(np.mean(r.acc_before))
        acc_after_mean = float(np.mean(r.acc_after)) if r.acc_after is not None else None
        headline = acc_after_mean if HEADLINE[method] == "after" else acc_before_mean
        assert headline is not None
        dense_method = method not in SPARSE_METHODS
        density = 1.0 if method in CENTRALISED_METHODS else float(np.mean([c.mask_density for c in state.clients]))
        finite_losses = [x for x in r.losses if not math.isnan(x)]
        record: dict[str, Any] = {
            "round": t,
            "method": method,
            "partition": config.partition,
            "partition_variant": config.partition_variant,
            "lr": params.sgd(t).lr,
            "prune_rate": None if dense_method else params.prune_rate(t),
            "acc_mean": headline,
            "acc_metric": after_is if HEADLINE[method] == "after" else before_is,
            "acc_before_mean": acc_before_mean,
            "acc_after_mean": acc_after_mean,
            "acc_before": r.acc_before,
            "acc_after": r.acc_after,
            "acc_before_is": before_is,
            "acc_after_is": after_is,
            "train_loss_mean": float(np.mean(finite_losses)) if finite_losses else None,
            "trained_clients": len(r.flops),
            "bytes_received": received,
            "bytes_sent": sent,
            "server_bytes_received": server_recv,
            "server_bytes_sent": server_sent,
            "bytes_received_mean": float(np.mean(received)),
            "busiest_node": busiest_node,
            "busiest_node_bytes": busiest_bytes,
            "paper_comm_mb_mean": float(np.mean(paper_mb)),
            "paper_comm_mb_busiest": paper_busiest,
            "flops_per_client_mean": float(np.mean(r.flops)),
            "flops_per_client_max": max(r.flops),
            "density_mean": density,
            "densities_target": sorted(set(self.densities)),
            "forward_flops_dense": forward_flops(self.positions, self.dense),
            "s2s_pruned": r.s2s_pruned,
            "s2s_start_round": state.extra.get("start_round") if method == "dispfl-s2s" else None,
            "s2s_stable_fraction": r.s2s_stable_fraction,
            "s2s_stability_median": r.s2s_stability_median,
            "screen": config.screen if method in SPARSE_METHODS else None,
            "screen_refusals": None if r.screen_refused is None else sum(len(v) for v in r.screen_refused.values()),
            "screen_refused": r.screen_refused,
            "modelled_energy": {
                "label": "modelled",
                "total_j": modelled_total,
                "per_client_mean_j": modelled_total / n,
            },
        }
        return record


def _batch_source(data: ClientData, batch_size: int) -> Callable[[int, torch.Generator], Iterator[Batch]]:
    """The client's training batches as the shared round asks for them: (epochs, generator) -> batches."""
    return lambda epochs, generator: data.train_batches(epochs, generator, batch_size)
