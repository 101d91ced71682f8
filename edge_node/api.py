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
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from edge_node.node.config import NodeConfig
    from edge_node.node.daemon import Node
    from edge_node.sim.config import SimConfig

_LOGGER = logging.getLogger(__name__)
ROUNDS_FILE = "rounds.jsonl"  # a simulation run directory's and a node's state dir's (sim.report.ROUNDS_LOG)


def check_model_and_data(model: str, dataset: str, data_dir: Path | None = None, *, seed: int = 0) -> nn.Module:
    """Load ``dataset`` and build ``model`` for it, held to the model contract (docs/PLUGINS.md).

    What ``edge-node loopback`` runs before it creates the fleet directory, so that a broken factory or a
    BatchNorm model is one line (exit 2) instead of N failing daemons. Returns the built model.

    Raises:
        ModelError, DataError: one line naming the factory or layer and the fix.
    """
    from edge_node.data import load_dataset
    from edge_node.models import build_checked_model

    data = load_dataset(dataset, data_dir)
    return build_checked_model(model, data.num_classes, data.input_shape, seed)


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
        data = load_dataset(config.dataset, config.data_dir, cache_dir=cache_dir, download=download)
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
) -> Path:
    """Run one node: check everything, start serving, train ``config.rounds`` rounds (0: until stopped).

    Returns its state directory (``rounds.jsonl``, ``energy.jsonl``, the checkpoint). ``node.handle_exit()``
    from another thread or a signal handler stops it cleanly; the node shuts down (mDNS goodbye, lock
    released) however the run ends.

    Args:
        before_start: called with the node before its checks and start-up (e.g. to install signal handlers).
        serving: called once the node has started and serves its peers.
    """
    from edge_node.node.daemon import Node, Stopped

    node = Node(config)
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

    ``path`` is the directory or its ``rounds.jsonl``. A simulation record has ``round``, ``acc_mean`` and the
    byte, FLOP and energy figures; a node's has ``round``, ``acc_before``, ``acc_after``, bytes and peers.

    Raises:
        CheckpointError: no records there, or a line that is not JSON.
    """
    from edge_node.sim.report import read_rounds

    path = Path(path)
    return read_rounds(path.parent if path.is_file() and path.name == ROUNDS_FILE else path)
