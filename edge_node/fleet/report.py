"""Reports on real runs: a daemon's state directory, or the output directory of a loopback fleet.

Built only from what the daemons wrote (``rounds.jsonl`` per node, the node's ``node-config.toml`` for
the rounds it was asked for, and a fleet's ``fleet-summary.json`` for its settings): per node accuracy
over rounds and over wall time, bytes, tiers, refusals and energy, the table and the plots. A node that
recorded fewer rounds than it was asked for is reported as stopped early ("3 of 5 rounds"), and its
last accuracy is called the last one, never the final one.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_node.errors import CheckpointError, ConfigError
from edge_node.fleet.summary import SUMMARY_JSON, fleet_rounds, metric_of, node_summary, plot_panels
from edge_node.node.state import CHECKPOINT_FILE, NODE_CONFIG_FILE
from edge_node.node.status import STATUS_FILE, rounds_done_text
from edge_node.records import ROUNDS_LOG, read_records
from edge_node.storage import atomic_write_text
from edge_node.task_names import format_metric
from edge_node.tomlconf import read_toml

SIM_CONFIG = "config.json"  # = edge_node.sim.checkpoint's run config (a simulation's output directory)
NODE_MARKERS = (CHECKPOINT_FILE, NODE_CONFIG_FILE, STATUS_FILE)
REPORT_MD = "run-report.md"
REPORT_JSON = "run-report.json"
REPORT_CSV = "run-report.csv"
REPORT_PLOT = "run-report.png"


@dataclass(frozen=True)
class NodeRun:
    """What one daemon recorded in its state directory."""

    node_id: str
    path: Path
    records: list[dict[str, Any]]
    planned: int | None  # rounds it was asked for; None: run until stopped, or not known


def kind_of(path: Path) -> str | None:
    """``"simulation"``, ``"fleet"`` (loopback output), ``"node"`` (a daemon's state dir), or None."""
    if (path / SIM_CONFIG).is_file() and (path / ROUNDS_LOG).is_file():
        return "simulation"
    if (path / SUMMARY_JSON).is_file() or any(p.is_file() for p in path.glob(f"*/{ROUNDS_LOG}")):
        return "fleet"
    if (path / ROUNDS_LOG).is_file() and any((path / m).exists() for m in NODE_MARKERS):
        return "node"
    return None


def read_node(path: Path, planned: int | None = None) -> NodeRun:
    """A daemon's state dir; ``planned`` stands in when the dir does not say how many rounds were asked for."""
    records = read_records(path)
    saved = read_toml(path / NODE_CONFIG_FILE) if (path / NODE_CONFIG_FILE).is_file() else {}
    asked = saved.get("rounds", planned)
    node_id = next((str(r["node_id"]) for r in records if r.get("node_id")), str(saved.get("node_id") or path.name))
    return NodeRun(node_id, path, records, int(asked) if isinstance(asked, int) and asked > 0 else None)


def read_fleet(path: Path) -> tuple[dict[str, Any], list[NodeRun]]:
    """A loopback fleet's settings (from its summary, when written) and each node's run."""
    info: dict[str, Any] = {}
    if (path / SUMMARY_JSON).is_file():
        try:
            info = dict(json.loads((path / SUMMARY_JSON).read_text()).get("fleet") or {})
        except (OSError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{path / SUMMARY_JSON} is not a fleet summary: {exc}") from exc
    planned = info.get("rounds") if isinstance(info.get("rounds"), int) else None
    nodes = [read_node(d, planned) for d in sorted(path.iterdir()) if (d / ROUNDS_LOG).is_file()]
    if not nodes:
        raise CheckpointError(f"{path} holds no node directory with a {ROUNDS_LOG}: not a loopback fleet's output")
    return info, nodes


def read_real_runs(paths: list[Path]) -> tuple[str, dict[str, Any], list[NodeRun]]:
    """(title, fleet settings, nodes) of node state dirs and loopback outputs (several merge into one report)."""
    info: dict[str, Any] = {}
    nodes: list[NodeRun] = []
    for path in paths:
        kind = kind_of(path)
        if kind == "fleet":
            found, fleet_nodes = read_fleet(path)
            info = info or found
            nodes += fleet_nodes
        elif kind == "node":
            nodes.append(read_node(path))
        else:
            raise ConfigError(f"{path} is neither a node's state dir nor a loopback fleet's output")
    ids = [n.node_id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ConfigError(
            f"node ids appear twice among the directories: {sorted({i for i in ids if ids.count(i) > 1})}"
        )
    title = ", ".join(str(p) for p in paths)
    return title, info, nodes


def completeness(node: NodeRun) -> str:
    """``5 of 5 rounds`` / ``3 of 5 rounds: stopped early`` / ``7 rounds`` (no planned count)."""
    done = sum(1 for r in node.records if not r.get("diverged"))
    if node.planned is None:
        return rounds_done_text(done)
    text = rounds_done_text(done, node.planned)
    return text if done >= node.planned else f"{text}: stopped early"


def build_report(title: str, info: dict[str, Any], nodes: list[NodeRun]) -> dict[str, Any]:
    """Per node figures (accuracy, bytes, tiers, refusals, energy, completeness) and the fleet's per round."""
    per_node = {n.node_id: n.records for n in nodes}
    rows = []
    for node in nodes:
        row = node_summary(node.node_id, node.records, exit_code=None, starts=1)
        done = [r for r in node.records if not r.get("diverged")]
        last = done[-1] if done else {}
        row.update({
            "path": str(node.path),
            "rounds_planned": node.planned,
            "complete": node.planned is not None and row["rounds"] >= node.planned,
            "completeness": completeness(node),
            "tiers": sorted({str(r["tier"]) for r in done if r.get("tier") is not None}),
            "discovery_refusals": dict(last.get("discovery_refusals") or {}),
            "wall_s": round(done[-1]["time_unix"] - done[0]["time_unix"], 1) if len(done) > 1 else None,
        })  # fmt: skip
        rows.append(row)
    early = [r for r in rows if r["rounds_planned"] is not None and not r["complete"]]
    return {
        "title": title,
        "fleet": info,
        **metric_of(per_node),
        "nodes": rows,
        "rounds": fleet_rounds(per_node),
        "stopped_early": [r["node_id"] for r in early],
    }


def _pct(value: float | None, fraction: bool = True) -> str:
    return "-" if value is None else format_metric(value, fraction=fraction)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def format_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: what stopped early first, then a row per node and the fleet's rounds."""
    nodes = report["nodes"]
    metric, fraction = report.get("metric", "accuracy"), bool(report.get("metric_is_fraction", True))
    lines = [f"# Run report: {report['title']} ({len(nodes)} node{'' if len(nodes) == 1 else 's'})", ""]
    if report["stopped_early"]:
        lines += [
            f"**Stopped early** ({'accuracies' if metric == 'accuracy' else metric + ' values'} are the last "
            "recorded, not final): "
            + "; ".join(f"{n['node_id']} {n['completeness'].split(':')[0]}" for n in nodes if not n["complete"]
                        and n["rounds_planned"] is not None) + ".",
            "",
        ]  # fmt: skip
    lines += [
        f"| node | tier | rounds | {metric} first -> last | bytes in (MB) | bytes out (MB) | peers refused | "
        "server refusals | discovery refusals | energy (J) |",
        "|---|---|---|---|---:|---:|---|---|---|---:|",
    ]
    for n in nodes:
        energy = f"{n['energy_j']:.1f} ({n['energy_label']})" if n["energy_label"] else "-"
        lines.append(
            f"| {n['node_id']} | {', '.join(n['tiers']) or '-'} | {n['completeness']} | "
            f"{_pct(n['acc_first'], fraction)} -> {_pct(n['acc_final'], fraction)} | {n['bytes_in'] / 1e6:.2f} | "
            f"{n['bytes_out'] / 1e6:.2f} | "
            f"{_counts(n['peers_refused'])} | {_counts(n['server_refusals'])} | {_counts(n['discovery_refusals'])} | "
            f"{energy} |"
        )
    per_round = ", ".join(
        f"{r['round'] + 1}: {_pct(r['acc_after_mean'], fraction)} ({r['nodes']} node{'' if r['nodes'] == 1 else 's'})"
        for r in report["rounds"]
    )
    if per_round:
        lines += ["", f"Mean {metric} after local training, per round: {per_round}."]
    lines += [
        "",
        "Rounds count from 1 (a record's `round` is the 0-based index). Bytes are the encoded streams (bitmap + "
        "values + headers); server and discovery refusals are the node's totals since its last start; energy "
        "carries its meter's label (`estimated` is CPU time x a power model, not a measurement).",
    ]
    return "\n".join(lines) + "\n"


def format_csv(report: dict[str, Any]) -> str:
    """One row per node."""
    out = io.StringIO()
    columns = ["node_id", "tiers", "rounds", "rounds_planned", "complete", "acc_first", "acc_final", "bytes_in",
               "bytes_out", "peers_refused", "server_refusals", "discovery_refusals", "energy_j", "energy_label",
               "wall_s"]  # fmt: skip
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for n in report["nodes"]:
        writer.writerow(
            [";".join(n[c]) if c == "tiers" else _counts(n[c]) if c.endswith("refusals") or c == "peers_refused"
             else n[c] for c in columns]
        )  # fmt: skip
    return out.getvalue()


def plot_report(nodes: list[NodeRun], report: dict[str, Any], path: Path) -> Path:
    """Accuracy per node against rounds and against wall time, cumulative bytes in/out, energy per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    plot_panels(list(axes.flat), {n.node_id: n.records for n in nodes}, report["rounds"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_real_report(paths: list[Path], out_dir: Path) -> tuple[str, list[Path]]:
    """Read ``paths``, write the Markdown, JSON, CSV and plot into ``out_dir``; (Markdown, files written)."""
    title, info, nodes = read_real_runs(paths)
    report = build_report(title, info, nodes)
    markdown = format_markdown(report)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / REPORT_MD, out_dir / REPORT_JSON, out_dir / REPORT_CSV]
    atomic_write_text(files[0], markdown)
    atomic_write_text(files[1], json.dumps(report, indent=2) + "\n")
    atomic_write_text(files[2], format_csv(report))
    files.append(plot_report(nodes, report, out_dir / REPORT_PLOT))
    return markdown, files
