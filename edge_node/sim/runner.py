"""The synchronous simulation: N clients in one process, same ``algorithm`` functions as a device.

Each method is one module behind the :class:`~edge_node.sim.methods.Method` seam, found by name in the
registry (:mod:`edge_node.sim.methods`); this module runs whichever the config names, round after round,
and never tests a method's name: it asks the method for its initial state and its round, and writes
every round's record from what the method declares and its round returned. Every method writes the same
record fields (:data:`edge_node.records.SIM_KEYS`: a node entry per client beside the fleet's aggregates);
what does not apply to a method is null.

State lives on the chosen device for the whole run: the decoded data set (uint8), every client's
weights (dense, zero outside the training mask) and bool masks. A round works from the models as they
were at its start; nothing is deep-copied per peer. Randomness comes from generators derived from
(seed, purpose, client, round) and drawn on the CPU, so CPU and CUDA runs differ only by floating-point
noise.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from edge_node.algorithm import dense_nnz, forward_flops, read_weights, weight_positions
from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.algorithm.flops import WeightPositions
from edge_node.algorithm.graphed import GraphedStep
from edge_node.algorithm.norm_stats import has_running_stats
from edge_node.algorithm.training import StepReplay
from edge_node.data import Dataset, partition_clients
from edge_node.data.batches import ClientData, ImagePool
from edge_node.energy import EnergyAccountant, modelled_energy, open_meter
from edge_node.energy.base import Meter
from edge_node.errors import CheckpointError, ConfigError
from edge_node.models import TierWidth, arch_name, build_checked_model, build_width_model, tier_widths
from edge_node.pretrained import prepare_start, wire_spec
from edge_node.records import ROUNDS_LOG, SIM_KEYS, client_id, node_entry, node_means, task_fields
from edge_node.sim.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from edge_node.sim.config import SimConfig, saved_settings
from edge_node.sim.methods import RoundResult, RunState, SimContext
from edge_node.sim.methods.base import SERVER_ID, stderr_is_tty
from edge_node.sim.report import ACCURACY_PLOT, COMMUNICATION_PLOT, SUMMARY_FILE
from edge_node.sim.shard import SINGLE, Shard
from edge_node.storage import append_line, atomic_write_text, truncate_jsonl
from edge_node.task_names import format_metric
from edge_node.torch_threads import apply_threads
from edge_node.wire import ModelSpec

_LOGGER = logging.getLogger(__name__)

ENERGY_LOG = "energy.jsonl"
CONFIG_FILE = "config.json"
CLIENTS_FILE = "clients.json"  # each client's training/test sizes and class counts (report --masks reads it)
# Everything a run directory holds (what --fresh discards).
RUN_FILES = (
    CHECKPOINT_NAME, CHECKPOINT_NAME + ".tmp", ROUNDS_LOG, ENERGY_LOG, CONFIG_FILE, CLIENTS_FILE, SUMMARY_FILE,
    ACCURACY_PLOT, COMMUNICATION_PLOT,
)  # fmt: skip


def partition(config: SimConfig, dataset: Dataset) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Training and test index arrays per client for ``config`` (see ``data.partition_clients``)."""
    return partition_clients(
        dataset.train_y, dataset.test_y, dataset.num_classes, config.partition, config.clients, config.seed,
        config.samples_per_client,
    )  # fmt: skip


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
    shard: Shard = SINGLE,
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

    Under torchrun (``shard`` one of K processes, :mod:`edge_node.sim.shard`) every process trains its block
    of clients and computes every record; only the writer (process 0) reads the checkpoint (and sends it to
    the others), writes the run directory and calls the callbacks.
    """
    governor = apply_threads(config.threads)  # before the first step, as a daemon does (edge_node.torch_threads)
    device = resolve_device(config.device)
    model = build_checked_model(config.model, dataset.num_outputs, dataset.input_shape, config.seed)
    config.check_model(model)
    positions = weight_positions(model, dataset.input_shape)
    tiers = _tier_table(config, dataset, positions)  # width tiers' widths and shapes, checked before writing
    narrow_models = {
        width.density: build_width_model(config.model, dataset.num_outputs, dataset.input_shape, width.width)
        for width in tiers.values() if width.width < 1.0 and width.density in config.densities
    }  # fmt: skip
    model_start = prepare_start(model, config.init_weights, config.trainable, model_name=config.model)  # before writing
    method = config.method_spec
    if "neighbours" in method.uses and config.neighbour_count >= config.clients and config.topology == "random":
        raise ConfigError(f"neighbours={config.neighbours} must be less than clients={config.clients}")
    out = config.run_dir
    ckpt_path = out / CHECKPOINT_NAME
    notes: list[str] = []
    saved = shard.from_writer(lambda: _saved_run(ckpt_path, fresh, device if shard.world == 1 else torch.device("cpu")))
    if saved is not None:
        saved = _on_device(saved, device)
        config, notes = config.resumed_as(saved["config"])
        diff = config.differences(saved["config"])
        if diff:
            then, now = saved_settings(saved["config"]), config.to_json()
            detail = ", ".join(f"{k}: {then.get(k)!r} saved, {now[k]!r} now" for k in diff)
            raise CheckpointError(f"{out} holds a run with other settings ({detail}); use another --output or --fresh")
    params = config.dispfl_params().fitted(model)  # a BatchNorm model trains whole batches
    train_parts, test_parts = partition(config, dataset)
    meter = _open_meter(config.energy_backend)
    start_round = 0 if saved is None else saved["round"] + 1
    try:
        if not shard.writer:
            pass  # the writer alone touches the run directory
        elif on_start is not None:
            on_start(config, notes)
        else:
            for note in notes:
                _LOGGER.warning("%s: %s", out, note)
        if fresh and shard.writer:
            for name in RUN_FILES:
                (out / name).unlink(missing_ok=True)
        if shard.writer:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / CONFIG_FILE, json.dumps(config.to_json(), indent=2) + "\n")
            clients_info = _clients_info(config, dataset, train_parts, test_parts)
            atomic_write_text(out / CLIENTS_FILE, json.dumps(clients_info) + "\n")
            truncate_jsonl(out / ROUNDS_LOG, start_round)
            truncate_jsonl(out / ENERGY_LOG, start_round)
    except BaseException:
        meter.close()
        raise
    # A slow meter (NVML: about 4 ms a read, 400 boundaries a round) is read at boundaries on a thread of its own.
    accountant = EnergyAccountant(
        meter, out / ENERGY_LOG if shard.writer else None, read_on_thread=meter.read_cost_s > 0
    )
    model = model.to(device)
    init_weights = read_weights(model)
    pool = ImagePool.from_dataset(dataset, device)
    data = [ClientData.from_indices(pool, tr, te) for tr, te in zip(train_parts, test_parts, strict=True)]
    ctx = SimContext(
        config=config,
        params=params,
        model=model,
        data=data,
        init_weights=init_weights,
        positions=positions,
        dense=dense_nnz(model),
        spec=_travelling(
            wire_spec(arch_name(config.model), dataset.num_outputs, model, model_start),
            model,
            params,
            config.tier_mode,
            tiers,
        ),  # fmt: skip
        accountant=accountant,
        on_client=on_client,
        shard=shard,
        graphs=_graphs_factory(config, model, (params.batch_size, *pool.input_shape), params),
        governor=governor,
    )
    ctx.narrow_models = {tier: narrow.to(device) for tier, narrow in narrow_models.items()}
    state = method.initial_state(ctx) if saved is None else method.restore(ctx, saved)
    if saved is not None:
        _LOGGER.info("resuming %s from round %d", out, start_round)
    bar = tqdm(
        range(start_round, config.rounds),
        desc=f"rounds ({config.method})",
        disable=not (progress_bars_shown(config) and shard.writer),
        unit="round",
        initial=start_round,
        total=config.rounds,
    )
    try:
        for t in bar:
            started = time.perf_counter()
            state, result = method.round(ctx, t, state)
            record = build_record(config, params, ctx, t, state, result)
            record["wall_s"] = time.perf_counter() - started
            if shard.writer:
                append_line(out / ROUNDS_LOG, json.dumps(record))
                save_checkpoint(ckpt_path, round_index=t, config=config.to_json(), **method.checkpoint(state))
            accountant.close_round(t, modelled_j=record["modelled_energy"]["total_j"])
            if not shard.writer:
                continue
            headline = format_metric(record["acc_mean"], fraction=params.task.metric_is_fraction)
            bar.set_postfix({params.task.metric: headline})
            _LOGGER.info(
                "round %d: %s %s %s (%s), busiest node %s %.2f MB, %.1f s",
                t,
                config.method,
                params.task.metric,
                headline,
                record["acc_mean_is"],
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


def _travelling(spec: ModelSpec, model: nn.Module, params: DisPFLParams, tier_mode: str,
                tiers: Mapping[str, TierWidth]) -> ModelSpec:  # fmt: skip
    """``spec`` with the model's running statistics under ``norm_stats`` average (they travel, and are counted), and
    under width tiers each tier's narrow shapes (what a stream of the tier carries, and is counted)."""
    if params.norm_stats == "average":
        spec = spec.with_buffers(dict(model.named_buffers()))
    if tiers:
        spec = spec.with_tiers(tier_mode, {tier: width.shapes for tier, width in tiers.items()})
    return spec


def _graphs_factory(
    config: SimConfig, model: torch.nn.Module, batch_shape: tuple[int, ...], params: DisPFLParams
) -> Callable[[], StepReplay] | None:
    """With ``cuda_graphs``, for a method that trains through RoundHooks: the run's one captured step, built
    (warm-up and capture) when a client first trains. None otherwise (a method that ignores it was warned)."""
    if not (config.cuda_graphs and "cuda_graphs" in config.method_spec.uses):
        return None
    return functools.cache(lambda: GraphedStep(model, batch_shape, params.sgd(0)))


def _saved_run(path: Path, fresh: bool, device: torch.device) -> dict[str, Any] | None:
    """The checkpoint a run resumes from (None: none there, or ``fresh``)."""
    return load_checkpoint(path, device) if path.exists() and not fresh else None


def _on_device(saved: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``saved`` (a loaded checkpoint) with its tensors on ``device`` (the writer loads it on the CPU to send it)."""
    moved = dict(saved)
    for key in ("weights", "train_masks", "next_masks", "buffers"):
        moved[key] = [{k: v.to(device) for k, v in d.items()} for d in saved.get(key, [])]
    return moved


def progress_bars_shown(config: SimConfig) -> bool:
    """Whether :func:`run_simulation` draws progress bars (``progress`` set and stderr a terminal)."""
    return config.progress and stderr_is_tty()


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


def _tier_table(config: SimConfig, dataset: Dataset, positions: WeightPositions | None) -> dict[str, TierWidth]:
    """Every tier's width and narrow shapes under width tiers (edge_node.models.tier_widths), {} under tier_mode mask.
    ConfigError where the model's FLOPs cannot be counted; ModelError where it cannot build nested narrow models."""
    if config.tier_mode == "mask":
        return {}
    if positions is None:
        raise ConfigError(f"tier_mode {config.tier_mode}: the FLOPs of model {config.model} cannot be counted, so no "
                          "width can be chosen for a tier; use tier_mode mask")  # fmt: skip
    table = tier_widths(config.model, dataset.num_outputs, dataset.input_shape, positions)
    for width in table.values():
        if width.density in config.densities:
            _LOGGER.info("tier %g: width %g, %.3f of the dense FLOPs", width.density, width.width, width.flop_share)
    return table


def build_record(config: SimConfig, params: DisPFLParams, ctx: SimContext, t: int, state: RunState,
                 r: RoundResult) -> dict[str, Any]:  # fmt: skip
    """Round ``t``'s record: every key of :data:`~edge_node.records.SIM_KEYS`, from what the method declares and its
    round gave: a node entry per client, and the fleet's means built from them."""
    method = config.method_spec
    n = config.clients
    received, sent, paper_mb = r.received, r.sent, r.paper_mb
    loads = [a + b for a, b in zip(received, sent, strict=True)]
    busiest = max(range(n), key=lambda i: loads[i])
    busiest_node, busiest_bytes = client_id(busiest), loads[busiest]
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
    joules = [j for j in (m.total_j for m in modelled) if j is not None]
    modelled_total = sum(joules) if len(joules) == len(modelled) else None  # FLOPs unknown: joules unknown
    known_flops = [f for f in r.flops if f is not None]
    flops_known = len(known_flops) == len(r.flops)
    after = method.headline == "after"
    acc_after = r.acc_after if r.acc_after is not None else [None] * n
    nodes = [
        node_entry(client_id(i), before, acc_after[i], received[i], sent[i], headline=method.headline)
        for i, before in enumerate(r.acc_before)
    ]
    means = node_means(nodes)
    headline = means["acc_after_mean"] if after else means["acc_before_mean"]
    assert headline is not None, f"method {method.name}'s headline is acc_after, which its round did not measure"
    finite_losses = [x for x in r.losses if not math.isnan(x)]
    unknown = set(r.fields) - set(SIM_KEYS)
    assert not unknown, f"method {method.name} sets fields {sorted(unknown)} outside SIM_KEYS"
    record: dict[str, Any] = dict.fromkeys(SIM_KEYS)
    record.update({
        "round": t,
        "method": method.name,
        "partition": config.partition,
        "partition_variant": config.partition_variant,
        "lr": params.sgd(t).lr,
        "prune_rate": method.prune_rate(config, params, t),
        "acc_mean": headline,
        "acc_mean_is": method.acc_after_is if after else method.acc_before_is,
        "acc_before_is": method.acc_before_is,
        "acc_after_is": method.acc_after_is,
        **task_fields(params.task),
        **means,
        "nodes": nodes,
        "train_loss_mean": float(np.mean(finite_losses)) if finite_losses else None,
        "trained_clients": len(r.flops),
        "server_bytes_in": server_recv,
        "server_bytes_out": server_sent,
        "busiest_node": busiest_node,
        "busiest_node_bytes": busiest_bytes,
        "paper_comm_mb_mean": float(np.mean(paper_mb)),
        "paper_comm_mb_busiest": paper_busiest,
        "flops_per_client_mean": float(np.mean(known_flops)) if flops_known else None,  # None: unknown
        "flops_per_client_max": max(known_flops) if flops_known else None,
        "density_mean": float(np.mean([c.mask_density for c in state.clients])),
        "densities_target": sorted(set(ctx.densities)),
        "forward_flops_dense": forward_flops(ctx.positions, ctx.dense),
        "screen": config.screen if "screen" in method.uses else None,
        "screen_refusals": None if r.screen_refused is None else sum(len(v) for v in r.screen_refused.values()),
        "screen_refused": r.screen_refused,
        "norm_stats": config.norm_stats if has_running_stats(ctx.model) else None,  # FedBN's "local", or "average"
        "modelled_energy": {"label": "modelled", "total_j": modelled_total,
                            "per_client_mean_j": None if modelled_total is None else modelled_total / n},
        **r.fields,
    })  # fmt: skip
    return record
