"""The method seam of the simulation: what a learning method declares, and what every method's round may use.

A method is one instance of a :class:`Method` subclass in one module, listed once in
:mod:`edge_node.sim.methods` (the registry). The runner, its config and the report read only what the
method declares here (its density rule, the settings it uses, its headline accuracy and what
``acc_before``/``acc_after`` mean, its initial state, its round) and never test a method's name.

:class:`SimContext` is what stays fixed over a run and is shared by every method: the one model buffer
each client's weights are loaded into in turn, the clients' data, the byte and FLOP accounting of the
records, energy phases and progress bars.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from tqdm import tqdm

from edge_node.algorithm import nnz_per_tensor, round_training_flops
from edge_node.algorithm.dense import dense_state
from edge_node.algorithm.dispfl import ClientState, DisPFLParams, Evaluated, RoundHooks, evaluate_and_train
from edge_node.algorithm.flops import WeightPositions
from edge_node.algorithm.tasks import CLASSIFICATION, Task
from edge_node.algorithm.tasks import score as task_score
from edge_node.algorithm.topology import round_neighbours
from edge_node.algorithm.training import StepReplay
from edge_node.data.batches import Batch, ClientData
from edge_node.energy import EnergyAccountant
from edge_node.errors import TrainingDiverged
from edge_node.protocol import tier_name
from edge_node.sim.shard import SINGLE, Shard
from edge_node.torch_threads import ThreadGovernor, tick
from edge_node.wire import ModelSpec, ValueType, encoded_model_size

if TYPE_CHECKING:
    from edge_node.sim.config import SimConfig

SIM_FLEET_ID = "sim"  # header fields the byte count uses: node ids are client-<i>, a server "server"
SERVER_ID = "server"
T = TypeVar("T")
PAPER_BYTES_PER_VALUE = 4  # the paper's Comm (MB): fp32 values of the received models, 1 MB = 1e6 B
# Settings only some methods use (a method lists those it uses in ``Method.uses``; the others warn).
NEIGHBOURHOOD = frozenset({"neighbours", "topology", "max_in_degree"})  # pulls from seeded neighbours
MASKS = frozenset({"density", "regrow", "mask_init", "prune_alpha", "planned_rounds"})  # trains sparse masks
# Trains through RoundHooks (evaluate_and_train), whose ``graphs`` replays captured steps (--cuda-graphs).
GRAPHED = frozenset({"cuda_graphs"})
# A server round's bytes: per-client received, sent, paper MB, and the server's (received, sent, paper MB).
Traffic = tuple[list[int], list[int], list[float], tuple[int, int, float]]


@dataclass
class RunState:
    """The state carried from round to round: the method's client models (a server's global model as the
    one entry for a centralised method whose clients keep nothing), its own bookkeeping, and the server's model
    of a method whose clients keep personal models beside it; all checkpointed."""

    clients: list[ClientState]
    extra: dict[str, Any] = field(default_factory=dict)
    server: ClientState | None = None  # a server's model kept beside the clients' (``Method.keeps_server``)


@dataclass
class RoundResult:
    """What a method's round produced, per client, before the runner makes it a record.

    ``fields`` holds the values of method-specific record keys (``edge_node.records.SIM_KEYS``; null
    for every method that does not set them).
    """

    acc_before: list[float]
    acc_after: list[float] | None
    losses: list[float]
    flops: list[float | None]  # per trained client; None: unknown (the model's FLOPs could not be counted)
    received: list[int]  # bytes per client
    sent: list[int]
    paper_mb: list[float]  # per client
    server: tuple[int, int, float] | None = None  # (received, sent, paper MB) of a server
    screen_refused: dict[str, dict[str, str]] | None = None  # client -> peer -> reason (screening methods)
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Method(ABC):
    """A learning method of the simulation: its declarations, and its round over all clients.

    Attributes:
        name: the ``--method`` value and the records' ``method``.
        label: the row of the report's table.
        acc_before_is, acc_after_is: what the records' ``acc_before``/``acc_after`` measure (None: not
            measured; the round returns ``acc_after=None``).
        headline: "before" or "after": which of the two is the headline accuracy (``acc_mean``).
        sparse: trains masked models at ``density`` (or setting ii's tiers) and updates the masks;
            otherwise dense at density 1 (``setting`` ii is refused).
        uses: the settings of :data:`NEIGHBOURHOOD`, :data:`MASKS` and other methods' own settings that
            this method reads; giving another one warns that it is ignored.
        shardable: its round touches client ``i``'s state only through round-start models, so the clients
            may be split over processes (the sharded runner of issue 22 refuses the others by name).
        keeps_server: ``RunState.server`` holds a server's model beside the clients' personal ones
            (checkpointed after them).
        keeps_norm_stats: each client's state carries its BatchNorm running statistics from round to round
            (``ClientState.buffers``, FedBN's ``norm_stats`` local); a method without it refuses a BatchNorm model.
        averages_norm_stats: its round averages those statistics with the peers' under ``norm_stats`` average
            (DisPFL's client round, given the round-start clients' buffers); a method without it refuses average.
        width_tiers: its clients always train their tier's narrow model (``tier_mode`` width, HeteroFL): dense
            but tiered, so setting ii is allowed.
    """

    name: str
    label: str
    acc_before_is: str
    acc_after_is: str | None
    headline: str = "after"
    sparse: bool = False
    uses: frozenset[str] = frozenset()
    shardable: bool = False
    keeps_server: bool = False
    keeps_norm_stats: bool = False
    averages_norm_stats: bool = False
    width_tiers: bool = False

    def check(self, config: SimConfig) -> None:
        """Method-specific checks of ``config`` (ConfigError in one line); the shared ones are SimConfig's."""
        return None  # most methods need none beyond SimConfig's

    def state_densities(self, ctx: SimContext) -> list[float]:
        """The density of each entry of ``RunState.clients`` (one per client unless a server holds the model)."""
        return ctx.densities

    def initial_state(self, ctx: SimContext) -> RunState:
        """The state before round 0: by default every client dense on the fleet's initial weights."""
        return RunState([dense_state(ctx.init_weights) for _ in ctx.densities])

    def prune_rate(self, config: SimConfig, params: DisPFLParams, t: int) -> float | None:
        """The records' ``prune_rate`` of round ``t``: the cosine schedule of a sparse method, else None."""
        return params.prune_rate(t) if self.sparse else None

    def restore(self, ctx: SimContext, saved: dict[str, Any]) -> RunState:
        """The state a checkpoint holds (written by :meth:`checkpoint`)."""
        densities = self.state_densities(ctx) + ([1.0] if self.keeps_server else [])
        buffers = saved.get("buffers") or [{} for _ in densities]  # a checkpoint before BatchNorm models: none
        entries = [
            ClientState(w, tm, nm, d, b)
            for w, tm, nm, d, b in zip(
                saved["weights"], saved["train_masks"], saved["next_masks"], densities, buffers, strict=True
            )
        ]
        server = entries.pop() if self.keeps_server else None
        return RunState(entries, dict(saved.get("extra") or {}), server)

    def checkpoint(self, state: RunState) -> dict[str, Any]:
        """What the checkpoint saves of ``state``: each entry's weights, masks and BatchNorm statistics (a server's
        last), ``extra``."""
        clients = state.clients + ([state.server] if state.server is not None else [])
        return {
            "weights": [c.weights for c in clients],
            "train_masks": [c.train_mask for c in clients],
            "next_masks": [c.next_mask for c in clients],
            "buffers": [c.buffers for c in clients],
            "extra": state.extra,
        }

    @abstractmethod
    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        """Round ``t`` of every client: the new state and the per-client results (each method's own)."""


def score(model: torch.nn.Module, data: ClientData, batch_size: int, task: Task = CLASSIFICATION) -> float:
    """The task's headline metric of ``model`` as it is on the client's test samples (top-1 accuracy for
    classification), carrying the task's other metrics (a :class:`~edge_node.algorithm.tasks.Score`)."""
    return task_score(model, data.eval_batches(batch_size), task)


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


@dataclass
class SimContext:
    """What stays fixed over a run's rounds: settings, the shared model buffer, data, accounting."""

    config: SimConfig
    params: DisPFLParams
    model: torch.nn.Module  # one module; each client's weights are loaded into it in turn
    data: list[ClientData]
    init_weights: dict[str, torch.Tensor]  # the fleet's shared initial weights
    positions: WeightPositions | None  # flops.weight_positions of the model; None: its FLOPs are unknown
    dense: dict[str, int]
    spec: ModelSpec
    accountant: EnergyAccountant
    on_client: Callable[[int, int, int], None] | None = None  # progress without bars (a pipe): (t, done, of)
    shard: Shard = SINGLE  # which clients this process trains (all of them without torchrun)
    # The run's captured training step (--cuda-graphs), built on first call; None: eager steps.
    graphs: Callable[[], StepReplay] | None = None
    # The thread policy (edge_node.torch_threads), ticked between training batches; None: a fixed count.
    governor: ThreadGovernor | None = None
    # Width tiers (``tier_mode`` width or both, edge_node.algorithm.width): each tier's narrow model, by the tier's
    # density; {} under tier_mode mask (every client trains ``model``).
    narrow_models: dict[float, torch.nn.Module] = field(default_factory=dict)
    densities: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.densities = self.config.densities

    # ----- width tiers

    def model_of(self, i: int) -> torch.nn.Module:
        """The model client ``i`` trains: its tier's narrow model under width tiers, else the one shared ``model``."""
        return self.narrow_models.get(self.densities[i], self.model)

    def within(self, i: int) -> dict[str, tuple[int, ...]] | None:
        """Client ``i``'s narrow model's parameter shapes (its prefixes), None where it trains the full model."""
        narrow = self.narrow_models.get(self.densities[i])
        return None if narrow is None else {name: tuple(p.shape) for name, p in narrow.named_parameters()}

    def tier_of(self, i: int) -> str | None:
        """Client ``i``'s tier as its streams name it under width tiers (protocol 1.5), None under mask tiers."""
        return None if self.config.tier_mode == "mask" else tier_name(self.densities[i])

    def mask_density(self, i: int) -> float:
        """Client ``i``'s mask density: its tier's (tier_mode mask), 1 inside its narrow model (width), or
        ``density`` inside it (both)."""
        mode = self.config.tier_mode
        return self.densities[i] if mode == "mask" else 1.0 if mode == "width" else self.config.density

    def dense_of(self, i: int) -> dict[str, int]:
        """Client ``i``'s model's element count per parameter (its narrow model's under width tiers)."""
        return {name: math.prod(shape) for name, shape in (self.within(i) or {}).items()} or self.dense

    # ----- accounting

    def model_bytes(self, nnz: dict[str, int], node_id: str, t: int, buffers: bool = False,
                    tier: str | None = None) -> int:  # fmt: skip
        """Bytes the encoder produces for a model with ``nnz`` active values per tensor, sent by ``node_id``
        (the spec's tensors: frozen parameters never travel), with the spec's buffers when ``buffers``
        (``norm_stats`` average, a client that has trained); under width tiers a stream of ``tier`` carries
        that tier's narrow shapes."""
        total = sum(self.dense[name] for name in self.spec.shapes)
        return encoded_model_size(
            self.spec,
            nnz,
            ValueType.FLOAT32,
            node_id=node_id,
            fleet_id=SIM_FLEET_ID,
            round=max(t - 1, 0),
            density=sum(nnz.values()) / total,
            buffers=buffers,
            tier=tier,
        )

    def traffic(self, t: int, clients: list[ClientState], nbrs: list[list[int]]) -> dict[str, Any]:
        """Bytes each node receives and sends in round ``t``: what the encoder puts on the wire per pull."""
        n = len(clients)
        travels = self.spec.shapes  # not the frozen parameters (edge_node.algorithm.frozen)
        published_nnz = [{k: v for k, v in nnz_per_tensor(c.train_mask).items() if k in travels} for c in clients]
        model_active = [sum(nnz.values()) for nnz in published_nnz]
        buffered = [bool(self.spec.buffers and c.buffers) for c in clients]  # norm_stats average, once trained
        model_bytes = [self.model_bytes(nnz, f"client-{j}", t, buffered[j], self.tier_of(j))
                       for j, nnz in enumerate(published_nnz)]  # fmt: skip
        received = [sum(model_bytes[j] for j in nbrs[i]) for i in range(n)]
        served = [0] * n
        for i in range(n):
            for j in nbrs[i]:
                served[j] += 1
        sent = [served[j] * model_bytes[j] for j in range(n)]
        paper_mb = [PAPER_BYTES_PER_VALUE * sum(model_active[j] for j in nbrs[i]) / 1e6 for i in range(n)]
        return {"received": received, "sent": sent, "paper_mb": paper_mb}

    def mask_bytes(self) -> int:
        """Bytes of a whole-model mask sent as a raw bitmap (1 bit per position, per tensor rounded up to bytes)."""
        return sum(math.ceil(n / 8) for n in self.dense.values())

    def server_traffic(self, t: int, chosen: Sequence[int], down: Sequence[dict[str, int]],
                       up: Sequence[dict[str, int]], up_extra: int = 0) -> Traffic:  # fmt: skip
        """Bytes of a server round: sampled client ``chosen[k]`` receives a model of ``down[k]`` active values per
        tensor and sends one of ``up[k]`` (plus ``up_extra`` bytes, a mask); the others move nothing.

        Returns per-client received, sent, paper MB (4 B per received value), and the server's (received,
        sent, paper MB).
        """
        n = self.config.clients
        received, sent, paper_mb = [0] * n, [0] * n, [0.0] * n
        for i, down_nnz, up_nnz in zip(chosen, down, up, strict=True):
            received[i] = self.model_bytes(down_nnz, SERVER_ID, t, tier=self.tier_of(i))
            sent[i] = self.model_bytes(up_nnz, f"client-{i}", t, tier=self.tier_of(i)) + up_extra
            paper_mb[i] = PAPER_BYTES_PER_VALUE * sum(down_nnz.values()) / 1e6
        server_mb = sum(PAPER_BYTES_PER_VALUE * sum(nnz.values()) / 1e6 for nnz in up)
        return received, sent, paper_mb, (sum(sent), sum(received), server_mb)

    def training_flops(
        self, nnz: dict[str, int], samples: int, regrow: bool, dense: dict[str, int] | None = None
    ) -> float | None:
        """A client's training FLOPs of a round (``dense``: its model's element counts, a narrow model's under
        width tiers; the dense gradient of regrowth is that model's)."""
        return round_training_flops(
            self.positions,
            nnz,
            self.dense if dense is None else dense,
            epochs=self.params.epochs,
            samples=samples,
            regrow_batch=self.params.batch_size if regrow else 0,
        )

    # ----- what a round uses

    def neighbours(self, t: int) -> list[list[int]]:
        """Whom each client pulls in round ``t`` (the seeded topology a lock-step fleet uses too)."""
        config = self.config
        return round_neighbours(
            config.topology, config.clients, config.neighbour_count, config.seed, t, config.max_in_degree
        )

    def sync(self) -> None:
        """Wait for queued GPU work so energy and time land in the phase that caused them."""
        device = self.data[0].pool.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge the block's energy to phase ``name``, its GPU work included."""
        with self.accountant.phase(name):
            yield
            self.sync()

    def train_batches(self, i: int, epochs: int, generator: torch.Generator) -> Iterator[Batch]:
        """Client ``i``'s training batches (``ClientData.train_batches`` at the run's batch size); the thread
        policy looks at the machine's load between them."""
        for batch in self.data[i].train_batches(epochs, generator, self.params.batch_size):
            tick(self.governor)
            yield batch

    def hooks(self, i: int, **more: Any) -> RoundHooks:
        """Client ``i``'s :class:`RoundHooks`: its batches, its test accuracy, the run's energy phases."""
        data, eval_batch_size = self.data[i], self.config.eval_batch_size

        def batches(epochs: int, generator: torch.Generator) -> Iterator[Batch]:
            return self.train_batches(i, epochs, generator)

        if data.pool.device.type == "cuda":  # the CPU waits on the GPU meanwhile: draw the mask update's scores
            more.setdefault("ahead", run_ahead)
        if self.graphs is not None:
            more.setdefault("graphs", self.graphs())
        task = self.params.task
        return RoundHooks(batches, lambda model: score(model, data, eval_batch_size, task), self.phase, **more)

    @contextmanager
    def stopping_on_divergence(self, t: int) -> Iterator[None]:
        """A diverged client stops the run before round ``t`` is recorded (one line saying so)."""
        try:
            yield
        except TrainingDiverged as exc:
            raise TrainingDiverged(
                f"{exc}; the run stops before recording round {t + 1}, earlier rounds are kept; lower --lr"
            ) from exc

    def evaluate_and_train(self, t: int, i: int, client: ClientState) -> Evaluated:
        """Client ``i``'s accuracy as it is, its local training, and its accuracy after (dense baselines)."""
        with self.stopping_on_divergence(t):
            return evaluate_and_train(
                client, self.model, t, self.params, seed=self.config.seed, client=i, hooks=self.hooks(i)
            )

    def train_dense(self, t: int, clients: list[ClientState]) -> tuple[list[ClientState], RoundResult]:
        """Every client trained locally from ``clients`` (dense, no mask update): the new states and the
        per-client accuracies, losses and FLOPs of a round that moves no bytes (the caller fills those in)."""

        def one(i: int) -> tuple[ClientState, tuple[float, float, float, float | None]]:
            done = self.evaluate_and_train(t, i, clients[i])
            flops = self.training_flops(self.dense, self.data[i].num_train, False)
            return done.kept, (done.acc_before, done.acc_after, done.trained.stats.mean_loss, flops)

        with self.phase("train"):
            trained, outcomes = self.each_client(t, one)
        acc_before, acc_after = [o[0] for o in outcomes], [o[1] for o in outcomes]
        losses, flops = [o[2] for o in outcomes], [o[3] for o in outcomes]
        zeros = [0] * len(clients)
        return trained, RoundResult(acc_before, acc_after, losses, flops, zeros, list(zeros), [0.0] * len(clients))

    def each_client(self, t: int, one: Callable[[int], tuple[ClientState, T]]) -> tuple[list[ClientState], list[T]]:
        """``one(i)`` for each client this process trains, then every client's new state and result in client
        order (gathered from the other processes under torchrun; ``one``'s own results in one process)."""
        states: dict[int, ClientState] = {}
        outcomes: dict[int, T] = {}
        n = self.config.clients
        for i in self.client_bar(t, n, self.shard.clients(n)):
            states[i], outcomes[i] = one(i)
        return self.shard.gather_states(states, self.densities), self.shard.gather_objects(outcomes, n)

    def client_bar(self, t: int, n: int, items: Sequence[int] | None = None) -> Iterator[int]:
        """The round's clients, with a bar on a terminal, else reported to ``on_client`` as each one is done."""
        show = self.config.progress and stderr_is_tty() and self.shard.writer
        chosen = items if items is not None else range(n)
        if not show and self.on_client is not None and self.shard.writer:
            for done, i in enumerate(chosen):
                yield i
                self.on_client(t, done + 1, len(chosen))
            return
        yield from tqdm(chosen, desc=f"round {t + 1}", leave=False, disable=not show, unit="client")


class _AheadWorker:
    """One daemon thread for the jobs a simulation runs ahead, in order.

    One long-lived thread, not one per job (a hundred clients a round): no thread start per client, and one
    thread's allocations instead of a new thread's each time.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], T]) -> Callable[[], T]:
        """Queue ``job``; the returned call waits for its result (or raises its error)."""
        done: Future[T] = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="edge-node-ahead", daemon=True)
                self._thread.start()
        self._jobs.put((job, done))
        return done.result

    def _run(self) -> None:
        while True:
            job, done = self._jobs.get()
            try:
                done.set_result(job())
            except BaseException as exc:  # handed to the waiter, raised there
                done.set_exception(exc)


run_ahead = _AheadWorker().submit
