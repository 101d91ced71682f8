"""The synchronous DisPFL simulation: N clients in one process, same ``algorithm`` functions as a device.

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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
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
    weight_positions,
)
from edge_node.algorithm.dispfl import (
    ClientState,
    DisPFLParams,
    aggregate_peers,
    published,
    start,
    train_local,
    update_mask,
)
from edge_node.algorithm.topology import round_neighbours
from edge_node.data import Dataset, partition_clients
from edge_node.data.batches import Batch, ClientData, ImagePool
from edge_node.energy import EnergyAccountant, modelled_energy, open_meter
from edge_node.energy.base import Meter
from edge_node.errors import CheckpointError, ConfigError, TrainingDiverged
from edge_node.models import build_model
from edge_node.sim.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from edge_node.sim.config import SimConfig
from edge_node.sim.report import ACCURACY_PLOT, COMMUNICATION_PLOT, ROUNDS_LOG, SUMMARY_FILE
from edge_node.storage import append_line, atomic_write_text, truncate_jsonl
from edge_node.wire import ModelSpec, ValueType, encoded_model_size

_LOGGER = logging.getLogger(__name__)

ENERGY_LOG = "energy.jsonl"
CONFIG_FILE = "config.json"
# Everything a run directory holds (what --fresh discards).
RUN_FILES = (
    CHECKPOINT_NAME, CHECKPOINT_NAME + ".tmp", ROUNDS_LOG, ENERGY_LOG, CONFIG_FILE, SUMMARY_FILE, ACCURACY_PLOT,
    COMMUNICATION_PLOT,
)  # fmt: skip
SIM_FLEET_ID = "sim"  # header fields the byte count uses: node ids are client-<i>
PAPER_BYTES_PER_VALUE = 4  # the paper's Comm (MB): fp32 values of the received models, 1 MB = 1e6 B


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


def run_simulation(config: SimConfig, dataset: Dataset, *, fresh: bool = False) -> Path:
    """Run (or resume) a simulation into ``config.output``; returns the output directory.

    Writes ``config.json``, ``rounds.jsonl`` (one record per round), ``energy.jsonl`` and
    ``checkpoint.pt`` (after every round). Everything is validated, and the energy meter opened, before
    the first file is written or removed; ``fresh`` discards a previous run there only then.
    """
    device = resolve_device(config.device)
    if config.neighbours >= config.clients and config.topology == "random":
        raise ConfigError(f"neighbours={config.neighbours} must be less than clients={config.clients}")
    params = config.dispfl_params()
    train_parts, test_parts = partition(config, dataset)
    out = config.output
    ckpt_path = out / CHECKPOINT_NAME
    saved = None
    if ckpt_path.exists() and not fresh:
        saved = load_checkpoint(ckpt_path, device)
        diff = config.differences(saved["config"])
        if diff:
            raise CheckpointError(
                f"{out} holds a run with other settings ({', '.join(diff)}); use another --output or --fresh"
            )
    meter = _open_meter(config.energy_backend)
    try:
        if fresh:
            for name in RUN_FILES:
                (out / name).unlink(missing_ok=True)
        start_round = 0 if saved is None else saved["round"] + 1
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / CONFIG_FILE, json.dumps(config.to_json(), indent=2) + "\n")
        truncate_jsonl(out / ROUNDS_LOG, start_round)
        truncate_jsonl(out / ENERGY_LOG, start_round)
    except BaseException:
        meter.close()
        raise
    accountant = EnergyAccountant(meter, out / ENERGY_LOG)

    model = build_model(config.model, dataset.num_classes, seed=config.seed).to(device)
    init_weights = read_weights(model)
    densities = client_densities(config.clients) if config.setting == "ii" else [config.density] * config.clients
    if saved is not None:
        clients = [
            ClientState(w, tm, nm, d)
            for w, tm, nm, d in zip(saved["weights"], saved["train_masks"], saved["next_masks"], densities, strict=True)
        ]
        _LOGGER.info("resuming %s from round %d", out, start_round)
    else:
        clients = [
            start(init_weights, d, seed=config.seed, client=i, mask_init=config.mask_init)
            for i, d in enumerate(densities)
        ]
    pool = ImagePool.from_dataset(dataset, device)
    data = [ClientData.from_indices(pool, tr, te) for tr, te in zip(train_parts, test_parts, strict=True)]
    sim = _Sim(
        config=config,
        params=params,
        model=model,
        data=data,
        densities=densities,
        positions=weight_positions(model, pool.input_shape),
        dense=dense_nnz(model),
        spec=ModelSpec.from_tensors(config.model, dataset.num_classes, init_weights),
        accountant=accountant,
    )
    bar = tqdm(
        range(start_round, config.rounds),
        desc="rounds",
        disable=not config.progress,
        unit="round",
        initial=start_round,
        total=config.rounds,
    )
    try:
        for t in bar:
            started = time.perf_counter()
            clients, record = sim.round(t, clients)
            record["wall_s"] = time.perf_counter() - started
            append_line(out / ROUNDS_LOG, json.dumps(record))
            save_checkpoint(
                ckpt_path,
                round_index=t,
                config=config.to_json(),
                weights=[c.weights for c in clients],
                train_masks=[c.train_mask for c in clients],
                next_masks=[c.next_mask for c in clients],
            )
            accountant.close_round(t, modelled_j=record["modelled_energy"]["total_j"])
            bar.set_postfix(acc=f"{100 * record['acc_after_mean']:.1f}%")
            _LOGGER.info(
                "round %d: acc before %.2f%% after %.2f%%, busiest node %.2f MB, %.1f s",
                t,
                100 * record["acc_before_mean"],
                100 * record["acc_after_mean"],
                record["busiest_node_bytes"] / 1e6,
                record["wall_s"],
            )
    finally:
        accountant.close()
        bar.close()
    return out


@dataclass
class _Sim:
    """What stays fixed over a run's rounds: settings, the shared model buffer, data, accounting."""

    config: SimConfig
    params: DisPFLParams
    model: torch.nn.Module  # one module; each client's weights are loaded into it in turn
    data: list[ClientData]
    densities: list[float]
    positions: dict[str, int]
    dense: dict[str, int]
    spec: ModelSpec
    accountant: EnergyAccountant

    def traffic(self, t: int, clients: list[ClientState], nbrs: list[list[int]]) -> dict[str, Any]:
        """Bytes each node receives and sends in round ``t``: what the encoder puts on the wire per pull."""
        n = len(clients)
        published_nnz = [nnz_per_tensor(c.train_mask) for c in clients]
        model_active = [sum(nnz.values()) for nnz in published_nnz]
        total_params = sum(self.dense.values())
        model_bytes = [
            encoded_model_size(
                self.spec,
                nnz,
                ValueType.FLOAT32,
                node_id=f"client-{j}",
                fleet_id=SIM_FLEET_ID,
                round=max(t - 1, 0),
                density=model_active[j] / total_params,
            )
            for j, nnz in enumerate(published_nnz)
        ]
        received = [sum(model_bytes[j] for j in nbrs[i]) for i in range(n)]
        served = [0] * n
        for i in range(n):
            for j in nbrs[i]:
                served[j] += 1
        sent = [served[j] * model_bytes[j] for j in range(n)]
        paper_mb = [PAPER_BYTES_PER_VALUE * sum(model_active[j] for j in nbrs[i]) / 1e6 for i in range(n)]
        return {"received": received, "sent": sent, "paper_mb": paper_mb}

    def round(self, t: int, clients: list[ClientState]) -> tuple[list[ClientState], dict[str, Any]]:
        """One synchronous round of every client; returns the new states and the round's record."""
        config, params, model = self.config, self.params, self.model
        n = len(clients)
        nbrs = round_neighbours(config.topology, n, config.neighbours, config.seed, t, config.max_in_degree)
        traffic = self.traffic(t, clients, nbrs)
        device = self.data[0].pool.device
        with self.accountant.phase("aggregate"):  # every client from the models as they were at the round's start
            clients = [aggregate_peers(clients[i], [published(clients[j]) for j in nbrs[i]]) for i in range(n)]
            _sync(device)

        acc_before: list[float] = []
        acc_after: list[float] = []
        losses: list[float] = []
        flops: list[float] = []
        lr = params.sgd(t).lr
        with self.accountant.phase("train"):
            for i in tqdm(range(n), desc=f"round {t}", leave=False, disable=not config.progress, unit="client"):
                data = self.data[i]
                load_weights(model, clients[i].weights)
                acc_before.append(accuracy(model, data, config.eval_batch_size))
                batches = _batch_source(data, params.batch_size)
                try:
                    trained = train_local(clients[i], model, batches, t, params, seed=config.seed, client=i)
                except TrainingDiverged as exc:
                    raise TrainingDiverged(
                        f"{exc}; the run stops before recording round {t}, earlier rounds are kept; lower --lr"
                    ) from exc
                losses.append(trained.stats.mean_loss)
                acc_after.append(accuracy(model, data, config.eval_batch_size))
                clients[i] = update_mask(
                    trained.state, t, params, seed=config.seed, client=i, gradients=trained.gradients
                )
                flops.append(
                    round_training_flops(
                        self.positions,
                        nnz_per_tensor(clients[i].train_mask),
                        self.dense,
                        epochs=params.epochs,
                        samples=data.num_train,
                        regrow_batch=params.batch_size if params.regrow == "gradient" else 0,
                    )
                )
            _sync(device)
        received, sent, paper_mb = traffic["received"], traffic["sent"], traffic["paper_mb"]
        modelled = [modelled_energy(f, s, r) for f, s, r in zip(flops, sent, received, strict=True)]
        modelled_total = sum(m.total_j for m in modelled)
        record = {
            "round": t,
            "lr": lr,
            "prune_rate": params.prune_rate(t),
            "acc_before_mean": float(np.mean(acc_before)),
            "acc_after_mean": float(np.mean(acc_after)),
            "acc_before": acc_before,
            "acc_after": acc_after,
            "train_loss_mean": float(np.nanmean(losses)) if not all(math.isnan(x) for x in losses) else None,
            "bytes_received": received,
            "bytes_sent": sent,
            "bytes_received_mean": float(np.mean(received)),
            "busiest_node_bytes": max(r + s for r, s in zip(received, sent, strict=True)),
            "paper_comm_mb_mean": float(np.mean(paper_mb)),
            "paper_comm_mb_busiest": max(paper_mb),
            "flops_per_client_mean": float(np.mean(flops)),
            "flops_per_client_max": max(flops),
            "density_mean": float(np.mean([c.mask_density for c in clients])),
            "densities_target": sorted(set(self.densities)),
            "forward_flops_dense": forward_flops(self.positions, self.dense),
            "modelled_energy": {
                "label": "modelled",
                "total_j": modelled_total,
                "per_client_mean_j": modelled_total / n,
            },
        }
        return clients, record


def _batch_source(data: ClientData, batch_size: int) -> Callable[[int, torch.Generator], Iterator[Batch]]:
    """The client's training batches as the shared round asks for them: (epochs, generator) -> batches."""
    return lambda epochs, generator: data.train_batches(epochs, generator, batch_size)
