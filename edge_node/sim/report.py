"""Reports of a simulation run: summary figures, a paper-style table and PNG plots.

Accounting conventions (stated in every report): bytes are what the encoder produces (bitmap +
fp32 values + headers) per node per round; the busiest node is the max over nodes of received +
sent; "paper MB" counts 4 bytes per active received parameter, 1 MB = 1e6 bytes, as the DisPFL
paper's Comm (MB) column does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_node.records import TASK_DEFAULTS, TASK_KEYS
from edge_node.task_names import format_metric

SUMMARY_FILE = "summary.json"
ACCURACY_PLOT = "accuracy.png"
COMMUNICATION_PLOT = "communication.png"

CONVENTIONS = (
    "bytes = encoded bitmap+values+headers per node per round (fp32); busiest = max over nodes of recv+sent; "
    "paper MB = 4 B per active received parameter, 1 MB = 1e6 B; FLOPs = E*n*3*F(nnz) (+B*3*F(dense) for "
    "gradient regrowth); accuracy (or another task's headline metric) = unweighted mean over clients of local test "
    "accuracy (of that metric)"
)


def _known_sum(values: list[float | None], divisor: int = 1) -> float | None:
    """``sum(values) / divisor``; ``None`` (unknown) if any value is (a model whose FLOPs could not be counted)."""
    return None if any(v is None for v in values) else sum(v for v in values if v is not None) / divisor


def summarize(records: list[dict[str, Any]], energy: dict[str, Any] | None = None) -> dict[str, Any]:
    """Headline figures of a run: final/best accuracy, bytes, paper MB, FLOPs, time, energy.

    ``energy`` is ``edge_node.energy.report.summarize`` of the run's energy log: the machine's joules,
    kept per label (measured / estimated), never summed with each other or with the modelled cost.
    """
    if not records:
        return {"rounds": 0}
    machine_energy = {
        label: {"total_j": total["total_j"], "sources": total["sources"], "mean_power_w": total["mean_power_w"]}
        for label, total in (energy or {}).get("totals", {}).items()
    }
    last = records[-1]
    n = len(records)
    after = [r["acc_after_mean"] for r in records if r.get("acc_after_mean") is not None]
    best = max if last.get("metric_higher_is_better", True) else min  # the task's direction (records before: max)
    return {
        "rounds": n,
        "method": last.get("method", "dispfl"),
        **{k: last.get(k, TASK_DEFAULTS[k]) for k in TASK_KEYS},
        "acc_final": last["acc_mean"],
        "acc_metric": last.get("acc_mean_is", "after local training"),
        "acc_best": best(r["acc_mean"] for r in records),
        "acc_after_final": last.get("acc_after_mean"),
        "acc_before_final": last["acc_before_mean"],
        "acc_after_best": best(after) if after else None,
        "bytes_received_per_node_round": sum(r["bytes_in_mean"] for r in records) / n,
        "busiest_node_bytes_max": max(r["busiest_node_bytes"] for r in records),
        "busiest_node_bytes_mean": sum(r["busiest_node_bytes"] for r in records) / n,
        "paper_comm_mb_busiest": max(r["paper_comm_mb_busiest"] for r in records),
        "paper_comm_mb_busiest_mean": sum(r["paper_comm_mb_busiest"] for r in records) / n,
        "paper_comm_mb_mean": sum(r["paper_comm_mb_mean"] for r in records) / n,
        "density_final": last.get("density_mean"),
        "flops_per_client_round": _known_sum([r["flops_per_client_mean"] for r in records], n),
        "modelled_energy_j": _known_sum([r["modelled_energy"]["total_j"] for r in records]),
        "machine_energy": machine_energy,
        "wall_s": sum(r.get("wall_s", 0.0) for r in records),
        "conventions": CONVENTIONS,
    }


def _or_unknown(value: float | None, fmt: str, unit: str = "") -> str:
    return "unknown" if value is None else format(value, fmt) + unit


def format_summary(summary: dict[str, Any]) -> str:
    """A paper-style table of the summary, for the terminal."""
    if not summary.get("rounds"):
        return "no completed rounds"

    fraction = bool(summary.get("metric_is_fraction", True))

    def pct(value: float | None) -> str:
        return "-" if value is None else format_metric(value, fraction=fraction, digits=2)

    metric = str(summary.get("metric", "accuracy"))
    direction = "" if metric == "accuracy" else (" (higher is better)" if summary.get("metric_higher_is_better", True)
                                                 else " (lower is better)")  # fmt: skip
    rows = [
        ("method", f"{summary.get('method', 'dispfl')}"),
        *(
            [("task", f"{summary['task']}{direction}")]
            if summary.get("task", "classification") != "classification"
            else []
        ),  # fmt: skip
        ("rounds", f"{summary['rounds']}"),
        (f"{metric} (final)", f"{pct(summary.get('acc_final'))} ({summary.get('acc_metric', '')})"),
        (f"{metric} (best round)", pct(summary.get("acc_best"))),
        (f"{metric} after local training (final)", pct(summary.get("acc_after_final"))),
        (f"{metric} before local training (final)", pct(summary.get("acc_before_final"))),
        ("bytes received per node per round", f"{summary['bytes_received_per_node_round'] / 1e6:.3f} MB (encoded)"),
        ("busiest node per round (recv+sent)", f"{summary['busiest_node_bytes_max'] / 1e6:.3f} MB (encoded)"),
        ("Comm, paper convention (busiest)", f"{summary['paper_comm_mb_busiest']:.2f} MB"),
        ("FLOPs per client per round", _or_unknown(summary["flops_per_client_round"], ".4g")),
        *(
            (f"energy of this machine, {label}", f"{e['total_j']:.4g} J ({', '.join(e['sources'])})")
            for label, e in summary.get("machine_energy", {}).items()
        ),
        (
            "energy, modelled (all clients)",
            f"{_or_unknown(summary['modelled_energy_j'], '.4g', ' J')} (modelled, not measured)",
        ),
        ("wall time", f"{summary['wall_s']:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    return "\n".join(lines + ["", f"conventions: {summary['conventions']}"])


def plot_run(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Write ``accuracy.png`` and ``communication.png`` (against rounds); returns their paths."""
    rounds = [r["round"] + 1 for r in records]
    last = records[-1] if records else {}
    scale = 100 if last.get("metric_is_fraction", True) else 1
    before_label = last.get("acc_before_is") or "before (aggregated)"
    accuracy = [([scale * r["acc_before_mean"] for r in records], {"marker": ".", "label": before_label})]
    if all(r.get("acc_after_mean") is not None for r in records):
        after = [scale * r["acc_after_mean"] for r in records]
        accuracy.insert(0, (after, {"marker": "o", "label": last.get("acc_after_is") or "after local training"}))
    communication = [
        ([r["busiest_node_bytes"] / 1e6 for r in records], {"marker": "o", "label": "busiest node, recv+sent"}),
        ([r["bytes_in_mean"] / 1e6 for r in records], {"marker": ".", "label": "mean node, received"}),
        ([r["paper_comm_mb_busiest"] for r in records], {"ls": "--", "label": "paper convention, busiest"}),
    ]
    return [
        _line_plot(out_dir / ACCURACY_PLOT, rounds, accuracy, _metric_axis(last)),
        _line_plot(out_dir / COMMUNICATION_PLOT, rounds, communication, "MB per round (1 MB = 1e6 B)"),
    ]


def _metric_axis(record: dict[str, Any]) -> str:
    """The y label of the metric plot: ``mean client test accuracy (%)`` for classification."""
    metric = str(record.get("metric", "accuracy"))
    unit = " (%)" if record.get("metric_is_fraction", True) else ""
    better = "" if metric == "accuracy" else (", higher is better" if record.get("metric_higher_is_better", True)
                                              else ", lower is better")  # fmt: skip
    return f"mean client test {metric.replace('_', ' ')}{unit}{better}"


def _line_plot(path: Path, rounds: list[int], series: list[tuple[list[float], dict[str, Any]]], ylabel: str) -> Path:
    """One PNG of ``series`` (values, matplotlib line style) against integer rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    for values, style in series:
        ax.plot(rounds, values, **style)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
