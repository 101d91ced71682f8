"""The Python API: run a simulation, run a node, read the records either writes (docs/API.md).

The ``edge-node simulate``, ``start`` and ``loopback`` commands are thin layers over these functions: they
parse flags into a :class:`~edge_node.sim.config.SimConfig` or :class:`~edge_node.node.config.NodeConfig`,
call them, and print. Everything is checked before anything is written, as on the command line; errors
are :class:`~edge_node.errors.EdgeNodeError` subclasses with a one-line message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from edge_node.algorithm.poison import Poisoning
    from edge_node.data.batches import ClientData
    from edge_node.node.config import NodeConfig
    from edge_node.node.daemon import Node
    from edge_node.sim.config import SimConfig

_LOGGER = logging.getLogger(__name__)


def check_model_and_data(
    model: str, dataset: str, data_dir: Path | None = None, *, seed: int = 0, task: str = "classification"
) -> nn.Module:
    """Load ``dataset`` and build ``model`` for it, held to the model contract (docs/PLUGINS.md).

    What ``edge-node loopback`` runs before it creates the fleet directory, so that a broken factory or a
    BatchNorm model is one line (exit 2) instead of N failing daemons. Returns the built model.

    Raises:
        ModelError, DataError: one line naming the factory or layer and the fix.
    """
    from edge_node.data import load_dataset
    from edge_node.models import build_checked_model

    data = load_dataset(dataset, data_dir, task=task)
    return build_checked_model(model, data.num_outputs, data.input_shape, seed)


def check_start(
    model: str, dataset: str, data_dir: Path | None, init_weights: Path | None, trainable: tuple[str, ...], *,
    seed: int = 0, task: str = "classification",
) -> None:  # fmt: skip
    """Build ``model`` for ``dataset`` and start it from ``init_weights``, frozen but for ``trainable``
    (edge_node.pretrained): what ``edge-node loopback`` runs before it creates the fleet directory, so that a
    bad file or glob is one line (exit 2) instead of N failing daemons.

    Raises:
        ConfigError, ModelError, DataError: one line.
    """
    from edge_node.pretrained import prepare_start

    prepare_start(check_model_and_data(model, dataset, data_dir, seed=seed, task=task), init_weights, trainable,
                  model_name=model)  # fmt: skip


def run_simulation(
    config: SimConfig,
    *,
    fresh: bool = False,
    cache_dir: Path | None = None,
    download: bool = False,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[SimConfig, list[str]], None] | None = None,
    on_client: Callable[[int, int, int], None] | None = None,
) -> Path:
    """Run (or resume) the simulation ``config`` describes; returns its run directory.

    Loads the data set (``config.dataset``: a built-in name or a data factory), checks the model against
    it, then writes ``config.json``, ``rounds.jsonl`` (one record per round, see :func:`read_records`),
    ``energy.jsonl``, ``checkpoint.pt`` and ``summary.json`` to ``config.run_dir``.

    Args:
        fresh: discard a previous run in the run directory (once everything checked out).
        cache_dir: where decoded data sets are cached (default ``$EDGE_NODE_CACHE`` or ~/.cache/edge-node).
        download: fetch the CIFAR tarball when it is absent.
        on_round: called with each round's record once it is saved.
        on_start: called with the settings the run goes on with and notes on what a resume adapted.
        on_client: called with (round index, clients done, clients) as a round's clients finish, when no
            progress bars are drawn (a pipe or a service: a long round is not silent).

    Started by ``torchrun --nproc-per-node K``, the K processes split the clients (see
    :mod:`edge_node.sim.shard`); process 0 alone writes the run directory and calls the callbacks.
    """
    from edge_node.data import load_dataset
    from edge_node.energy.report import load_energy_log
    from edge_node.energy.report import summarize as energy_summary
    from edge_node.sim.report import SUMMARY_FILE, summarize
    from edge_node.sim.runner import resolve_device
    from edge_node.sim.runner import run_simulation as run
    from edge_node.sim.shard import join
    from edge_node.storage import atomic_write_text

    resolve_device(config.device)  # before the (possibly long) data decode
    shard = join(config.method, config.method_spec.shardable, config.clients, config.device)
    try:
        data = load_dataset(config.dataset, config.data_dir, cache_dir=cache_dir, download=download, task=config.task)
        run_dir = run(config, data, fresh=fresh, on_round=on_round, on_start=on_start, on_client=on_client,
                      shard=shard)  # fmt: skip
    finally:
        shard.close()
    if shard.writer:
        summary = summarize(read_records(run_dir), energy_summary(load_energy_log(run_dir)))
        atomic_write_text(run_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return run_dir


def run_node(
    config: NodeConfig,
    *,
    before_start: Callable[[Node], None] | None = None,
    serving: Callable[[Node], None] | None = None,
    poisoning: Poisoning | None = None,
) -> Path:
    """Run one node: check everything, start serving, train ``config.rounds`` rounds (0: until stopped).

    Returns its state directory (``rounds.jsonl``, ``energy.jsonl``, the checkpoint). ``node.handle_exit()``
    from another thread or a signal handler stops it cleanly; the node shuts down (mDNS goodbye, lock
    released) however the run ends.

    Args:
        before_start: called with the node before its checks and start-up (e.g. to install signal handlers).
        serving: called once the node has started and serves its peers.
        poisoning: a loopback fleet's attack settings (edge_node.cli._attacker); never a node setting.
    """
    from edge_node.node.daemon import Node, Stopped

    node = Node(config, poisoning=poisoning)
    if before_start is not None:
        before_start(node)
    try:
        node.startup()
        if serving is not None:
            serving(node)
        node.main_loop()
    except Stopped:  # a signal during start-up or a compute-only section: shutdown below is all there is to do
        _LOGGER.info("stopped during start-up")
    finally:
        node.shutdown()
    return config.state_dir


def read_records(path: Path | str) -> list[dict[str, Any]]:
    """The per-round records (dicts) of a simulation run directory or a node's state directory, in order.

    ``path`` is the directory or its ``rounds.jsonl``. One schema for both (docs/API.md, "Round records"): a
    node's record is one node entry (``node_id``, ``acc_before``, ``acc_after``, ``metrics``, ``bytes_in``,
    ``bytes_out``) with its peers, energy and the task's metric names; a simulation's holds one entry per client
    under ``nodes`` beside the fleet's means (``acc_mean``, ``acc_before_mean``, ...), bytes, FLOPs and energy.
    Records of older versions are read under today's names (:func:`edge_node.records.upgrade_record`).

    Raises:
        CheckpointError: no records there, or a line that is not JSON.
    """
    from edge_node.records import ROUNDS_LOG
    from edge_node.records import read_records as read

    path = Path(path)
    return read(path.parent if path.is_file() and path.name == ROUNDS_LOG else path)


def load_trained(path: Path | str, client: int | None = None) -> nn.Module:
    """The trained model a node's state directory or a simulation's run directory holds, ready for inference.

    ``path`` is a node's state dir (``client`` None: it holds one model) or a simulation's run dir
    (``client`` required: the index of the client whose personalized model to load). The model is built
    from the saved config (its model name and seed, the data set's classes and input shape) and returned
    on the CPU in eval mode, with the checkpoint's masked weights (zero outside the client's mask) and its
    buffers where the checkpoint holds any (BatchNorm statistics; ``load_state_dict`` semantics: a buffer
    the checkpoint lacks keeps the built value). The data set is loaded to know its classes and shape.

    Raises:
        CheckpointError: no such directory, no checkpoint in it, an unreadable one, or ``client`` missing
            for a run dir, given for a state dir, or out of range.
        ModelError, DataError: the saved model or data set cannot be built here (its package not installed).
    """
    from edge_node.node.export import with_weights

    trained = trained_model(Path(path), client)
    return with_weights(trained.model, trained.weights, trained.buffers)


@dataclass(frozen=True)
class TrainedModel:
    """A checkpoint's trained model with what exporting and checking it take (``edge-node export``)."""

    model: nn.Module  # as built from the saved seed, on the CPU (the checkpoint's tensors not loaded)
    weights: dict[str, torch.Tensor]  # dense, zero outside the mask
    buffers: dict[str, torch.Tensor]  # BatchNorm statistics; {} when the checkpoint holds none
    input_shape: tuple[int, ...]
    test_data: ClientData  # the client's local test samples
    description: str  # "n0's model after round 3", "client 2's model after round 5 of RUN_DIR"
    default_onnx: str  # the file name ``export`` writes without --onnx


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a simulation's run directory (it has ``config.json``), not a node's state dir."""
    from edge_node.sim.runner import CONFIG_FILE

    return (path / CONFIG_FILE).is_file()


def trained_model(path: Path, client: int | None, *, check_export: bool = False) -> TrainedModel:
    """The trained model in ``path`` (see :func:`load_trained`); ``check_export``: refuse one that cannot be
    exported to ONNX (ModelError) before its data is sliced."""
    from edge_node.cli._node_options import load_saved_node_config
    from edge_node.errors import CheckpointError

    if not path.is_dir():
        raise CheckpointError(f"no directory {path}: give a node's state dir or a simulation's run dir")
    if is_run_dir(path):
        if client is None:
            raise CheckpointError(f"{path} is a simulation's run dir: name the client whose model to load (client=K)")
        return run_trained(path, client, check_export=check_export)
    if client is not None:
        raise CheckpointError(f"{path} is a node's state dir, which holds one model: give no client")
    return node_trained(load_saved_node_config(None, {"state_dir": path}), check_export=check_export)


def node_trained(config: NodeConfig, *, check_export: bool = False) -> TrainedModel:
    """The model of the node ``config`` describes (from :func:`load_saved_node_config`), from its checkpoint."""
    import torch

    from edge_node.errors import CheckpointError
    from edge_node.node.local_data import load_local_data
    from edge_node.node.local_model import node_model
    from edge_node.node.state import CHECKPOINT_FILE, Identity, load_checkpoint
    from edge_node.node.status import round_label

    node_id, client = config.resolved_node_id, config.resolved_client_index
    device = torch.device("cpu")
    local = load_local_data(config, client, device)
    model, spec = node_model(config, local, check_export="export" if check_export else None)
    path = config.state_dir / CHECKPOINT_FILE
    identity = Identity(node_id, config.fleet, spec.arch_id, config.seed, client, config.tier_mode)
    saved = load_checkpoint(path, identity, device)
    if saved is None:
        raise CheckpointError(f"no checkpoint at {path}: the node has not completed a round there yet")
    return TrainedModel(
        model, saved.state.weights, dict(getattr(saved.state, "buffers", None) or {}), local.data.pool.input_shape,
        local.data, f"{node_id}'s model after {round_label(saved.rounds_done - 1)}", f"{node_id}.onnx",
    )  # fmt: skip


def run_trained(run_dir: Path, client: int, *, check_export: bool = False) -> TrainedModel:
    """Client ``client``'s model from the checkpoint of the simulation run in ``run_dir``."""
    import torch

    from edge_node.data import load_dataset
    from edge_node.data.batches import ClientData, ImagePool
    from edge_node.errors import CheckpointError, ModelError
    from edge_node.models import build_checked_model
    from edge_node.node.export import onnx_problem
    from edge_node.node.local_model import EXPORT_FIX
    from edge_node.node.status import round_label
    from edge_node.sim.checkpoint import CHECKPOINT_NAME, load_checkpoint
    from edge_node.sim.config import DERIVED_KEYS, SimConfig, saved_settings
    from edge_node.sim.runner import partition
    from edge_node.tomlconf import build

    path = run_dir / CHECKPOINT_NAME
    if not run_dir.is_dir():
        raise CheckpointError(f"no run dir {run_dir}: give the --output directory of an edge-node simulate run")
    if not path.is_file():
        raise CheckpointError(f"no checkpoint in {run_dir}: the simulation has not completed a round there yet")
    saved = load_checkpoint(path, torch.device("cpu"))
    values = {k: v for k, v in saved_settings(saved["config"]).items() if k not in DERIVED_KEYS}
    config = build(SimConfig, values, str(path))
    if not 0 <= client < config.clients:
        raise CheckpointError(f"client {client} is not in {run_dir}: its clients are 0..{config.clients - 1}")
    dataset = load_dataset(config.dataset, config.data_dir, task=config.task)
    model = build_checked_model(config.model, dataset.num_outputs, dataset.input_shape, config.seed)
    if check_export:
        problem = onnx_problem(model, dataset.input_shape)
        if problem is not None:
            raise ModelError(f"model {config.model} cannot be exported to ONNX ({problem}): {EXPORT_FIX['export']}")
    train_parts, test_parts = partition(config, dataset)
    data = ClientData.from_indices(ImagePool.from_dataset(dataset), train_parts[client], test_parts[client])
    buffers = saved.get("buffers") or []
    return TrainedModel(
        model, saved["weights"][client], dict(buffers[client]) if client < len(buffers) else {},
        tuple(dataset.input_shape), data, f"client {client}'s model after {round_label(saved['round'])} of {run_dir}",
        f"client-{client}.onnx",
    )  # fmt: skip
