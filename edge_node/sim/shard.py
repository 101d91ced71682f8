"""A simulation's clients split over the processes ``torchrun`` starts (torch.distributed: gloo on CPU, NCCL on GPU).

Process ``r`` of ``K`` trains one contiguous block of clients; after its clients' rounds every process
gathers every client's new state (collectives, one packed tensor per process) and the small per-client
results (accuracies, losses, FLOPs), so each process starts the next round with all round-start models and
computes the same record. All of them are needed: the writer (process 0) checkpoints every client after
every round, and with the paper's random 10-neighbour topology a block's clients pull from nearly every
other block. Only the writer touches the run directory.

One process (no ``WORLD_SIZE`` above 1 in the environment) is :data:`SINGLE`: no collectives, no copies.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from edge_node.algorithm.dispfl import ClientState
from edge_node.errors import ConfigError

T = TypeVar("T")
# Longest wait of a collective: a round's slowest block (the cnn paper setting's whole round is about 200 s
# on 2 CPU cores); a process that died is reported by torchrun, which stops the others, long before this.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


def world_size() -> int:
    """How many processes the launcher started (torchrun's ``WORLD_SIZE``; 1 without a launcher)."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} must be an integer") from None


def is_writer() -> bool:
    """Whether this process writes the run directory (torchrun's ``RANK`` 0, or no launcher)."""
    return os.environ.get("RANK", "0") == "0"


def block(rank: int, world: int, n: int) -> range:
    """The clients process ``rank`` of ``world`` trains: a contiguous block, sizes differing by at most one."""
    return range(rank * n // world, (rank + 1) * n // world)


def check_shardable(method_name: str, shardable: bool, clients: int, world: int) -> None:
    """ConfigError in one line when ``world`` processes cannot run this method or this many clients."""
    if world == 1:
        return
    if not shardable:
        raise ConfigError(
            f"method {method_name!r} cannot run over {world} processes (its round needs more than the round-start "
            "models of other clients: a server's global model or a vote across clients); run it in one process"
        )
    if clients < world:
        raise ConfigError(f"clients={clients} must be at least the number of processes ({world})")


@dataclass(frozen=True)
class Shard:
    """This process's place among the run's processes."""

    rank: int = 0
    world: int = 1
    created_group: bool = False  # whether this process group was started here (and is ended by :meth:`close`)

    @property
    def writer(self) -> bool:
        return self.rank == 0

    def clients(self, n: int) -> range:
        """The clients this process trains."""
        return block(self.rank, self.world, n)

    def close(self) -> None:
        """End the process group if this shard started it."""
        if self.created_group and dist.is_initialized():
            dist.destroy_process_group()

    def from_writer(self, produce: Callable[[], T]) -> T:
        """``produce()`` run by the writer and sent to every process; its error raised in every process."""
        if self.world == 1:
            return produce()
        box: list[Any] = [None]
        if self.writer:
            try:
                box[0] = ("ok", produce())
            except Exception as exc:  # every process raises it, none waits for a value that never comes
                box[0] = ("error", exc)
        dist.broadcast_object_list(box, src=0)
        status, value = box[0]
        if status == "error":
            raise value
        return value  # type: ignore[no-any-return]

    def gather_objects(self, mine: dict[int, T], n: int) -> list[T]:
        """Every client's small result (picklable), in client order, from the process that computed it."""
        if self.world == 1:
            return [mine[i] for i in range(n)]
        parts: list[dict[int, T] | None] = [None] * self.world
        dist.all_gather_object(parts, mine)
        merged: dict[int, T] = {}
        for part in parts:
            assert part is not None
            merged.update(part)
        return [merged[i] for i in range(n)]

    def gather_states(self, mine: dict[int, ClientState], densities: Sequence[float]) -> list[ClientState]:
        """Every client's state, in client order: this block's as they are, the others' from one all_gather
        of a packed float tensor (weights) and a packed uint8 tensor (both masks) per process."""
        n = len(densities)
        if self.world == 1:
            return [mine[i] for i in range(n)]
        blocks = [block(r, self.world, n) for r in range(self.world)]
        width = max(len(b) for b in blocks)
        sample = mine[blocks[self.rank][0]]
        w_names, m_names = list(sample.weights), list(sample.train_mask)
        w_like, m_like = [sample.weights[k] for k in w_names], [sample.train_mask[k] for k in m_names]
        dtype, device = w_like[0].dtype, w_like[0].device
        w_size, m_size = sum(t.numel() for t in w_like), sum(t.numel() for t in m_like)
        weights = torch.zeros((width, w_size), dtype=dtype, device=device)
        masks = torch.zeros((width, 2 * m_size), dtype=torch.uint8, device=device)
        for row, i in enumerate(blocks[self.rank]):
            state = mine[i]
            weights[row] = torch.cat([state.weights[k].reshape(-1).to(dtype) for k in w_names])
            masks[row] = torch.cat(
                [state.train_mask[k].reshape(-1) for k in m_names] + [state.next_mask[k].reshape(-1) for k in m_names]
            ).to(torch.uint8)
        all_weights = [torch.empty_like(weights) for _ in range(self.world)]
        all_masks = [torch.empty_like(masks) for _ in range(self.world)]
        dist.all_gather(all_weights, weights)
        dist.all_gather(all_masks, masks)
        out: list[ClientState] = []
        for r, clients in enumerate(blocks):
            for row, i in enumerate(clients):
                if r == self.rank:
                    out.append(mine[i])
                    continue
                flat_m = all_masks[r][row].bool()
                out.append(
                    ClientState(
                        _unflatten(all_weights[r][row], w_names, w_like),
                        _unflatten(flat_m[:m_size], m_names, m_like),
                        _unflatten(flat_m[m_size:], m_names, m_like),
                        densities[i],
                    )
                )
        if sample.buffers:  # BatchNorm statistics (small): pickled, one gather of every process's clients
            theirs = self.gather_objects({i: {k: v.cpu() for k, v in mine[i].buffers.items()} for i in mine}, n)
            out = [c if i in mine else replace(c, buffers={k: v.to(device) for k, v in theirs[i].items()})
                   for i, c in enumerate(out)]  # fmt: skip
        return out


SINGLE = Shard()


def _unflatten(flat: torch.Tensor, names: list[str], like: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for name, t in zip(names, like, strict=True):
        out[name] = flat[at : at + t.numel()].view(t.shape)
        at += t.numel()
    return out


def join(method_name: str, shardable: bool, clients: int, device_name: str) -> Shard:
    """This process's shard: :data:`SINGLE` without a launcher, else its rank in a process group started
    here (gloo on CPU; NCCL on ``cuda``, one GPU per process by ``LOCAL_RANK``). Refuses, before any
    collective, a method or client count that cannot be split (every process raises the same line)."""
    world = world_size()
    check_shardable(method_name, shardable, clients, world)
    if world == 1:
        return SINGLE
    created = False
    if not dist.is_initialized():
        backend = "gloo"
        if device_name == "cuda":
            backend = "nccl"
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
        created = True
    if dist.get_world_size() != world:
        raise ConfigError(f"the process group has {dist.get_world_size()} processes, WORLD_SIZE says {world}")
    return Shard(dist.get_rank(), world, created)
