"""The daemon's state directory: its checkpoint, written atomically after every round, and its lock.

The node's effective config is kept beside it (``node-config.toml``, written at start), so that
``edge-node export`` and ``edge-node report`` need nothing but the state directory.

A checkpoint holds the node's identity (node, fleet, architecture, fleet seed, client index, tier mode), the
number of completed rounds, its density (under width tiers also its tier), its weights (packed on the training
mask), both masks and a BatchNorm model's running statistics (FedBN: the node's own,
``edge_node.algorithm.norm_stats``).
Nothing else is needed to resume exactly: every random stream is derived from (fleet seed, client
index, round) (``edge_node.seeding``), so the round counter is the RNG state. A checkpoint of another
node, fleet, architecture, seed or client is refused, never overwritten; so is a corrupt one.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import torch

from edge_node.algorithm.dispfl import ClientState
from edge_node.checkpoint_io import load_payload, pack_weights, save_payload, unpack_weights
from edge_node.errors import CheckpointError, ConfigError, StorageError
from edge_node.storage import atomic_write_text, describe_failure
from edge_node.tomlconf import to_toml

CHECKPOINT_FILE = "checkpoint.pt"
LOCK_FILE = "lock"
NODE_CONFIG_FILE = "node-config.toml"
FORMAT = "edge-node/node-checkpoint/1"


@dataclass(frozen=True)
class Identity:
    """What a checkpoint must match to be resumed by this node."""

    node_id: str
    fleet: str
    arch_id: str
    seed: int
    client_index: int
    tier_mode: str = "mask"  # what a tier buys (a checkpoint before width tiers: mask); its state's shapes depend on it


@dataclass(frozen=True)
class Checkpoint:
    identity: Identity
    rounds_done: int  # completed rounds; the next round's index
    state: ClientState
    tier: str | None = None  # width tiers: the tier its state is narrow to (the mask's density does not say it)


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically (StorageError when it cannot; the old one stays)."""
    state = checkpoint.state
    save_payload(
        path,
        {
            "format": FORMAT,
            "identity": asdict(checkpoint.identity),
            "rounds_done": checkpoint.rounds_done,
            "density": state.density,
            "values": pack_weights(state.weights, state.train_mask),
            "train_mask": {k: v.cpu() for k, v in state.train_mask.items()},
            "next_mask": {k: v.cpu() for k, v in state.next_mask.items()},
            "buffers": {k: v.cpu() for k, v in state.buffers.items()},  # BatchNorm statistics: {} for most models
            "tier": checkpoint.tier,
        },
    )


def load_checkpoint(path: Path, expected: Identity, device: torch.device) -> Checkpoint | None:
    """The checkpoint at ``path`` (None when there is none), checked against ``expected``.

    Raises:
        CheckpointError: unreadable, not a node checkpoint, or another node's; the message says how to
            start over (the file is never touched here).
    """
    if not path.exists():
        return None
    payload: dict[str, Any] = load_payload(path, what="node checkpoint")
    if payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an edge-node node checkpoint ({FORMAT}); move it away to start over")
    try:
        found = Identity(**payload["identity"])
        train_mask = {k: v.to(device) for k, v in payload["train_mask"].items()}
        next_mask = {k: v.to(device) for k, v in payload["next_mask"].items()}
        weights = unpack_weights(payload["values"], train_mask)
        buffers = {k: v.to(device) for k, v in payload.get("buffers", {}).items()}  # none before BatchNorm models
        state = ClientState(weights, train_mask, next_mask, float(payload["density"]), buffers)
        rounds_done = int(payload["rounds_done"])
        tier = payload.get("tier")  # None: a mask-tier checkpoint (its density is its tier)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} is damaged ({type(exc).__name__}: {exc}); move it away to start over") from exc
    if found != expected:
        differ = [f"{k} {getattr(found, k)!r} (this node: {getattr(expected, k)!r})" for k in asdict(found)
                  if getattr(found, k) != getattr(expected, k)]  # fmt: skip
        raise CheckpointError(
            f"{path} belongs to another node or setting: {', '.join(differ)}; use another --state-dir or move"
            " the checkpoint away to start over"
        )
    return Checkpoint(found, rounds_done, state, tier if isinstance(tier, str) else None)


def checkpoint_identity(path: Path) -> Identity | None:
    """The identity a checkpoint was written by (None when there is none), for tools that only have the state dir.

    Raises:
        CheckpointError: unreadable or not a node checkpoint.
    """
    if not path.exists():
        return None
    payload: dict[str, Any] = load_payload(path, what="node checkpoint")
    if payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an edge-node node checkpoint ({FORMAT})")
    try:
        return Identity(**payload["identity"])
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is damaged ({type(exc).__name__}: {exc})") from exc


def save_node_config(state_dir: Path, config: Any) -> None:
    """The node's effective config as ``STATE_DIR/node-config.toml`` (StorageError when it cannot be written)."""
    atomic_write_text(state_dir / NODE_CONFIG_FILE, to_toml(config, header="# the config this node last started with"))


class StateDirLock:
    """An exclusive lock on the state directory, so two daemons never share one (released on exit)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        """Create the directory if needed and take the lock.

        Raises:
            ConfigError: another edge-node holds it (its pid is named).
            StorageError: the directory or lock file cannot be created.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+")  # noqa: SIM115 -- held open for the daemon's life
        except OSError as exc:
            raise StorageError(describe_failure(self.path, exc)) from exc
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ConfigError(
                f"another edge-node (pid {holder}) is running with state dir {self.path.parent}"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing drops the flock
            self._handle = None
