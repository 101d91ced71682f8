"""Run a loopback fleet to its end: start, watch, stop, summarise (what ``edge-node loopback`` does).

The fleet ends when every node has recorded its rounds and exited 0; when a node exits otherwise (the
others are then stopped: a lock-step fleet would wait for it for ever, and a partial fleet is not the
run that was asked for); or when ``stop`` is set (Ctrl-C / SIGTERM). The summary is written in every
case, with the outcome named, from what the nodes recorded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from edge_node.exit_codes import ExitCode
from edge_node.fleet.config import FleetConfig
from edge_node.fleet.daemons import DaemonProcess, exit_description
from edge_node.fleet.fleet import METRICS_TARGETS, Event, Fleet
from edge_node.fleet.progress import NodeView
from edge_node.fleet.summary import summarize, write_summary
from edge_node.records import node_means
from edge_node.task_names import format_metric

_LOGGER = logging.getLogger(__name__)

POLL_S = 0.5
STATUS_EVERY_S = 1.0
STATUS_TIMEOUT_S = 0.5  # one status query (the socket's timeout)
STATUS_WAIT_S = 0.5  # the most one poll waits for all of them together
STATUS_WORKERS = 16  # queries at once (a fleet has at most 64 nodes)
# A daemon's own exit codes that mean the same for the fleet; any other (a signal, 1) is an internal error.
PASSED_ON = {int(c) for c in (ExitCode.BAD_INPUT, ExitCode.NETWORK, ExitCode.STORAGE, ExitCode.DIVERGED)}


class Display(Protocol):
    def event(self, line: str) -> None: ...

    def record(self, node: NodeView, record: dict[str, Any]) -> None: ...

    def refresh(self, nodes: list[NodeView], title: str) -> None: ...


@dataclass
class Outcome:
    """How the fleet ended, and what it wrote."""

    code: int
    reason: str
    summary: dict[str, Any]
    files: list[Path] = field(default_factory=list)
    failed_node: str | None = None
    log_tail: str = ""
    warnings: list[str] = field(default_factory=list)


def _phase(state_dir: Path) -> str | None:
    from edge_node.node.status import query

    status = query(state_dir, timeout_s=STATUS_TIMEOUT_S)
    return str(status.get("phase")) if status else None


class PhaseWatcher:
    """Each running daemon's phase from its status socket, asked in threads.

    Asked one after the other, N nodes that are slow to answer would hold a poll (and the answer to
    Ctrl-C) for N times the socket's timeout; here a poll waits at most ``wait_s`` for all of them, a
    query still running is collected by a later poll, and a node is not asked again while it runs.
    """

    def __init__(self, wait_s: float = STATUS_WAIT_S, workers: int = STATUS_WORKERS) -> None:
        self.wait_s = wait_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edge-node-status")
        self._pending: dict[str, Future[str | None]] = {}

    def update(self, daemons: Iterable[DaemonProcess], views: dict[str, NodeView]) -> None:
        """Ask every running daemon that has no query in flight; apply the answers that came within ``wait_s``."""
        running = {d.node_id: d for d in daemons if d.running}
        for node_id, daemon in running.items():
            if node_id not in self._pending:
                self._pending[node_id] = self._pool.submit(_phase, daemon.state_dir)
        wait(list(self._pending.values()), timeout=self.wait_s)
        for node_id, future in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[node_id]
            phase = future.result()
            asked = running.get(node_id)
            if phase and asked is not None and asked.running:  # an exited node keeps "stopped"
                views[node_id].phase = phase

    def close(self, wait: bool = False) -> None:
        """Stop; by default without waiting for queries in flight (each ends within the socket's timeout)."""
        self._pool.shutdown(wait=wait, cancel_futures=True)


def run_fleet(config: FleetConfig, display: Display, stop: threading.Event, *, fresh: bool = False,
              poisoned_launcher: Sequence[str] = ()) -> Outcome:  # fmt: skip
    """Run the fleet of ``config`` until it is done, fails or ``stop`` is set; always cleans up (``poisoned_launcher``:
    see :class:`Fleet`)."""
    started = time.monotonic()
    with Fleet(config, fresh=fresh, poisoned_launcher=poisoned_launcher) as fleet:
        warnings = fleet.link_warnings()
        for line in warnings:
            display.event(f"edge-node: warning: {line}")
        where = "network namespaces (mDNS)" if config.netns else "127.0.0.1 (static peers)"
        display.event(
            f"loopback fleet: {config.nodes} nodes of {config.model} on {config.dataset} ({config.partition}), "
            f"{config.rounds or 'unbounded'} rounds{', lock-step' if config.lockstep else ''}"
            f"{', mutual TLS' if config.tls else ''}, on {where} -> {config.output.resolve()}"
            + (" (resumed)" if fleet.resumed else "")
        )
        views = {d.node_id: NodeView(d.node_id, config.rounds) for d in fleet.own_daemons()}
        fleet.start()
        for daemon in fleet.own_daemons():
            views[daemon.node_id].state = "running"
            display.event(f"{daemon.node_id}: started, pid {daemon.pid}, log {daemon.log_path}")
        if fleet.metrics_endpoints:
            display.event(f"metrics: {', '.join(fleet.metrics_endpoints)} (Prometheus targets in {METRICS_TARGETS})")
        outcome: tuple[int, str, str | None] | None = None
        announced = 0
        last_status = 0.0
        phases = PhaseWatcher()
        try:
            while outcome is None:
                events = fleet.poll()
                outcome = _handle(events, views, fleet, display)
                announced = _fleet_round_lines(views, fleet, announced, display)
                now = time.monotonic()
                if outcome is None and now - last_status >= STATUS_EVERY_S:
                    last_status = now
                    phases.update(fleet.own_daemons(), views)
                display.refresh(list(views.values()), f"loopback fleet {config.fleet}")
                if outcome is None and fleet.finished():
                    outcome = (int(ExitCode.SUCCESS), "done", None)
                if outcome is None and stop.wait(POLL_S):
                    outcome = (int(ExitCode.INTERRUPTED), "interrupted", None)
        finally:
            phases.close()
        code, reason, failed = outcome
        display.event(f"stopping the fleet ({reason})" if reason != "done" else "every node finished its rounds")
        fleet.stop()
        _handle(fleet.poll(), views, fleet, display, final=True)
        per_node = {d.node_id: d.records for d in fleet.own_daemons()}
        exits = {d.node_id: d.returncode for d in fleet.own_daemons()}
        starts = {d.node_id: d.starts for d in fleet.own_daemons()}
        info = {
            **config.to_json(),
            "link": fleet.link_report.to_json(),
            "wall_s": round(time.monotonic() - started, 1),
            "outcome": reason,
            "exit_code": code,
            "resumed": fleet.resumed,
        }
        devices = device_summaries(fleet) if fleet.profiles else None
        summary = summarize(info, per_node, exits, starts, devices)
        files = write_summary(config.output, summary, per_node)
        tail = ""
        if failed is not None:
            tail = next(d.log_tail() for d in fleet.own_daemons() if d.node_id == failed)
        return Outcome(code, reason, summary, files, failed, tail, warnings)


def device_summaries(fleet: Fleet) -> dict[str, dict[str, Any]]:
    """Per node: its profile and link, and the tier it chose with what decided (its last ``status.json``)."""
    from edge_node.node.status import read_status_file

    out = fleet.device_info()
    for daemon in fleet.own_daemons():
        status = read_status_file(daemon.state_dir) or {}
        decision = status.get("capacity") if isinstance(status.get("capacity"), dict) else None
        out[daemon.node_id]["capacity"] = capacity_brief(decision)
    return out


def capacity_brief(decision: dict[str, Any] | None) -> dict[str, Any] | None:
    """The parts of a node's capacity decision the summary shows (None when the node recorded none)."""
    if not decision:
        return None
    measured = decision.get("measurements") or {}
    return {
        "tier": decision.get("tier"),
        "density": decision.get("density"),
        "source": decision.get("source"),
        "decided_by": decision.get("decided_by"),
        "train_samples_per_s": measured.get("train_samples_per_s"),
        "cpu_count": measured.get("cpu_count"),
        "cpu_limit": measured.get("cpu_limit"),
        "available_memory_bytes": measured.get("available_memory_bytes"),
        "memory_limit_bytes": measured.get("memory_limit_bytes"),
        "link_mbit_s": measured.get("link_mbit_s"),
    }


def _handle(
    events: list[Event], views: dict[str, NodeView], fleet: Fleet, display: Display, *, final: bool = False
) -> tuple[int, str, str | None] | None:
    """Show events; the fleet's outcome when a node exited with an error (None otherwise)."""
    outcome = None
    for event in events:
        view = views.get(event.node_id)
        if view is None:
            continue
        if event.kind == "record" and event.record is not None:
            view.add_record(event.record)
            display.record(view, event.record)
        elif event.kind == "exit":
            code = event.code if event.code is not None else 1
            if code == 0:
                view.state, view.phase = "done", "stopped"
                if not final:
                    display.event(f"{event.node_id}: finished ({view.rounds_done} rounds)")
                continue
            view.state, view.phase = exit_description(code, short=True), "stopped"
            if not final:
                why = exit_description(code) + fleet.oom_note(event.node_id)
                display.event(f"{event.node_id}: {why}; stopping the fleet")
                if outcome is None:
                    fleet_code = code if code in PASSED_ON else int(ExitCode.UNEXPECTED)
                    outcome = (fleet_code, f"{event.node_id} {why}", event.node_id)
    return outcome


def _fleet_round_lines(views: dict[str, NodeView], fleet: Fleet, announced: int, display: Display) -> int:
    """A line per round every node has completed: the fleet's mean accuracy before and after local training."""
    done = min(v.rounds_done for v in views.values())
    while announced < done:
        t = announced
        rs = [r for d in fleet.own_daemons() for r in d.completed if r.get("round") == t]
        if rs:
            means = node_means(rs)  # = the fleet summary's per round
            before, after = means["acc_before_mean"], means["acc_after_mean"]
            total = f"/{fleet.config.rounds}" if fleet.config.rounds else ""
            metric = str(rs[0].get("metric") or "accuracy")
            fraction = bool(rs[0].get("metric_is_fraction", True))
            display.event(
                f"fleet round {t + 1}{total}: mean {metric} {format_metric(after, fraction=fraction)} after local "
                f"training ({format_metric(before, fraction=fraction)} before), {len(rs)} of {len(views)} nodes"
            )
        announced += 1
    return announced
