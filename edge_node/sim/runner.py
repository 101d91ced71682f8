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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from edge_node.algorithm import (
    SGDConfig,
    aggregate,
    all_finite,
    client_densities,
    count_correct,
    dense_gradients,
    dense_nnz,
    forward_flops,
    init_masks,
    learning_rate,
    load_weights,
    nnz_per_tensor,
    prune_rate,
    read_weights,
    round_training_flops,
    train_masked,
    update_masks,
    weight_positions,
)
from edge_node.data import (
    Dataset,
    client_test_indices,
    normalize_batch,
    parse_partition,
    partition_dir,
    partition_path,
)
from edge_node.data.augment import crop_flip, draw_crop_flip
from edge_node.energy import EnergyAccountant, modelled_energy, open_meter
from edge_node.errors import CheckpointError, ConfigError, TrainingDiverged
from edge_node.models import build_model
from edge_node.seeding import numpy_generator, torch_generator
from edge_node.sim.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from edge_node.sim.config import SimConfig
from edge_node.sim.report import ACCURACY_PLOT, COMMUNICATION_PLOT, ROUNDS_LOG, SUMMARY_FILE
from edge_node.sim.topology import neighbours
from edge_node.storage import append_line, atomic_write_text
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
CROP_PADDING = 4  # CIFAR augmentation: random 32x32 crop of the image zero-padded by 4, plus flips


@dataclass
class _Clients:
    """Per-client state, index-aligned lists (weights are zero outside ``train_masks``)."""

    weights: list[dict[str, torch.Tensor]]
    train_masks: list[dict[str, torch.Tensor]]
    next_masks: list[dict[str, torch.Tensor]]
    train_idx: list[torch.Tensor] = field(default_factory=list)
    test_idx: list[torch.Tensor] = field(default_factory=list)


def partition_clients(config: SimConfig, dataset: Dataset) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Training and test index arrays per client, as ALGORITHM.md "Data partitions" specifies."""
    kind, arg = parse_partition(config.partition)
    rng = numpy_generator(config.seed, "partition")
    if kind == "dir":
        if config.samples_per_client is not None and config.samples_per_client * config.clients > len(dataset.train_y):
            raise ConfigError(
                f"samples_per_client={config.samples_per_client} x clients={config.clients} exceeds the "
                f"{len(dataset.train_y)} training samples of {dataset.name}"
            )
        train = partition_dir(dataset.train_y, config.clients, float(arg), rng, config.samples_per_client)
    else:
        train = partition_path(dataset.train_y, config.clients, int(arg), rng)
    test_rng = numpy_generator(config.seed, "test-split")
    test = [client_test_indices(dataset.train_y[idx], dataset.test_y, dataset.num_classes, test_rng) for idx in train]
    return train, test


def _train_batches(
    data_x: torch.Tensor,
    data_y: torch.Tensor,
    idx: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled, augmented mini-batches; an epoch's order and crop/flip offsets cross to the device at once."""
    n = idx.numel()
    for _ in range(epochs):
        order = idx[torch.randperm(n, generator=generator).to(idx.device)]
        top, left, mirror = (v.to(idx.device) for v in draw_crop_flip(n, generator, crop_padding=CROP_PADDING))
        for start in range(0, n, batch_size):
            sl = slice(start, start + batch_size)
            x = crop_flip(data_x[order[sl]], top[sl], left[sl], mirror[sl], CROP_PADDING)
            yield normalize_batch(x, mean, std), data_y[order[sl]]


def _eval_batches(
    data_x: torch.Tensor, data_y: torch.Tensor, idx: torch.Tensor, batch_size: int, mean: Any, std: Any
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for start in range(0, idx.numel(), batch_size):
        batch = idx[start : start + batch_size]
        yield normalize_batch(data_x[batch], mean, std), data_y[batch]


def _truncate_jsonl(path: Path, keep_before_round: int) -> None:
    """Drop records of rounds that did not complete (a resumed run re-runs them), atomically."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            round_index = json.loads(line)["round"]
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):  # a line torn by a killed process: that round re-runs anyway
                _LOGGER.warning("dropping a torn last line of %s", path)
                break
            raise CheckpointError(f"{path} line {number} is not a round record: {exc}") from exc
        if round_index < keep_before_round:
            kept.append(line)
    if len(kept) != len(lines):
        atomic_write_text(path, "".join(line + "\n" for line in kept))


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work so energy and time land in the phase that caused them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' asked for but torch.cuda.is_available() is False")
    return torch.device(name)


def run_simulation(config: SimConfig, dataset: Dataset, *, fresh: bool = False) -> Path:
    """Run (or resume) a simulation into ``config.output``; returns the output directory.

    Writes ``config.json``, ``rounds.jsonl`` (one record per round), ``energy.jsonl`` and
    ``checkpoint.pt`` (after every round). Everything is validated before the first file is written;
    ``fresh`` discards a previous run there (only once the new one is known to be valid).
    """
    device = resolve_device(config.device)
    if config.neighbours >= config.clients and config.topology == "random":
        raise ConfigError(f"neighbours={config.neighbours} must be less than clients={config.clients}")
    train_parts, test_parts = partition_clients(config, dataset)
    out = config.output
    ckpt_path = out / CHECKPOINT_NAME
    if fresh:
        for name in RUN_FILES:
            (out / name).unlink(missing_ok=True)
    start_round = 0
    saved = None
    if ckpt_path.exists():
        saved = load_checkpoint(ckpt_path, device)
        diff = config.differences(saved["config"])
        if diff:
            raise CheckpointError(
                f"{out} holds a run with other settings ({', '.join(diff)}); use another --output or --fresh"
            )
        start_round = saved["round"] + 1
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / CONFIG_FILE, json.dumps(config.to_json(), indent=2) + "\n")
    _truncate_jsonl(out / ROUNDS_LOG, start_round)
    _truncate_jsonl(out / ENERGY_LOG, start_round)

    model = build_model(config.model, dataset.num_classes, seed=config.seed).to(device)
    init_weights = read_weights(model)
    densities = client_densities(config.clients) if config.setting == "ii" else [config.density] * config.clients
    if saved is not None:
        clients = _Clients(saved["weights"], saved["train_masks"], saved["next_masks"])
        _LOGGER.info("resuming %s from round %d", out, start_round)
    else:
        masks = [
            init_masks(init_weights, d, torch_generator(config.seed, "mask", i), config.mask_init)
            for i, d in enumerate(densities)
        ]
        weights = [{n: w * m[n] for n, w in init_weights.items()} for m in masks]
        clients = _Clients(weights, masks, [dict(m) for m in masks])
    clients.train_idx = [torch.as_tensor(p, dtype=torch.long, device=device) for p in train_parts]
    clients.test_idx = [torch.as_tensor(p, dtype=torch.long, device=device) for p in test_parts]

    data_x = torch.as_tensor(dataset.train_x).to(device)
    data_y = torch.as_tensor(dataset.train_y).to(device)
    test_x = torch.as_tensor(dataset.test_x).to(device)
    test_y = torch.as_tensor(dataset.test_y).to(device)
    input_shape = tuple(dataset.train_x.shape[1:])
    positions = weight_positions(model, input_shape)
    dense = dense_nnz(model)
    spec = ModelSpec.from_tensors(config.model, dataset.num_classes, init_weights)

    meter = open_meter(config.energy_backend)
    accountant = EnergyAccountant(meter, out / ENERGY_LOG)
    schedule_t = config.schedule_rounds
    n = config.clients
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
            record = _run_round(
                t,
                config,
                clients,
                model,
                densities,
                data=(data_x, data_y, test_x, test_y),
                mean=dataset.mean,
                std=dataset.std,
                positions=positions,
                dense=dense,
                spec=spec,
                schedule_t=schedule_t,
                n=n,
                accountant=accountant,
            )
            record["wall_s"] = time.perf_counter() - started
            append_line(out / ROUNDS_LOG, json.dumps(record))
            save_checkpoint(
                ckpt_path,
                round_index=t,
                config=config.to_json(),
                weights=clients.weights,
                train_masks=clients.train_masks,
                next_masks=clients.next_masks,
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


def _run_round(
    t: int,
    config: SimConfig,
    clients: _Clients,
    model: torch.nn.Module,
    densities: list[float],
    *,
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
    positions: dict[str, int],
    dense: dict[str, int],
    spec: ModelSpec,
    schedule_t: int,
    n: int,
    accountant: EnergyAccountant,
) -> dict[str, Any]:
    data_x, data_y, test_x, test_y = data
    nbrs = neighbours(
        config.topology, n, config.neighbours, numpy_generator(config.seed, "topology", t), config.max_in_degree
    )
    # Bytes: what the encoder would put on the wire for each published model, pulled by its neighbours.
    published_nnz = [nnz_per_tensor(m) for m in clients.train_masks]
    model_active = [sum(nnz.values()) for nnz in published_nnz]
    total_params = sum(dense.values())
    model_bytes = [
        encoded_model_size(
            spec,
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

    device = data_x.device
    with accountant.phase("aggregate"):
        aggregated = [
            aggregate(
                clients.weights[i],
                clients.train_masks[i],
                clients.next_masks[i],
                [clients.weights[j] for j in nbrs[i]],
                [clients.train_masks[j] for j in nbrs[i]],
            )
            for i in range(n)
        ]
        _sync(device)
    clients.weights = aggregated  # the round-start models are no longer needed
    clients.train_masks = clients.next_masks

    lr = learning_rate(t, config.lr, config.lr_decay)
    rate = prune_rate(t, schedule_t, config.prune_alpha)
    sgd = SGDConfig(lr=lr, weight_decay=config.weight_decay, clip_norm=config.clip_norm)
    acc_before: list[float] = []
    acc_after: list[float] = []
    losses: list[float] = []
    flops: list[float] = []
    next_masks: list[dict[str, torch.Tensor]] = []

    def accuracy(i: int) -> float:
        batches = _eval_batches(test_x, test_y, clients.test_idx[i], config.eval_batch_size, mean, std)
        correct, total = count_correct(model, batches)
        return correct / max(total, 1)

    def train_batches(i: int, epochs: int, gen: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return _train_batches(
            data_x, data_y, clients.train_idx[i], epochs=epochs, batch_size=config.batch_size,
            generator=gen, mean=mean, std=std,
        )  # fmt: skip

    with accountant.phase("train"):
        for i in tqdm(range(n), desc=f"round {t}", leave=False, disable=not config.progress, unit="client"):
            load_weights(model, clients.weights[i])
            acc_before.append(accuracy(i))
            gen = torch_generator(config.seed, "train", i, t)
            stats = train_masked(model, clients.train_masks[i], train_batches(i, config.epochs, gen), sgd)
            trained = read_weights(model)
            if (stats.samples and not math.isfinite(stats.mean_loss)) or not all_finite(trained):
                raise TrainingDiverged(
                    f"training diverged in round {t}: client {i} has loss {stats.mean_loss:.4g}"
                    f"{'' if all_finite(trained) else ' and non-finite weights'} (lr={lr:g}); the run stops before "
                    f"recording round {t}, earlier rounds are kept; lower --lr"
                )
            losses.append(stats.mean_loss)
            acc_after.append(accuracy(i))
            grads = None
            if config.regrow == "gradient":  # RigL-style: dense gradient of one mini-batch
                grads = dense_gradients(model, next(train_batches(i, 1, gen)))
            regrow_gen = torch_generator(config.seed, "regrow", i, t)
            mask = clients.train_masks[i]
            next_masks.append(update_masks(trained, mask, rate, config.regrow, gradients=grads, generator=regrow_gen))
            clients.weights[i] = trained
            flops.append(
                round_training_flops(
                    positions,
                    nnz_per_tensor(clients.train_masks[i]),
                    dense,
                    epochs=config.epochs,
                    samples=int(clients.train_idx[i].numel()),
                    regrow_batch=config.batch_size if config.regrow == "gradient" else 0,
                )  # fmt: skip
            )
        _sync(device)
    clients.next_masks = next_masks
    modelled = [modelled_energy(f, s, r) for f, s, r in zip(flops, sent, received, strict=True)]
    modelled_total = sum(m.total_j for m in modelled)
    return {
        "round": t,
        "lr": lr,
        "prune_rate": rate,
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
        "density_mean": float(
            np.mean([sum(nnz_per_tensor(m).values()) / sum(dense.values()) for m in clients.train_masks])
        ),
        "densities_target": sorted(set(densities)),
        "forward_flops_dense": forward_flops(positions, dense),
        "modelled_energy": {"label": "modelled", "total_j": modelled_total, "per_client_mean_j": modelled_total / n},
    }
