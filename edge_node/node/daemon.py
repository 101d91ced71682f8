"""The device daemon: one DisPFL client per device, ``startup()`` -> ``main_loop()`` -> ``shutdown()``.

Each round (no global barrier: every node keeps its own round counter)::

    communicate  pick up to k live peers at random (skipping peers in backoff, ``node/peers.py``), pull
                 their latest snapshots in parallel with deadlines, drop stale ones (more than
                 ``staleness`` rounds behind)
    the round    DisPFL's client round, the one the simulation runs (``algorithm.dispfl.client_round``):
                 screen the snapshots (``edge_node.algorithm.robust``), aggregate, accuracy before,
                 train, accuracy after, update the mask; heartbeat, stop checks and energy phases
                 reach it as callbacks
    then         append the round's record to rounds.jsonl, checkpoint atomically, publish the
                 snapshot (served to peers, advertised over mDNS), write status.json, hand the model over
                 (``node/handover.py``: STATE_DIR/handover/ and model.onnx)

A node that finds nobody trains locally and keeps looking. A node whose peers are ahead continues at
the upper median of its own and its accepted snapshots' rounds (``catch_up``), so late joiners are not
refused as stale for ever while one peer claiming round 10^15 moves nobody (it would need as many
models agreeing as there are others). A diverged round is never published: the
state stays at the last checkpoint, and three divergences in a row end the daemon (exit 5). With
``lockstep`` the fleet runs the synchronous algorithm of docs/ALGORITHM.md (``node/lockstep.py``): a node starts
round t once every node has published round t, and pulls exactly round t's snapshots of the simulation's
seeded neighbours.

Stopping (as uvicorn does): the first SIGTERM/SIGINT sets ``should_exit``, which every wait, pull,
Hello, training and evaluation batch and probe step checks; inside compute-only sections (data loading,
the capacity probe, aggregation, training, evaluation), where one step of a large model on one core can
outlast the 5 s promise, the signal handler raises :class:`Stopped` at once instead. The round in
progress is dropped (the checkpoint holds the last completed one), mDNS says goodbye, the server stops
and the state dir lock is released. A second signal sets ``force_exit``: in-flight transfers get no
grace, but the goodbye and the lock release still happen (nothing is cut short by an exception).

Start-up reads and checks everything (config, TLS, port, interfaces, energy meter, data, checkpoint,
capacity) before it creates anything: the state dir and its lock come after, so bad input (exit 2)
leaves nothing behind.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from edge_node.algorithm import read_weights
from edge_node.algorithm.dispfl import ClientRound, DisPFLParams, RoundHooks, client_round, published, retier, start
from edge_node.algorithm.norm_stats import batch_normalised, has_running_stats
from edge_node.algorithm.poison import Poisoning, StaleModels, flipped_labels, poisoned
from edge_node.algorithm.robust_aggregation import refusal_kind
from edge_node.algorithm.tasks import score
from edge_node.algorithm.training import Batch
from edge_node.energy import EnergyAccountant, open_meter
from edge_node.errors import ConfigError, ListenError, TlsError, TrainingDiverged
from edge_node.net import PeerAddress, PeerServer, TlsConfig, create_server, pull_models
from edge_node.net.client import list_peers
from edge_node.net.discovery import Discovery, MdnsDiscovery, StaticDiscovery, parse_peers, resolve_interfaces
from edge_node.net.discovery.exchange import HELLO_TIMEOUT_S as EXCHANGE_TIMEOUT_S
from edge_node.net.discovery.exchange import PeerExchange, exchange_policy
from edge_node.net.server import ModelSnapshot, check_fd_limit
from edge_node.node import capacity
from edge_node.node.barrier import wait_for_round
from edge_node.node.capacity_watch import CapacityWatch, TierMove
from edge_node.node.config import NodeConfig
from edge_node.node.data_refresh import DataRefresh, open_local_data
from edge_node.node.handover import node_handover
from edge_node.node.local_data import LocalData
from edge_node.node.local_model import node_model
from edge_node.node.lockstep import Lockstep
from edge_node.node.memory import release_free_memory
from edge_node.node.metrics import start_metrics
from edge_node.node.notify import Watchdog, sd_notify, watchdog_interval_s
from edge_node.node.parallel import Stopped
from edge_node.node.peers import Caller, PeerFinder, PeerTracker
from edge_node.node.privacy import PrivacyBudget
from edge_node.node.state import (
    CHECKPOINT_FILE,
    Checkpoint,
    Identity,
    StateDirLock,
    load_checkpoint,
    save_checkpoint,
    save_node_config,
)
from edge_node.node.status import StatusServer, round_label, rounds_done_text, write_status_file
from edge_node.node.width_tiers import node_tiers
from edge_node.protocol import TIER_DENSITIES, parse_tier
from edge_node.records import ROUNDS_LOG, node_entry, task_fields
from edge_node.seeding import Stream, numpy_generator, torch_generator
from edge_node.storage import append_line, truncate_jsonl
from edge_node.task_names import format_metric
from edge_node.torch_threads import ThreadGovernor, tick
from edge_node.version import __version__
from edge_node.wire import DecodedModel, ValueType, compile_decoder
from edge_node.wire.messages import PeerEntry

_LOGGER = logging.getLogger(__name__)

ENERGY_LOG = "energy.jsonl"
MAX_DIVERGED_IN_A_ROW = 3
SERVER_GRACE_S = 1.0  # in-flight transfers get this long at shutdown
IDLE_WITHOUT_PEERS_S = 1.0  # a node that found nobody pauses this long before its next (local) round
GONE_AFTER_S = 10.0  # a finished node stops waiting for a peer that has answered no Hello for this long

__all__ = ["Node", "Stopped", "catch_up", "check_listen_free"]


@dataclass
class _Totals:
    bytes_in: int = 0
    bytes_out: int = 0  # served bytes as counted at the end of the last round
    streams_served: int = 0
    rounds_run: int = 0
    acc_before: float | None = None
    acc_after: float | None = None
    energy_j: float = 0.0
    energy_label: str = ""
    diverged_in_a_row: int = 0


class Node:
    """One device's daemon. Construct with a checked :class:`NodeConfig`; ``run()`` until done or stopped."""

    def __init__(self, config: NodeConfig, *, poisoning: Poisoning | None = None) -> None:
        self.config = config
        # A loopback fleet's attack settings (edge_node.cli._attacker; never a node setting): every record names
        # the attackers; an attacker transforms what it publishes (or, label-flip, trains on flipped labels).
        self.poisoning = poisoning
        self.should_exit = threading.Event()
        self.force_exit = threading.Event()
        self.node_id = config.resolved_node_id
        self.client_index = config.resolved_client_index
        self.params: DisPFLParams = config.dispfl_params()
        self.budget: PrivacyBudget | None = None  # set once the local data is known (privacy dp-sgd)
        self.governor: ThreadGovernor | None = None  # the thread policy (set at start-up; None: fixed threads)
        self.phase = "starting"
        self.rounds_done = 0
        self.port: int | None = None
        self._heartbeat = time.monotonic()
        self._started_unix = time.time()
        self._totals = _Totals()
        self._lock = StateDirLock(config.state_dir)
        self._closers: list[Any] = []  # started services, stopped in reverse order
        self._interruptible = False  # inside a compute-only section: a signal raises Stopped there
        self.data_refresh: DataRefresh | None = None  # data_refresh round: re-reads the data before each later round
        self._rounds_begun = 0  # rounds this run has begun: the first trains on the data read at start
        self.capacity_watch: CapacityWatch | None = None  # capacity auto: re-decides the tier as the free CPU changes
        self._tier_move: TierMove | None = None  # decided after the last round, applied at the next one's start
        self._tier_moves = {"down": 0, "up": 0}
        self.tracker = PeerTracker(numpy_generator(config.seed, Stream.PEERS, self.client_index, 2**31 - 1))
        self.attack = poisoning.of(self.node_id) if poisoning is not None else None
        self._stale = StaleModels(self.attack.rounds_back) if self.attack and self.attack.kind == "stale" else None

    # -- signals ------------------------------------------------------------------------------------
    def handle_exit(self) -> bool:
        """First call: stop at the next check; second: also give in-flight transfers no grace at shutdown.

        Returns whether the main thread is in a compute-only section now, where the caller (the main
        thread's signal handler) should raise :class:`Stopped` instead of waiting for the next check.
        """
        if self.should_exit.is_set():
            self.force_exit.set()
            return False
        self.should_exit.set()
        return self._interruptible

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A compute-only section (no files written, nothing half-sent): a stop signal may raise here."""
        self._check_stop()
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False
        self._check_stop()

    def beat(self) -> None:
        """The main loop is alive (the systemd watchdog pings only while this is recent)."""
        self._heartbeat = time.monotonic()

    def _tick(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        """``batches``, beating the heartbeat and checking for a stop before each; the thread policy looks at the
        machine's load between them."""
        for batch in batches:
            self._check_stop()
            self.beat()
            tick(self.governor)
            yield batch

    # -- life ---------------------------------------------------------------------------------------
    def run(self) -> None:
        """Start, run rounds until ``rounds`` are done or a signal arrives, then shut down cleanly."""
        try:
            self.startup()
            self.main_loop()
        except Stopped:
            _LOGGER.info("stopped during start-up")
        finally:
            self.shutdown()

    def startup(self) -> None:
        """Everything that can fail on bad input happens here, before the node serves or trains.

        Nothing is created until every check passed (the state dir and its lock come last); a stop
        signal ends it within a step (:class:`Stopped`).
        """
        config = self.config
        config.check_runnable()
        self.device, self.governor = capacity.runtime_device(config)
        self.tls = self._load_tls()
        check_listen_free(config.listen)  # fail fast, before the data is loaded
        check_fd_limit(config.server_limits())  # raises the soft fd limit; ConfigError if it cannot fit
        self.metrics = start_metrics(config, self.status)  # binds metrics_listen now: a refused start writes nothing
        self._closers.append(self.metrics.close)
        self.caller = Caller(self.node_id, config.fleet, self.tls, config.insecure)
        self.lockstep = None
        if config.lockstep:  # ConfigError when the peers list does not name this node at its client index
            self.lockstep = Lockstep(
                self.caller, list(config.peers), client_index=self.client_index, seed=config.seed,
                neighbours=config.neighbours, round_budget_s=config.round_budget_s, stop=self.should_exit,
                beat=self.beat,
            )  # fmt: skip
        if config.discovery in ("mdns", "both"):
            resolve_interfaces(list(config.interfaces) or None)  # ConfigError naming a bad interface, now
        self.status_server = StatusServer(config.state_dir, self.status)  # checks the socket path's length
        with self.interruptible():
            self.local: LocalData
            self.local, self.data_refresh = open_local_data(config, self.client_index, self.device)
        release_free_memory()  # the whole data set it was sliced from, decoded
        compile_decoder()  # about half a second of numba now, not in the first round's pulls
        if config.privacy == "dp-sgd":
            assert config.epsilon is not None  # NodeConfig refused dp-sgd without one
            self.budget = PrivacyBudget.calibrate(
                config.epsilon, config.delta, config.dp_clip, self.params, self.local.data.num_train
            )
            self.params = self.budget.params(self.params)
        model, self.spec = node_model(config, self.local, check_export="start" if config.export_onnx else "warn")
        if config.privacy == "dp-sgd" and batch_normalised(model):
            raise ConfigError(f"privacy dp-sgd cannot train model {config.model}: DP-SGD's per-sample gradients are "
                              "undefined for BatchNorm layers; use GroupNorm or LayerNorm")  # fmt: skip
        if config.norm_stats == "average":  # the running statistics travel (protocol 1.3) and are averaged
            if not has_running_stats(model):
                raise ConfigError(f"norm_stats average: model {config.model} has no running statistics (BatchNorm "
                                  "buffers) to average; use norm_stats local (the default)")  # fmt: skip
            self.spec = self.spec.with_buffers(dict(model.named_buffers()))
        self.params = self.params.fitted(model)  # a BatchNorm model trains whole batches
        self.tiers = node_tiers(config.tier_mode, config.model, model, self.local.num_classes,
                                self.local.data.pool.input_shape, config.density)  # fmt: skip
        if self.tiers is not None:  # width tiers (protocol 1.5): streams carry each tier's narrow shapes
            self.spec = self.spec.with_tiers(self.tiers.mode, self.tiers.shapes)
        self.model = model.to(self.device)
        self.handover = node_handover(config, model, self.spec.arch_id, self.local, self.params.task,
                                      self.metrics.export_failed, self.metrics.handover_outcome)  # fmt: skip
        init_weights = read_weights(self.model)
        identity = Identity(self.node_id, config.fleet, self.spec.arch_id, config.seed, self.client_index,
                            config.tier_mode)  # fmt: skip
        self.checkpoint_path = config.state_dir / CHECKPOINT_FILE
        saved = load_checkpoint(self.checkpoint_path, identity, self.device)
        self.capacity = self._decide_capacity(saved)
        self.resumed = saved is not None
        self.tier = self.capacity.tier
        self.trained_model = self.model if self.tiers is None else self.tiers.model(self.tier, self.model)
        if saved is not None:
            self.state, self.rounds_done = saved.state, saved.rounds_done
        else:
            self.state = start(
                init_weights, self._mask_density(self.capacity.density), seed=config.seed, client=self.client_index,
                mask_init=config.mask_init, frozen=self.params.frozen, within=self._within(self.tier),
            )  # fmt: skip
        self.identity = identity
        if config.fixed_density is None and config.capacity_recheck_rounds:
            self.capacity_watch = CapacityWatch(self.tier, self._remeasure, sustain=config.capacity_recheck_rounds)
        try:
            meter = open_meter(config.energy_backend)  # after the data: its "no meter" warning is no error's noise
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self._closers.append(meter.close)  # replaced by the accountant's close once it owns the meter
        self._check_stop()
        # Every check passed: from here on the node writes (state dir, lock, logs) and serves.
        self._lock.acquire()
        self._closers.append(self._lock.release)
        save_node_config(config.state_dir, replace(config, node_id=self.node_id))  # for export, report
        rounds_log = config.state_dir / ROUNDS_LOG
        energy_log = config.state_dir / ENERGY_LOG
        truncate_jsonl(rounds_log, self.rounds_done)  # rounds the checkpoint does not hold are run again
        truncate_jsonl(energy_log, self.rounds_done)
        self.rounds_log = rounds_log
        self._closers.remove(meter.close)
        self.accountant = EnergyAccountant(meter, energy_log)  # owns the meter from here (closed with it)
        self._closers.insert(0, self.accountant.close)
        self._start_server()
        self.discoveries = self._start_discovery()
        self.peers = PeerFinder(self.caller, self.discoveries, self.tracker, self.should_exit)
        self.status_server.start()
        self._closers.append(self.status_server.stop)
        interval = watchdog_interval_s()
        if interval is not None:
            max_age = max(config.pull_timeout_s, config.round_budget_s if config.lockstep else 0) + 60
            watchdog = Watchdog(interval, lambda: self._heartbeat, max_age)
            watchdog.start()
            self._closers.append(watchdog.stop)
        self._check_stop()
        self.phase = "idle"
        sd_notify(f"READY=1\nSTATUS=serving on port {self.port}, {rounds_done_text(self.rounds_done)}")
        _LOGGER.info("%s", self.describe())

    def describe(self) -> str:
        """One line saying who this node is and how it runs (logged once it serves)."""
        return (
            f"node {self.node_id} of fleet {self.config.fleet}: {self.spec.arch_id}, tier {self.tier} "
            f"({self.capacity.decided_by}){self._tier_buys()}, serving on port {self.port} "
            f"({'mutual TLS' if self.tls else 'INSECURE plaintext'}), {self.local.description}, "
            f"{rounds_done_text(self.rounds_done)}" + (f", resumed from {self.checkpoint_path}" if self.resumed else "")
        )

    def main_loop(self) -> None:
        while not self.should_exit.is_set():
            if self.config.rounds and self.rounds_done >= self.config.rounds:
                self._serve_until_peers_finish()
                _LOGGER.info("%s, stopping", rounds_done_text(self.rounds_done))
                break
            if self.budget is not None and not self.budget.allows(self.rounds_done):
                self._budget_spent()
                break
            try:
                self.run_round(self.rounds_done)
            except Stopped:
                _LOGGER.info("stopping: %s abandoned, the checkpoint holds %s", round_label(self.rounds_done),
                             rounds_done_text(self.rounds_done))  # fmt: skip
                break

    def _serve_until_peers_finish(self) -> None:
        """Keep serving until every peer has published this node's last round, or has left.

        A slower peer's last rounds pull this node's last model; a node that exits at once leaves it
        waiting out its deadline for a model that is gone (lock-step: a 3-node fleet hung 300 s in CI;
        free-running under 10 % loss: a node whose two peers had both finished got no model in its last
        round, and in CI none in either). At most ``round_budget_s``. Lock-step: every node of the fleet
        list, a peer that no longer answers has passed this same barrier (or died). Free-running: the peers
        discovery lists now, but not one whose model the node refused (``PeerFinder.awaited``); one that
        has answered no Hello for ``GONE_AFTER_S`` (killed without a goodbye) counts as gone.
        """
        if self.lockstep is not None:
            with suppress(Stopped):
                self.lockstep.wait_for(self.rounds_done, gone_is_done=True)
            return
        started = time.monotonic()
        sd_notify(f"STATUS={rounds_done_text(self.rounds_done)}, serving until the peers have published it")
        try:
            behind = wait_for_round(
                self.caller, self.peers.awaited, self.rounds_done, budget_s=self.config.round_budget_s,
                stop=self.should_exit, beat=self.beat, gone_after_s=GONE_AFTER_S,
            )  # fmt: skip
        except Stopped:
            return
        waited = time.monotonic() - started
        if behind:
            _LOGGER.warning("peers %s have not reached round %d after %.0f s (--round-budget-s); not waiting longer",
                            behind, self.rounds_done, waited)  # fmt: skip
        elif waited >= 1.0:
            _LOGGER.info("served %.1f s more, until every peer had published round %d or left", waited,
                         self.rounds_done)  # fmt: skip

    def _budget_spent(self) -> None:
        """Stop training and publishing for good; keep serving the last (private) model until stopped."""
        assert self.budget is not None
        self.phase = "budget-spent"
        _LOGGER.warning(
            "privacy budget spent: epsilon %.3f of %g at delta %g after %s; one more round would exceed it. No new"
            " model will be published; the last one stays served until the node is stopped",
            self.budget.spent(self.rounds_done), self.budget.epsilon, self.budget.delta,
            rounds_done_text(self.rounds_done),
        )  # fmt: skip
        sd_notify(f"STATUS=privacy budget spent, serving the model of {rounds_done_text(self.rounds_done)}")
        write_status_file(self.config.state_dir, self.status())
        while not self.should_exit.wait(1.0):
            self.beat()

    def shutdown(self) -> None:
        """Goodbye on mDNS, stop serving (in-flight transfers get ``SERVER_GRACE_S``, none after a second
        signal), release the lock, close; idempotent, and never cut short by a signal (none raises here)."""
        if self.phase == "stopped":
            return
        self.phase = "stopping"
        started = time.monotonic()
        sd_notify("STOPPING=1")
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception:  # keep closing the rest: a half-stopped daemon is worse
                _LOGGER.exception("error while stopping %r", closer)
        self._closers.clear()
        self.phase = "stopped"
        _LOGGER.info("stopped in %.2f s", time.monotonic() - started)

    # -- start-up pieces ----------------------------------------------------------------------------
    def _load_tls(self) -> TlsConfig | None:
        config = self.config
        if not config.tls_enabled:
            return None
        assert config.tls_ca is not None and config.tls_cert is not None and config.tls_key is not None
        tls = TlsConfig.from_files(config.tls_ca, config.tls_cert, config.tls_key)
        if self.node_id not in tls.node_names:
            raise TlsError(
                f"certificate {config.tls_cert} is issued for {tls.node_names}, not this node's id {self.node_id!r}"
            )
        return tls

    def _mask_density(self, tier_density: float) -> float:
        """The density of the mask a node of tier ``tier_density`` draws: the tier's (mask), 1 inside its narrow
        model (width), or ``density`` inside it (both)."""
        return tier_density if self.tiers is None else self.tiers.inner_density

    def _within(self, tier: str) -> dict[str, tuple[int, ...]] | None:
        """Tier ``tier``'s prefixes under width tiers (None: mask tiers, or width 1)."""
        if self.tiers is None:
            return None
        within = self.tiers.within(tier)
        return None if within is None else dict(within)

    @property
    def density(self) -> float:
        """The density a stream and Hello carry, derived from the state: the target (mask tiers, as always), or
        under width tiers the fraction of the full model's weights the mask keeps (protocol 1.5: one meaning in
        every mode)."""
        return self.state.density if self.tiers is None else self.state.mask_density

    def _tier_buys(self) -> str:
        """What the tier buys, for the start-up line: nothing more to say under mask tiers."""
        if self.tiers is None:
            return ""
        return f", tier mode {self.tiers.mode}: {self.tiers.describe(self.tier)}"

    def _decide_capacity(self, saved: Checkpoint | None) -> capacity.CapacityDecision:
        """The tier: the checkpoint's (its mask fixes it: nothing is measured), configured, or measured."""
        fixed = self.config.fixed_density
        if saved is not None and self.tiers is not None:  # width tiers: the checkpoint names its tier
            kept = saved.tier
            if kept is None or kept not in self.tiers.table:
                raise ConfigError(f"the checkpoint in {self.config.state_dir} names no width tier ({kept!r}); move the "
                                  "state dir away to start over")  # fmt: skip
            density = TIER_DENSITIES[parse_tier(kept)]
            if fixed is not None and not math.isclose(density, fixed):
                raise ConfigError(
                    f"the checkpoint in {self.config.state_dir} trains tier {kept} but --capacity is {fixed:g}: its "
                    f"narrow model cannot change tier at start; pass --capacity {kept} or move the state dir away"
                )
            return capacity.kept_from_checkpoint(density, fixed)
        if saved is not None:
            if fixed is not None and not math.isclose(saved.state.density, fixed):
                raise ConfigError(
                    f"the checkpoint in {self.config.state_dir} trains at density {saved.state.density:g} but "
                    f"--capacity is {fixed:g}: its mask cannot change tier; pass --capacity {saved.state.density:g} "
                    "or move the state dir away to start over"
                )
            return capacity.kept_from_checkpoint(saved.state.density, fixed)
        if fixed is not None:
            return capacity.configured(fixed)
        _LOGGER.info("measuring this device's capacity (%s, a probe of about %.0f s)", self.spec.arch_id,
                     capacity.DEFAULT_PROBE_S)  # fmt: skip
        with self.interruptible():
            decision = capacity.measure(self.config, self.local, self.spec, self.device, check_stop=self._check_stop,
                                        widths=self.tiers.table if self.tiers is not None else None)  # fmt: skip
        measured = decision.measurements
        assert measured is not None
        _LOGGER.info(
            "capacity: %.1f samples/s training, %s available, %d CPUs, accelerator %s, link %s -> tier %s (%s);"
            " probe %.1f s",
            measured.train_samples_per_s, f"{measured.available_memory_bytes / 2**30:.1f} GiB", measured.cpu_count,
            measured.accelerator, measured.link_detail, decision.tier, decision.decided_by, measured.probe_total_s,
        )  # fmt: skip
        return decision

    def _remeasure(self, train_samples_per_s: float) -> capacity.CapacityDecision:
        """The rule's decision on this device as it is now, around a round's measured training throughput."""
        config = self.config
        widths = self.tiers.table if self.tiers is not None else None  # width tiers: scaled to each tier's step
        measured = capacity.from_round(train_samples_per_s, config.interfaces, self.device, self.capacity.measurements,
                                       tier=self.tier if widths is not None else None, widths=widths)  # fmt: skip
        return capacity.choose_tier(
            measured, self.spec, epochs=config.epochs, samples=self.local.data.num_train, neighbours=config.neighbours,
            round_budget_s=config.round_budget_s, value_type=ValueType.parse(config.value_type), source="remeasured",
            widths=widths, mask_density=self._mask_density(1.0),
        )  # fmt: skip

    def _move_tier(self, t: int) -> dict[str, Any] | None:
        """Apply the tier move decided after the last round (at this round boundary, before any pull: under
        lock-step the boundary the fleet shares); what the round's record says of it."""
        move, self._tier_move = self._tier_move, None
        if move is None:
            return None
        self.state = retier(
            self.state, self._mask_density(move.decision.density), t, seed=self.config.seed, client=self.client_index,
            mask_init=self.config.mask_init, frozen=self.params.frozen, within=self._within(move.after),
        )  # fmt: skip
        self.tier, self.capacity = move.after, move.decision
        if self.tiers is not None:  # width tiers: the new tier's narrow model trains from the next round
            self.trained_model = self.tiers.model(self.tier, self.model)
        self._tier_moves[move.direction] += 1
        _LOGGER.info("%s: tier %s -> %s (%s)", round_label(t), move.before, move.after, move.cause)
        return move.to_json()

    def _start_server(self) -> None:
        config = self.config
        self.server_state = PeerServer(
            self.spec, node_id=self.node_id, fleet_id=config.fleet, tier=self.tier,
            value_type=ValueType.parse(config.value_type),
        )  # fmt: skip
        server, port = create_server(
            config.listen, self.server_state, tls=self.tls, insecure=config.insecure, limits=config.server_limits()
        )
        server.start()
        self.port = port

        def stop_server() -> None:
            grace = 0.0 if self.force_exit.is_set() else SERVER_GRACE_S
            server.stop(grace).wait(grace + 1)

        self._closers.append(stop_server)
        self._publish()

    def _start_discovery(self) -> list[Discovery]:
        config = self.config
        found: list[Discovery] = []
        common: dict[str, Any] = dict(
            node_id=self.node_id, port=self.port, fleet=config.fleet, arch=self.spec.arch_id, tier=self.tier,
            density=self.density, round=self.rounds_done, fingerprint=self.tls.fingerprint if self.tls else None,
        )  # fmt: skip
        if config.discovery in ("static", "both"):
            found.append(StaticDiscovery(list(config.peers), require_node_ids=self.tls is not None, **common))
        if config.discovery in ("mdns", "both"):
            found.append(MdnsDiscovery(interfaces=list(config.interfaces) or None,
                                       allowed_subnets=list(config.allowed_subnets) or None, **common))  # fmt: skip
        if config.peer_exchange_s and self.lockstep is None:  # lock-step pulls its fixed list only
            found.append(self._peer_exchange(list(found)))
        for discovery in found:
            discovery.start()
            self._closers.append(discovery.stop)
        return found

    def _peer_exchange(self, sources: list[Discovery]) -> PeerExchange:
        """Peer exchange over the node's other discoveries; its server answers ListPeers from what it reached."""
        config = self.config
        seeds = [p.host for p in parse_peers(list(config.peers))] if config.discovery != "mdns" else []
        policy = exchange_policy(config.listen.rpartition(":")[0].strip("[]"), seeds, config.allowed_subnets)
        tls, insecure = self.tls, config.insecure

        def ask(address: PeerAddress) -> tuple[list[PeerEntry], int]:
            return list_peers(address, node_id=self.node_id, fleet_id=config.fleet, timeout_s=EXCHANGE_TIMEOUT_S,
                              tls=tls, insecure=insecure)  # fmt: skip

        exchange = PeerExchange(
            node_id=self.node_id, fleet=config.fleet, arch=self.spec.arch_id, sources=sources, hello=self.caller.hello,
            ask=ask, policy=policy, interval_s=config.peer_exchange_s, tls=tls is not None,
        )  # fmt: skip
        self.server_state.reached = exchange.reached_entries
        return exchange

    # -- one round ----------------------------------------------------------------------------------
    def run_round(self, t: int) -> None:
        """Run round ``t`` (= rounds done); on success the node has published snapshot ``t + 1``."""
        self.beat()
        if self.data_refresh is not None and self._rounds_begun:
            with self.interruptible():  # data_refresh round: what the folder (or factory) holds now
                self.local = self.data_refresh.refresh()
            self.beat()
        self._rounds_begun += 1
        tier_move = self._move_tier(t)
        if self.capacity_watch is not None:
            self.capacity_watch.round_began()
        self.phase = "communicate"
        with self.accountant.phase("communicate"):
            if self.lockstep is not None:
                self.lockstep.wait_for(t)
                chosen = self.lockstep.neighbours(t)
            else:
                chosen = self.peers.pick(self.config.neighbours, self._peer_rng(t))
            fresh, refused, bytes_in, retries = self._pull(chosen, t)
        self.beat()
        self._check_stop()
        received: dict[str, DecodedModel] = {}

        def screened(accepted: list[str], screen_refused: dict[str, str]) -> None:
            received.update((k, fresh[k]) for k in accepted)
            refused.update((k, (refusal_kind(reason), reason)) for k, reason in screen_refused.items())
            self.peers.record({k: m.header.round for k, m in received.items()}, refused)

        hooks = RoundHooks(self._tick_train, self._accuracy, self._round_phase, screened)
        offers = [(k, m.weights, m.masks) for k, m in fresh.items()]
        try:
            done: ClientRound = client_round(
                self.state, offers, self.trained_model, t, self.params, seed=self.config.seed, client=self.client_index,
                hooks=hooks, peer_buffers={k: m.buffers for k, m in fresh.items()},
            )  # fmt: skip
        except TrainingDiverged as diverged:
            self._diverged(t, diverged, chosen, received, refused, retries)  # writes: outside the interruptible section
            return
        new_state, trained, acc_before, acc_after = done.state, done.trained, done.acc_before, done.acc_after
        data = self.local.data
        self.beat()
        self._check_stop()
        energy = self.accountant.close_round(t)
        served_streams, served_bytes = self.server_state.served()
        bytes_out = served_bytes - self._totals.bytes_out
        next_round = catch_up(t, [m.header.round for m in received.values()], lockstep=self.config.lockstep)
        record = {  # the schema's DAEMON_KEYS (edge_node.records): this node's entry, the task, what a device knows
            "round": t,
            **node_entry(self.node_id, acc_before, acc_after, bytes_in, bytes_out, headline="after"),
            **task_fields(self.params.task),
            "time_unix": round(time.time(), 3),
            "tier": self.tier,
            "density": round(new_state.mask_density, 6),
            "lockstep": self.config.lockstep,
            "peers_asked": [p.node_id for p in chosen],
            "peers_answered": sorted(received),
            "peer_rounds": {k: m.header.round for k, m in sorted(received.items())},
            "peers_refused": _refused_json(refused),
            "refusals": _count_kinds(refused),
            "pull_retries": retries,
            "streams_served": served_streams - self._totals.streams_served,
            "server_refusals": self.server_state.refusals(),
            "discovery_refusals": self.discovery_refusals(),
            "train_loss": trained.stats.mean_loss,
            "samples": data.num_train,
            "test_samples": data.num_test,
            "samples_arrived": self.data_refresh.arrived if self.data_refresh is not None else 0,
            "data_refused": self.data_refresh.take_refused() if self.data_refresh is not None else {},
            "lr": trained.lr,
            "seconds": energy["seconds"],
            "joules": energy["joules"],
            "energy_total_j": energy["total_j"],
            "energy_label": energy["label"],
            "energy_source": energy["source"],
        }
        if self.poisoning is not None:  # a poisoned loopback fleet: who attacks, and how
            record.update(self.poisoning.to_json())
        if new_state.buffers:  # FedBN's "local" (the statistics stayed here) or "average" (with the peers')
            record["norm_stats"] = self.config.norm_stats
        if self.budget is not None:
            record.update(self.budget.to_json(next_round))
        if tier_move is not None:
            record["tier_move"] = tier_move
        if self.tiers is not None:  # width tiers: what the tier bought this round
            record["tier_mode"], record["width"] = self.tiers.mode, self.tiers.table[self.tier].width
        if next_round > t + 1:
            record["caught_up_from"], record["caught_up_to"] = t + 1, next_round
            _LOGGER.info("%s: peers are ahead; continuing at %s instead of %s", round_label(t), round_label(next_round),
                         round_label(t + 1))  # fmt: skip
        horizon = next_round + self.config.staleness  # a lead of a round or two is ordinary asynchrony
        ahead = {k: m.header.round for k, m in sorted(received.items()) if m.header.round > horizon}
        if ahead:
            record["ahead_not_followed"] = ahead  # far ahead of the median of the round's models: not followed
        append_line(self.rounds_log, json.dumps(record))
        self.metrics.observe_round(record)
        if self.capacity_watch is not None:  # applied at the next round's start
            self._tier_move = self.capacity_watch.round_ended(t, trained.stats.samples, energy["seconds"]["train"])
        self.beat()
        save_checkpoint(self.checkpoint_path, Checkpoint(self.identity, next_round, new_state, self._checkpoint_tier))
        self.state, self.rounds_done = new_state, next_round
        self.beat()
        self._publish()
        totals = self._totals
        totals.bytes_in += bytes_in
        totals.bytes_out, totals.streams_served = served_bytes, served_streams
        totals.rounds_run += 1
        totals.acc_before, totals.acc_after = acc_before, acc_after
        totals.energy_j += energy["total_j"]
        totals.energy_label = energy["label"]
        totals.diverged_in_a_row = 0
        self.phase = "idle"
        write_status_file(self.config.state_dir, self.status())
        if self.handover is not None:  # export_onnx: the model for the device's application (handover/, model.onnx)
            self.beat()  # a failed handover is one warning and a counted metric; training goes on
            self.handover.after_round(next_round, new_state.weights, new_state.buffers, data)
        release_free_memory()  # pulled models, the aggregate, the export
        self.beat()
        refused_text = f", refused {_count_kinds(refused)}" if refused else ""
        task = self.params.task
        _LOGGER.info(
            "%s: %d/%d peers answered%s, %s %s -> %s, in %.2f MB, out %.2f MB, %.1f s, %.3g J (%s)",
            round_label(t, self.config.rounds), len(received), len(chosen), refused_text, task.metric,
            format_metric(acc_before, fraction=task.metric_is_fraction),
            format_metric(acc_after, fraction=task.metric_is_fraction),
            bytes_in / 1e6, bytes_out / 1e6, energy["duration_s"], energy["total_j"], energy["label"],
        )  # fmt: skip
        if not chosen and not self.config.lockstep:
            self.should_exit.wait(IDLE_WITHOUT_PEERS_S)  # nobody found yet: trained locally, keep looking

    def _check_stop(self) -> None:
        if self.should_exit.is_set():
            raise Stopped

    @contextmanager
    def _round_phase(self, name: str) -> Iterator[None]:
        """A step of the client round: shown in status, charged to its energy phase, stoppable at once."""
        self.phase = name
        self.beat()
        with self.accountant.phase(name), self.interruptible():
            yield
        self.beat()

    def _peer_rng(self, t: int) -> np.random.Generator:
        """Round ``t``'s draw of peers (seeded per client and round)."""
        return numpy_generator(self.config.seed, Stream.PEERS, self.client_index, t)

    def _tick_train(self, epochs: int, generator: torch.Generator) -> Iterator[Batch]:
        """Training batches that beat the heartbeat and stop the round when the daemon is told to."""
        batches = self.local.data.train_batches(epochs, generator, self.params.batch_size)
        if self.attack is not None and self.attack.flips_labels:  # a loopback fleet's label-flip attacker
            batches = flipped_labels(batches, self.local.num_classes)
        return self._tick(batches)

    def _accuracy(self, model: torch.nn.Module) -> float:
        """``model``'s local test score (the round's model: under width tiers the narrow one), in slices of
        ``micro_batch`` (else the training batch): the round's memory peak is training's, not evaluation's (a
        batch of 1,000 made a cnn node's peak ~200 MB higher)."""
        batches = self.local.data.eval_batches(self.params.micro_batch or self.params.batch_size)
        value = score(model, self._tick(batches), self.params.task)
        release_free_memory()
        return value

    def _data_status(self) -> dict[str, Any]:
        """The local data's part of the status: samples now, the last re-read's new ones, refusals since start."""
        local = getattr(self, "local", None)
        refresh = self.data_refresh
        return {
            "data_refresh": self.config.data_refresh,
            "train_samples": local.data.num_train if local is not None else None,
            "test_samples": local.data.num_test if local is not None else None,
            "samples_arrived": refresh.arrived if refresh is not None else 0,
            "data_refused": refresh.refused_total if refresh is not None else {},
        }

    def discovery_refusals(self) -> dict[str, int]:
        """What discovery refused since start (other fleet, architecture, protocol, address, ...), by reason."""
        counts: dict[str, int] = {}
        for discovery in getattr(self, "discoveries", []):
            for reason, n in discovery.refusals().items():
                counts[reason] = counts.get(reason, 0) + n
        return dict(sorted(counts.items()))

    def _diverged(
        self, t: int, exc: TrainingDiverged, chosen: list[PeerAddress], received: dict[str, DecodedModel],
        refused: dict[str, tuple[str, str]], retries: dict[str, int],
    ) -> None:  # fmt: skip
        """Roll back (keep the checkpointed state), log, and give up after three in a row."""
        totals = self._totals
        totals.diverged_in_a_row += 1
        energy = self.accountant.close_round(t)
        append_line(
            self.rounds_log,
            json.dumps({
                "round": t, "node_id": self.node_id, "time_unix": round(time.time(), 3), "diverged": True,
                "reason": str(exc), "peers_asked": [p.node_id for p in chosen], "peers_answered": sorted(received),
                "peers_refused": _refused_json(refused), "refusals": _count_kinds(refused), "pull_retries": retries,
                "server_refusals": self.server_state.refusals(), "discovery_refusals": self.discovery_refusals(),
                "seconds": energy["seconds"], "joules": energy["joules"], "energy_label": energy["label"],
            }),
        )  # fmt: skip
        _LOGGER.error(
            "%s; rolled back to the checkpoint (%s), nothing published (%d of %d in a row)",
            exc, rounds_done_text(t), totals.diverged_in_a_row, MAX_DIVERGED_IN_A_ROW,
        )  # fmt: skip
        if totals.diverged_in_a_row >= MAX_DIVERGED_IN_A_ROW:
            raise TrainingDiverged(
                f"training diverged {MAX_DIVERGED_IN_A_ROW} rounds in a row (last: {exc}); lower --lr"
            ) from exc

    @property
    def _checkpoint_tier(self) -> str | None:
        """The tier a checkpoint names: under width tiers its state's narrow shapes depend on it."""
        return self.tier if self.tiers is not None else None

    def _publish(self) -> None:
        weights, mask = published(self.state, self.params.frozen)  # the spec's tensors: never the frozen ones
        if self.attack is not None:  # a loopback fleet's attacker: what it publishes instead (algorithm/poison.py)
            if self._stale is not None:
                weights, mask = self._stale.publish(weights, mask)
            generator = torch_generator(self.config.seed, Stream.ATTACK, self.client_index, self.rounds_done)
            weights = poisoned(self.attack, weights, mask, generator)
        self.server_state.publish(
            ModelSnapshot(
                weights=weights, masks=mask, round=self.rounds_done, density=self.density, node_id=self.node_id,
                fleet_id=self.config.fleet, arch_id=self.spec.arch_id, tier=self.tier,
                buffers=self.state.buffers if self.spec.buffers else {},  # norm_stats average: they travel
            )
        )  # fmt: skip
        for discovery in getattr(self, "discoveries", []):
            discovery.update(round=self.rounds_done, density=self.density, tier=self.tier)

    # -- peers --------------------------------------------------------------------------------------
    def _pull(
        self, chosen: list[PeerAddress], t: int
    ) -> tuple[dict[str, DecodedModel], dict[str, tuple[str, str]], int, dict[str, int]]:
        """Pull ``chosen`` in parallel; the round's screen comes after, in the client round.

        Returns the snapshots that arrived and are fresh, ``(kind, detail)`` for every peer refused (a
        failed pull or a stale snapshot), the bytes received (refused streams included), and the calls
        retried after a transient failure, by kind.
        """
        if not chosen:
            return {}, {}, 0, {}
        self.beat()
        lockstep = self.lockstep is not None
        result = pull_models(
            chosen, self.spec, self.config.fleet, node_id=self.node_id, round=t if lockstep else None,
            deadline_s=self.config.round_budget_s if lockstep else self.config.pull_timeout_s,
            tls=self.tls, insecure=self.config.insecure, cancel=self.should_exit,
        )  # fmt: skip
        self.beat()
        refused: dict[str, tuple[str, str]] = {k: (f.kind, f.detail) for k, f in result.failures.items()}
        bytes_in = sum(m.wire_bytes for m in result.received.values())
        bytes_in += sum(f.wire_bytes for f in result.failures.values())
        fresh: dict[str, DecodedModel] = {}
        for node_id, model in result.received.items():
            behind = t - model.header.round
            if behind > self.config.staleness:
                refused[node_id] = ("stale", f"snapshot of round {model.header.round} is {behind} rounds behind")
            else:
                fresh[node_id] = model
        return fresh, refused, bytes_in, result.retries

    # -- status -------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """What ``edge-node status`` shows (live from the socket, or from status.json)."""
        totals = self._totals
        discoveries = getattr(self, "discoveries", [])
        known = sorted({p.name for d in discoveries for p in d.peers() if p.name != self.node_id})
        age = time.monotonic() - self._heartbeat
        max_age = max(self.config.pull_timeout_s, self.config.round_budget_s) * 2
        return {
            "source": "live",
            "healthy": self.phase not in ("starting", "stopping", "stopped") and age < max_age,
            "node_id": self.node_id,
            "fleet": self.config.fleet,
            "version": __version__,
            "pid": os.getpid(),
            "state_dir": str(self.config.state_dir),
            "port": self.port,
            "tls": self.tls is not None,
            "model": getattr(self, "spec", None) and self.spec.arch_id,
            "tier": getattr(self, "tier", None),
            "density": getattr(self, "density", None),
            "capacity": self.capacity.to_json() if hasattr(self, "capacity") else None,
            "tier_moves": dict(self._tier_moves),
            "rounds_done": self.rounds_done,
            "rounds_planned": self.config.rounds or None,
            "phase": self.phase,
            "heartbeat_age_s": round(age, 1),
            "peers_known": known,
            "peer_exchange": next((d.to_json() for d in discoveries if isinstance(d, PeerExchange)), None),
            "peers": self.tracker.to_json(),
            "acc_before": totals.acc_before,
            "acc_after": totals.acc_after,
            **(task_fields(self.params.task) if hasattr(self, "params") else {}),
            "bytes_in_total": totals.bytes_in,
            "bytes_out_total": self.server_state.served()[1] if hasattr(self, "server_state") else 0,
            "server_refusals": self.server_state.refusals() if hasattr(self, "server_state") else {},
            "streams_unfinished_total": self.server_state.unfinished_streams() if hasattr(self, "server_state") else 0,
            "discovery_refusals": self.discovery_refusals(),
            "privacy": self.budget.to_json(self.rounds_done) if self.budget is not None else None,
            **self._data_status(),
            "rounds_this_run": totals.rounds_run,
            "energy_j_this_run": round(totals.energy_j, 3),
            "energy_label": totals.energy_label,
            "started_unix": round(self._started_unix, 3),
            "uptime_s": round(time.time() - self._started_unix, 1),
        }


def catch_up(t: int, peer_rounds: list[int], *, lockstep: bool) -> int:
    """The round after round ``t``: ``t + 1``, or the upper median of the round's models when that is ahead.

    Asynchronous nodes run at their own pace, so a node that joined late (or was off) would stay many
    rounds behind for ever, and its snapshots would be refused as stale by the others. It therefore
    continues at the upper median of ``{t + 1}`` (its own next snapshot) and ``peer_rounds`` (the
    header rounds of the snapshots it aggregated), never lower than ``t + 1``: a late joiner among
    peers that are ahead takes their round, while peers can move the counter (and with it the
    learning-rate and prune schedules) only when at least half of the round's models, its own
    included, are that far ahead. One peer claiming round 10^15 next to honest ones moves nothing; a
    lone peer that is the only one answering still can (then it is half of the two models). Lockstep
    rounds never jump (every node runs every round).
    """
    if lockstep or not peer_rounds:
        return t + 1
    rounds = sorted([t + 1, *peer_rounds])
    return max(t + 1, rounds[len(rounds) // 2])


def check_listen_free(listen: str) -> None:
    """Raise ListenError (one line, exit 3) when ``HOST:PORT`` cannot be bound, before anything is started.

    The probe binds as gRPC's listener does, with SO_REUSEADDR: a node restarted right after a kill
    finds its old connections still draining (FIN-WAIT, TIME-WAIT) on its port, which gRPC can bind
    over but a plain bind cannot. Another process listening there is still refused.
    """
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, int(port)))
    except OSError as exc:
        raise ListenError(f"cannot listen on {listen!r}: {exc.strerror or exc}") from None


def _refused_json(refused: dict[str, tuple[str, str]]) -> dict[str, dict[str, str]]:
    return {k: {"kind": kind, "detail": detail} for k, (kind, detail) in sorted(refused.items())}


def _count_kinds(refused: dict[str, tuple[str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for kind, _ in refused.values():
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))
