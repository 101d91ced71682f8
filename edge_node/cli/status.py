"""``edge-node status``: the running node's state, asked of the daemon itself (or its last file when it is gone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edge_node.cli._app import app
from edge_node.cli._node_options import state_dir_of
from edge_node.exit_codes import ExitCode
from edge_node.node.status import rounds_done_text
from edge_node.task_names import format_record_metric


def format_status(status: dict[str, Any]) -> str:
    """A few aligned lines for a terminal."""
    if status.get("source") == "file":
        head = f"NOT RUNNING: last status from {status['file']}, written {status['file_age_s']:.0f} s ago"
    else:
        head = f"running (pid {status.get('pid')}), {'healthy' if status.get('healthy') else 'NOT healthy'}"
    acc = status.get("acc_after")
    done, phase = status.get("rounds_done"), status.get("phase")
    peers = status.get("peers") or []
    rows = [
        ("status", head),
        ("node", f"{status.get('node_id')} of fleet {status.get('fleet')}, port {status.get('port')}"),
        ("model", f"{status.get('model')}, tier {status.get('tier')} (density {status.get('density')})"),
        ("rounds", f"{'-' if done is None else rounds_done_text(done, status.get('rounds_planned'))}, phase {phase}"),
        (
            str(status.get("metric") or "accuracy"),
            "-" if acc is None else f"{format_record_metric(status, 'acc_after')} after local training (last round)",
        ),
        ("peers known", ", ".join(status.get("peers_known") or []) or "none"),
        ("exchange", _exchange(status.get("peer_exchange"))),
        ("bytes in", f"{status.get('bytes_in_total', 0) / 1e6:.2f} MB this run"),
        ("energy", f"{status.get('energy_j_this_run', 0):.4g} J this run ({status.get('energy_label') or '-'})"),
        ("capacity", _capacity(status.get("capacity"), status.get("tier_moves"))),
        ("data", _data(status)),
        ("privacy", _privacy(status.get("privacy"))),
        ("refused", _refusals(status)),
    ]
    rows += [(f"  {p['node_id']}", _peer(p)) for p in peers]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _peer(peer: dict[str, Any]) -> str:
    """A peer's last result, the round of the last snapshot it gave (never a "round None"), its backoff."""
    text = str(peer.get("last_result") or "not asked yet")
    if peer.get("last_round") is not None:
        text += f", its snapshot: {rounds_done_text(int(peer['last_round']))}"
    if peer.get("backoff_s"):
        text += f", backoff {peer['backoff_s']} s"
    return text


def _exchange(exchange: Any) -> str:
    """The peers learned through exchange and the asks that failed, or off."""
    if not exchange:
        return "off"
    learned = ", ".join(exchange.get("learned") or []) or "none"
    return (f"every {exchange.get('interval_s'):g} s; learned {learned}; {exchange.get('candidates', 0)} unverified; "
            f"{exchange.get('asks_failed', 0)} of {exchange.get('asks', 0)} asks failed")  # fmt: skip


def _privacy(budget: Any) -> str:
    """The DP-SGD budget spent so far, or none."""
    if not isinstance(budget, dict):
        return "none (models are not differentially private)"
    left = "" if budget.get("dp_budget_left") else "; SPENT: no new models are published"
    return (
        f"dp-sgd, epsilon {budget.get('dp_epsilon_spent', 0):.3f} of {budget.get('dp_epsilon_target')} spent at "
        f"delta {budget.get('dp_delta')} (noise multiplier {budget.get('dp_noise_multiplier', 0):.3f}){left}"
    )


def _capacity(decision: Any, moves: Any) -> str:
    """How the tier was decided, and capacity auto's moves since start."""
    if not isinstance(decision, dict):
        return "-"
    moved = {k: v for k, v in moves.items() if v} if isinstance(moves, dict) else {}
    tail = "; moved " + ", ".join(f"{k} {v}x" for k, v in sorted(moved.items())) if moved else ""
    return f"{decision.get('source')}: {decision.get('decided_by')}{tail}"


def _data(status: dict[str, Any]) -> str:
    """Training and test samples now; with data_refresh round, the last re-read's new ones and the files refused."""
    train, test = status.get("train_samples"), status.get("test_samples")
    if train is None or test is None:
        return "-"
    text = f"{train} training, {test} test samples"
    if status.get("data_refresh") == "round":
        refused = status.get("data_refused") or {}
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(refused.items())) or "none"
        text += f"; re-read every round: {status.get('samples_arrived', 0)} arrived last, refused {skipped}"
    return text


def _refusals(status: dict[str, Any]) -> str:
    """Refusals by the node's server and by its discovery since start, by reason."""
    parts = []
    for label, key in (("server", "server_refusals"), ("discovery", "discovery_refusals")):
        counts = status.get(key) or {}
        if counts:
            parts.append(f"{label} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "; ".join(parts) or "none"


@app.command()
@click.option("--state-dir", type=click.Path(path_type=Path), default=None, help="The node's state dir.")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None, help="Find state_dir here.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (source: live or file).")
def status(state_dir: Path | None, config_file: Path | None, as_json: bool) -> None:
    """Ask the running node how it is: id, tier, round, phase, peers, accuracy, bytes, energy.

    Live from the daemon's socket; when no daemon answers, its last status.json is shown as such.
    Exit 0 when a live node reports healthy, 3 when no node answers or it is not healthy.
    """
    from edge_node.node.status import query, read_status_file

    where = state_dir_of(state_dir, config_file)
    found = query(where)
    if found is None:
        found = read_status_file(where)
    if found is None:
        click.echo(f"edge-node: no node answers in {where} and it holds no status.json", err=True)
        raise click.exceptions.Exit(int(ExitCode.NETWORK))
    click.echo(json.dumps(found, sort_keys=True) if as_json else format_status(found))
    if found.get("source") != "live" or not found.get("healthy"):
        raise click.exceptions.Exit(int(ExitCode.NETWORK))
