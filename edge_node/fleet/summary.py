"""The fleet summary: per node rounds, accuracy, bytes, refusals and energy; JSON, Markdown and a plot.

Built only from what the daemons wrote (each node's ``rounds.jsonl``), so it says what the nodes did,
not what the supervisor hoped: a round a node did not record is not counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from edge_node.fleet.daemons import exit_description
from edge_node.records import TASK_DEFAULTS, TASK_KEYS, node_means
from edge_node.storage import atomic_write_text
from edge_node.task_names import format_metric

SUMMARY_JSON = "fleet-summary.json"
SUMMARY_MD = "fleet-summary.md"
SUMMARY_PLOT = "fleet-accuracy.png"
SUMMARY_FILES = (SUMMARY_JSON, SUMMARY_MD, SUMMARY_PLOT)


def _add_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Counts by kind summed, sorted by kind."""
    total: dict[str, int] = {}
    for one in counts:
        for kind, count in one.items():
            total[kind] = total.get(kind, 0) + int(count)
    return dict(sorted(total.items()))


def node_summary(node_id: str, records: list[dict[str, Any]], *, exit_code: int | None, starts: int) -> dict[str, Any]:
    """One node's figures over its completed rounds (refusals and retried pulls: every round's, diverged too)."""
    done = [r for r in records if not r.get("diverged")]
    refused = _add_counts(r.get("refusals") or {} for r in records)
    answered = sorted({p for r in done for p in r.get("peers_answered", [])})
    labels = sorted({str(r.get("energy_label")) for r in done if r.get("energy_label")})
    first, last = (done[0], done[-1]) if done else (None, None)
    return {
        "node_id": node_id,
        "rounds": len(done),
        "last_round": last["round"] if last else None,
        "diverged_rounds": sum(1 for r in records if r.get("diverged")),
        "acc_first": first["acc_after"] if first else None,
        "acc_final": last["acc_after"] if last else None,
        "acc_final_before": last["acc_before"] if last else None,
        "bytes_in": sum(int(r.get("bytes_in", 0)) for r in done),
        "bytes_out": sum(int(r.get("bytes_out", 0)) for r in done),
        "peers_answered": answered,
        "peers_refused": refused,
        "pull_retries": _add_counts(r.get("pull_retries") or {} for r in records),
        "server_refusals": dict(last.get("server_refusals") or {}) if last else {},
        "energy_j": round(sum(float(r.get("energy_total_j", 0.0)) for r in done), 3),
        "energy_label": "+".join(labels) if labels else None,
        "exit_code": exit_code,
        "restarts": max(starts - 1, 0),
    }


def fleet_rounds(per_node: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per round: how many nodes recorded it and their mean accuracies (before and after local training)."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for records in per_node.values():
        for r in records:
            if not r.get("diverged"):
                by_round.setdefault(int(r["round"]), []).append(r)
    out = []
    for t in sorted(by_round):
        rs = by_round[t]
        means = node_means(rs)  # each record is a node entry: the simulation's means, over the nodes
        out.append({
            "round": t,
            "nodes": len(rs),
            "acc_before_mean": means["acc_before_mean"],
            "acc_after_mean": means["acc_after_mean"],
            "bytes_in_total": sum(int(r.get("bytes_in", 0)) for r in rs),
        })  # fmt: skip
    return out


def summarize(
    fleet: dict[str, Any], per_node: dict[str, list[dict[str, Any]]], exits: dict[str, int | None],
    starts: dict[str, int], devices: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The whole summary: ``fleet`` (settings, link report, wall time, outcome) plus what the nodes recorded;
    with ``devices`` (a fleet of device profiles) each node also carries its ``device``: profile, link, tier."""
    nodes = [node_summary(n, per_node.get(n, []), exit_code=exits.get(n), starts=starts.get(n, 1)) for n in per_node]
    for n in nodes:
        if devices and n["node_id"] in devices:
            n["device"] = devices[n["node_id"]]
    busiest = max(nodes, key=lambda n: n["bytes_in"] + n["bytes_out"], default=None)
    metric = metric_of(per_node)
    finals = [n["acc_final"] for n in nodes if n["acc_final"] is not None]
    firsts = [n["acc_first"] for n in nodes if n["acc_first"] is not None]
    poisoning = poisoning_of(per_node)
    return {
        **poisoning,
        "fleet": fleet,
        **metric,
        "nodes": nodes,
        "rounds": fleet_rounds(per_node),
        "acc_first_mean": sum(firsts) / len(firsts) if firsts else None,
        "acc_final_mean": sum(finals) / len(finals) if finals else None,
        "busiest_node": {"node_id": busiest["node_id"], "bytes": busiest["bytes_in"] + busiest["bytes_out"]}
        if busiest
        else None,
        "peers_refused_total": _add_counts(n["peers_refused"] for n in nodes),
        "pull_retries_total": _add_counts(n["pull_retries"] for n in nodes),
    }


def poisoning_of(per_node: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A poisoned fleet's attackers and attack as its records name them, and the honest nodes' final mean; {} for
    a fleet without attackers."""
    named = next((r for records in per_node.values() for r in records if r.get("attackers")), None)
    if named is None:
        return {}
    attackers = sorted(named["attackers"])
    done = {n: [r for r in records if not r.get("diverged")] for n, records in per_node.items() if n not in attackers}
    finals = [records[-1]["acc_after"] for records in done.values() if records]
    return {
        "attackers": attackers,
        "attack": named.get("attack"),
        "acc_final_honest_mean": sum(finals) / len(finals) if finals else None,
    }


def metric_of(per_node: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The task and headline metric the nodes' records name (records older than tasks: accuracy)."""
    first = next((r for records in per_node.values() for r in records if "metric" in r), {})
    return {k: first.get(k, TASK_DEFAULTS[k]) for k in TASK_KEYS}


def _pct(value: float | None, fraction: bool = True) -> str:
    return "-" if value is None or not math.isfinite(value) else format_metric(value, fraction=fraction)


def _mb(value: int) -> str:
    return f"{value / 1e6:.2f}"


def format_markdown(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table per node plus the fleet's lines."""
    fleet = summary["fleet"]
    metric = summary.get("metric", "accuracy")
    fraction = summary.get("metric_is_fraction", True)
    better = "" if metric == "accuracy" else (", higher is better" if summary.get("metric_higher_is_better", True)
                                              else ", lower is better")  # fmt: skip
    lines = [
        f"# Loopback fleet: {fleet['nodes']} nodes, {fleet['model']} on {fleet['dataset']} ({fleet['partition']})",
        "",
        f"| node | rounds | {metric} first -> final | bytes in (MB) | bytes out (MB) | peers answered | "
        "peers refused | energy (J) |",
        "|---|---:|---|---:|---:|---|---|---:|",
    ]
    for n in summary["nodes"]:
        refused = ", ".join(f"{k} {v}" for k, v in n["peers_refused"].items()) or "none"
        energy = f"{n['energy_j']:.1f} ({n['energy_label']})" if n["energy_label"] else "-"
        extra = []
        if n["restarts"]:
            extra.append(f"restarted {n['restarts']}x")
        if n["exit_code"] not in (0, None):
            extra.append(exit_description(n["exit_code"], short=True))
        name = n["node_id"] + (f" ({', '.join(extra)})" if extra else "")
        lines.append(
            f"| {name} | {n['rounds']} | {_pct(n['acc_first'], fraction)} -> {_pct(n['acc_final'], fraction)} | "
            f"{_mb(n['bytes_in'])} | "
            f"{_mb(n['bytes_out'])} | {', '.join(n['peers_answered']) or 'none'} | {refused} | {energy} |"
        )
    lines += device_table(summary["nodes"])
    lines.append("")
    lines.append(
        f"Fleet mean {metric} (after local training{better}): first round "
        f"{_pct(summary['acc_first_mean'], fraction)}, final {_pct(summary['acc_final_mean'], fraction)}."
    )
    if summary.get("attackers"):
        lines.append(
            f"Attackers ({summary['attack']}): {', '.join(summary['attackers'])}; honest nodes' final mean {metric} "
            f"{_pct(summary['acc_final_honest_mean'], fraction)}."
        )
    per_round = ", ".join(f"{r['round'] + 1}: {_pct(r['acc_after_mean'], fraction)}" for r in summary["rounds"])
    if per_round:
        lines.append(f"Per round (mean over the nodes that recorded it): {per_round}.")
    if summary["busiest_node"]:
        b = summary["busiest_node"]
        lines.append(f"Busiest node: {b['node_id']}, {_mb(b['bytes'])} MB received + sent.")
    if summary["pull_retries_total"]:
        retried = ", ".join(f"{k} {v}" for k, v in summary["pull_retries_total"].items())
        lines.append(f"Pull calls retried after a transient failure, by kind: {retried}.")
    link = fleet.get("link") or {}
    if link.get("asked"):
        applied = ", ".join(f"{k}={link['asked'][k]} ({how})" for k, how in link["applied"].items()) or "none"
        lines.append(f"Link per node: applied {applied}.")
        for k, why in link.get("not_applied", {}).items():
            lines.append(f"Link per node: **{k}={link['asked'][k]} NOT applied**: {why}.")
    mode = "network namespaces, mDNS" if fleet.get("netns") else "127.0.0.1, static peers"
    if fleet.get("lockstep"):
        mode += ", lock-step"
    if fleet.get("tls"):
        mode += ", mutual TLS"
    lines.append(f"Network: {mode}. Wall time {fleet.get('wall_s', 0):.0f} s; outcome: {fleet.get('outcome')}.")
    return "\n".join(lines) + "\n"


def device_table(nodes: list[dict[str, Any]]) -> list[str]:
    """A table of each node's device profile and the tier it chose, with what decided (none without profiles)."""
    rows = [n for n in nodes if n.get("device")]
    if not rows:
        return []
    lines = ["", "| node | device | CPUs (quota) | memory available / limit (MiB) | link (Mbit/s) | tier | "
             "decided by |", "|---|---|---:|---:|---:|---|---|"]  # fmt: skip
    for n in rows:
        device, cap = n["device"], n["device"].get("capacity") or {}
        profile = device["profile"]
        quota = "-" if cap.get("cpu_limit") is None else f"{cap['cpu_limit']:g}"
        cpus = f"{cap['cpu_count']} ({quota})" if cap.get("cpu_count") is not None else "-"
        memory = "-"
        if cap.get("available_memory_bytes") is not None:
            limit = cap.get("memory_limit_bytes")
            limit_mib = "-" if limit is None else f"{limit / 2**20:.0f}"
            memory = f"{cap['available_memory_bytes'] / 2**20:.0f} / {limit_mib}"
        measured_link = "-" if cap.get("link_mbit_s") is None else f"{cap['link_mbit_s']:g}"
        oom = f" (OOM-killed {device['oom_kills']}x)" if device.get("oom_kills") else ""
        name = (profile.get("describe") or profile["name"]) + oom
        lines.append(
            f"| {n['node_id']} | {name} | {cpus} | {memory} | {measured_link} | "
            f"{cap.get('tier') or '-'} | {cap.get('decided_by') or 'not recorded'} |"
        )
    return lines


def plot_panels(axes: list[Any], per_node: dict[str, list[dict[str, Any]]], rounds: list[dict[str, Any]]) -> None:
    """Fill ``axes`` in this order: accuracy per node and the mean against rounds; cumulative MB received
    (solid) and sent (dashed) per node; accuracy against wall time since the first record; joules per round
    per node, with the meter's label (an estimate is named as one)."""
    panels = [_accuracy_panel, _bytes_panel, _time_panel, _energy_panel]
    from matplotlib.ticker import MaxNLocator

    for ax, panel in zip(axes, panels, strict=False):
        for index, (node_id, records) in enumerate(per_node.items()):
            done = [r for r in records if not r.get("diverged")]
            if done:
                panel(ax, node_id, done, f"C{index % 10}")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if panel is _energy_panel:
            ax.set_ylim(bottom=0)
        if per_node:
            ax.legend(fontsize=7, ncol=2)
    if axes and rounds and len(per_node) > 1:
        first = axes[0]
        scale = 100 if metric_of(per_node)["metric_is_fraction"] else 1
        first.plot([r["round"] + 1 for r in rounds], [scale * r["acc_after_mean"] for r in rounds], color="black",
                   lw=2.5, label="fleet mean")  # fmt: skip
        first.legend(fontsize=7, ncol=2)


def _metric_scale(done: list[dict[str, Any]]) -> tuple[float, str, str]:
    """(scale, axis unit, metric name) of the records' headline metric: (100, " (%)", "accuracy") for accuracy."""
    metric = str(done[0].get("metric", "accuracy")).replace("_", " ")
    fraction = done[0].get("metric_is_fraction", True)
    return (100.0, " (%)", metric) if fraction else (1.0, "", metric)


def _accuracy_panel(ax: Any, node_id: str, done: list[dict[str, Any]], color: str) -> None:
    scale, unit, metric = _metric_scale(done)
    ax.plot([r["round"] + 1 for r in done], [scale * r["acc_after"] for r in done], alpha=0.6, lw=1, marker=".",
            color=color, label=node_id)  # fmt: skip
    ax.set(xlabel="round", ylabel=f"test {metric} after local training{unit}", title=f"{metric} per node")


def _bytes_panel(ax: Any, node_id: str, done: list[dict[str, Any]], color: str) -> None:
    xs = [r["round"] + 1 for r in done]
    ax.plot(xs, _cumulative([r.get("bytes_in", 0) / 1e6 for r in done]), color=color, marker=".", label=f"{node_id} in")
    ax.plot(xs, _cumulative([r.get("bytes_out", 0) / 1e6 for r in done]), color=color, ls="--", label=f"{node_id} out")
    ax.set(xlabel="round", ylabel="MB (encoded), cumulative", title="bytes received (solid) and sent (dashed)")


def _time_panel(ax: Any, node_id: str, done: list[dict[str, Any]], color: str) -> None:
    start = done[0]["time_unix"] - sum(float(v) for v in (done[0].get("seconds") or {}).values())
    scale, unit, metric = _metric_scale(done)
    ax.plot([(r["time_unix"] - start) / 60 for r in done], [scale * r["acc_after"] for r in done], marker=".",
            color=color, label=node_id)  # fmt: skip
    ax.set(xlabel="minutes since the node's first recorded round began", ylabel=f"{metric}{unit}",
           title=f"{metric} over wall time")  # fmt: skip


def _energy_panel(ax: Any, node_id: str, done: list[dict[str, Any]], color: str) -> None:
    labels = "+".join(sorted({str(r.get("energy_label")) for r in done if r.get("energy_label")})) or "no label"
    ax.plot([r["round"] + 1 for r in done], [float(r.get("energy_total_j", 0.0)) for r in done], marker=".",
            color=color, label=f"{node_id} ({labels})")  # fmt: skip
    ax.set(xlabel="round", ylabel="J per round", title="energy per round (label: how it was obtained)")


def _cumulative(values: list[float]) -> list[float]:
    out, total = [], 0.0
    for value in values:
        total += value
        out.append(total)
    return out


def plot_summary(summary: dict[str, Any], per_node: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """Accuracy per node and the fleet mean against rounds (left), cumulative bytes in and out per node (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    plot_panels(list(axes), per_node, summary["rounds"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_summary(out: Path, summary: dict[str, Any], per_node: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """Write the JSON, the Markdown and the plot into ``out``; returns their paths."""
    json_path, md_path = out / SUMMARY_JSON, out / SUMMARY_MD
    atomic_write_text(json_path, json.dumps(summary, indent=2) + "\n")
    atomic_write_text(md_path, format_markdown(summary))
    return [json_path, md_path, plot_summary(summary, per_node, out / SUMMARY_PLOT)]
