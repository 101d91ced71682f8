"""The paper's table across run directories: one row per method, accuracy per partition, communication of
the busiest node (our encoded bytes and the paper's convention), FLOPs, rounds to a target accuracy; as
Markdown and CSV, plus accuracy and communication plots of all runs.

Accuracy is each run's headline accuracy in its last round (``acc_mean``: after local training for DisPFL
and Local, the neighbourhood average for D-PSGD, the global model for FedAvg, fine-tuned for the -FT
baselines), in percent, averaged over runs of the same method and partition (``n=`` says how many).
Communication and FLOPs are means over a run's rounds; where a method's runs on two partitions differ,
the cell holds both (in column order). "Rounds to X%" is the first round (1-based) whose accuracy reaches
X: X is ``target_acc`` if given, else :data:`DEFAULT_TARGET_FRACTION` (80 %) of the best final accuracy
among that partition's runs, so the column tells how soon a method gets near the best and which never
does ("not reached").
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_node.data.partition import parse_partition_spec
from edge_node.errors import CheckpointError
from edge_node.records import read_records
from edge_node.sim.methods import REGISTRY
from edge_node.sim.report import CONVENTIONS
from edge_node.storage import atomic_write_text

TABLE_MD = "table.md"
TABLE_CSV = "table.csv"
RUNS_CSV = "runs.csv"
ACCURACY_PLOT = "accuracy.png"
COMMUNICATION_PLOT = "communication.png"
ACCURACY_VS_COMM_PLOT = "accuracy_vs_communication.png"
RUN_COLUMNS = (
    "run", "method", "partition", "partition_variant", "dataset", "model", "clients", "epochs", "rounds",
    "final_acc_pct", "busiest_mb", "paper_mb", "flops_per_client_round", "wall_s",
)  # fmt: skip
DEFAULT_TARGET_FRACTION = 0.8  # rounds-to-target default: this share of a partition's best final accuracy
NOT_REACHED = "not reached"
# The table's rows, as the paper's: the dense baselines, then the sparse methods, each in the registry's order
# (local, dpsgd, dpsgd-ft, fedavg, fedavg-ft, dispfl, dispfl-s2s); methods this version lacks last.
METHOD_ORDER = tuple(sorted(REGISTRY, key=lambda name: REGISTRY[name].sparse))


@dataclass(frozen=True)
class Run:
    """One run directory, read: its settings and per-round records."""

    path: Path
    config: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def method(self) -> str:
        return str(self.config.get("method", "dispfl"))

    @property
    def label(self) -> str:
        """The table row: the method, and what sets a sparse method's runs apart (setting ii, density)."""
        method = REGISTRY.get(self.method)
        if method is None:  # a run of a method this version does not have
            return self.method
        label = method.label
        if method.sparse:
            if self.config.get("setting") == "ii":
                return f"{label} (setting ii)"
            return f"{label} (d={self.config.get('density', 0.5):g})"
        return label

    @property
    def column(self) -> str:
        """The accuracy column: ``Dir(0.3)``, ``Path(2)``, with the variant when it is not the reference."""
        spec = parse_partition_spec(str(self.config.get("partition", "dir:0.3")))
        name = f"{spec.kind.capitalize()}({spec.value:g})"
        if "partition_variant" not in self.config:  # runs before the reference partition: the balanced one
            return f"{name} balanced"
        return name if spec.variant == "reference" else f"{name} {spec.variant}"

    @property
    def metric(self) -> str:
        """The headline metric its records name (runs before tasks: accuracy)."""
        return str(self.records[-1].get("metric") or "accuracy") if self.records else "accuracy"

    @property
    def higher_is_better(self) -> bool:
        return bool(self.records[-1].get("metric_higher_is_better", True)) if self.records else True

    @property
    def scale(self) -> float:
        """100 for a metric shown in percent (accuracy, F1), else 1 (an error in the target's units)."""
        return 100.0 if (not self.records or self.records[-1].get("metric_is_fraction", True)) else 1.0

    def accuracy_curve(self) -> list[float]:
        """The headline metric per round: accuracy in percent, another task's metric in its units."""
        return [self.scale * r["acc_mean"] for r in self.records]

    def final_accuracy(self) -> float:
        return self.accuracy_curve()[-1]

    def busiest_mb(self) -> float:
        return sum(r["busiest_node_bytes"] for r in self.records) / len(self.records) / 1e6

    def paper_mb(self) -> float:
        return sum(r["paper_comm_mb_busiest"] for r in self.records) / len(self.records)

    def flops(self) -> float | None:
        """Mean FLOPs per client per round; ``None`` (unknown) if a round's are (a model the counter could not run)."""
        values = [r["flops_per_client_mean"] for r in self.records]
        return None if None in values else sum(values) / len(values)

    def rounds_to(self, target: float) -> int | None:
        """The first round (1-based) whose metric reaches ``target`` (percent for accuracy; at or below it for a
        metric where lower is better), or None."""
        for number, acc in enumerate(self.accuracy_curve(), 1):
            if (acc >= target - 1e-9) if self.higher_is_better else (acc <= target + 1e-9):
                return number
        return None

    def wall_s(self) -> float:
        return sum(r.get("wall_s", 0.0) for r in self.records)


def read_run(path: Path) -> Run:
    """A run directory's ``config.json`` and ``rounds.jsonl``; CheckpointError naming what is missing."""
    config_path = path / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{config_path} not found: not a simulation output directory")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{config_path} is not readable JSON: {exc}") from exc
    records = read_records(path)
    if not records:
        raise CheckpointError(f"{path} has no completed round yet")
    return Run(path, config, records)


@dataclass(frozen=True)
class Table:
    """The pivoted table: header, rows of cells, and the per-partition targets used."""

    header: list[str]
    rows: list[list[str]]
    targets: dict[str, float]
    runs: list[Run]

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.header)
        writer.writerows(self.rows)
        return buf.getvalue()

    def runs_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(RUN_COLUMNS)
        for run in self.runs:
            c = run.config
            writer.writerow([
                str(run.path), run.method, c.get("partition"), c.get("partition_variant", "balanced"), c.get("dataset"),
                c.get("model"), c.get("clients"), c.get("epochs"), len(run.records), f"{run.final_accuracy():.2f}",
                f"{run.busiest_mb():.3f}", f"{run.paper_mb():.3f}", _fmt_known(run.flops(), ".4g"),
                f"{run.wall_s():.1f}",
            ])  # fmt: skip
        return buf.getvalue()


def _fmt_known(value: float | None, fmt: str) -> str:
    return "unknown" if value is None else format(value, fmt)


def _joined_known(values: list[float | None], fmt: str) -> str:
    """:func:`_joined`, or "unknown" if a value is unknown."""
    return "unknown" if None in values else _joined([v for v in values if v is not None], fmt)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _joined(values: list[float], fmt: str) -> str:
    """One figure when the values agree within 0.5%, else all of them, "a / b"."""
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    if hi - lo <= 0.005 * max(abs(hi), 1e-12):
        return format(values[0], fmt)
    return " / ".join(format(v, fmt) for v in values)


def build_table(runs: Sequence[Run], target_acc: float | None = None) -> Table:
    """The paper-style table of ``runs`` (see the module docstring)."""
    if not runs:
        raise CheckpointError("no run directories given")
    metrics = sorted({(r.metric, r.higher_is_better) for r in runs})
    if len(metrics) > 1:
        raise CheckpointError(f"runs of different tasks cannot share one table: metrics {[m for m, _ in metrics]}")
    metric, higher = metrics[0]
    columns = sorted({r.column for r in runs}, key=lambda c: (not c.startswith("Dir"), c))
    targets = {col: target_acc if target_acc is not None else _default_target([r for r in runs if r.column == col])
               for col in columns}  # fmt: skip
    unit = " (%)" if runs[0].scale == 100 else ""
    name = "acc" if metric == "accuracy" else metric
    shown = "{:.1f}%" if runs[0].scale == 100 else "{:.4g}"
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    labels = sorted({r.label for r in runs}, key=lambda lab: (
        min(order.get(r.method, 99) for r in runs if r.label == lab), lab))  # fmt: skip
    reach = "" if higher else "<= "
    header = ["method", *(f"{c} {name}{unit}" for c in columns), "busiest node MB/round (encoded)",
              "busiest node MB/round (paper conv.)", "FLOPs/client/round",
              *(f"rounds to {reach}{shown.format(targets[c])} ({c})" for c in columns)]  # fmt: skip
    rows = []
    for label in labels:
        mine = [r for r in runs if r.label == label]
        acc_cells, round_cells = [], []
        busiest: list[float] = []
        paper: list[float] = []
        flops: list[float | None] = []  # None: unknown
        for col in columns:
            cell = [r for r in mine if r.column == col]
            if not cell:
                acc_cells.append("-")
                round_cells.append("-")
                continue
            acc = _mean([r.final_accuracy() for r in cell])
            acc_cells.append((f"{acc:.2f}" if runs[0].scale == 100 else f"{acc:.4g}")
                             + (f" (n={len(cell)})" if len(cell) > 1 else ""))  # fmt: skip
            round_cells.append(_rounds_cell([r.rounds_to(targets[col]) for r in cell]))
            busiest.append(_mean([r.busiest_mb() for r in cell]))
            paper.append(_mean([r.paper_mb() for r in cell]))
            cell_flops = [r.flops() for r in cell]
            flops.append(None if None in cell_flops else _mean([f for f in cell_flops if f is not None]))
        rows.append([label, *acc_cells, _joined(busiest, ".2f"), _joined(paper, ".2f"), _joined_known(flops, ".3g"),
                     *round_cells])  # fmt: skip
    return Table(header, rows, targets, list(runs))


def _default_target(runs: Sequence[Run]) -> float:
    """:data:`DEFAULT_TARGET_FRACTION` of the best final accuracy; for a metric where lower is better (an error),
    the best final value divided by that fraction (within 1.25x of the best)."""
    if runs[0].higher_is_better:
        return DEFAULT_TARGET_FRACTION * max(r.final_accuracy() for r in runs)
    return min(r.final_accuracy() for r in runs) / DEFAULT_TARGET_FRACTION


def _rounds_cell(reached: list[int | None]) -> str:
    """Mean rounds to the target of a cell's runs; "not reached" when none did, "(k of n reached)" if some."""
    numbers = [float(x) for x in reached if x is not None]
    if not numbers:
        return NOT_REACHED
    cell = f"{_mean(numbers):.3g}"
    return cell if len(numbers) == len(reached) else f"{cell} ({len(numbers)} of {len(reached)} reached)"


def caption(table: Table, target_acc: float | None) -> str:
    """What the table's columns mean, written under it: accuracy, rounds-to-target and the conventions."""
    run = table.runs[0]
    if run.metric != "accuracy":
        shown = "{:.1f}%" if run.scale == 100 else "{:.4g}"
        better = "higher" if run.higher_is_better else "lower"
        if target_acc is not None:
            target = f"{shown.format(target_acc)} (--target-acc)"
        else:
            best = ", ".join(f"{c}: {shown.format(t)}" for c, t in table.targets.items())
            rule = (f"{DEFAULT_TARGET_FRACTION:.0%} of the best final {run.metric}" if run.higher_is_better else
                    f"the best final {run.metric} / {DEFAULT_TARGET_FRACTION:g}")  # fmt: skip
            target = f"{rule} among each partition's runs (so {best})"
        side = "at or above" if run.higher_is_better else "at or below"
        return (
            f"{run.metric}: each run's final-round headline {run.metric} ({better} is better). Rounds to target: the "
            f"first round (1-based) {side} {target}; {NOT_REACHED}: no round did. Conventions: {CONVENTIONS}.\n"
        )
    if target_acc is not None:
        target = f"{target_acc:g}% (--target-acc)"
    else:
        best = ", ".join(f"{c}: {t:.1f}%" for c, t in table.targets.items())
        target = f"{DEFAULT_TARGET_FRACTION:.0%} of the best final accuracy among each partition's runs (so {best})"
    return (
        f"Accuracy: each run's final-round headline accuracy (see docs). Rounds to target: the first round "
        f"(1-based) at or above {target}; {NOT_REACHED}: no round did. Conventions: {CONVENTIONS}.\n"
    )


def _run_name(run: Run) -> str:
    return f"{run.label}, {run.column}"


def plot_runs(runs: Sequence[Run], out_dir: Path) -> list[Path]:
    """accuracy.png, communication.png and accuracy_vs_communication.png of all runs, one panel per partition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = sorted({r.column for r in runs}, key=lambda c: (not c.startswith("Dir"), c))
    paths = []
    metric_axis = f"mean client test {runs[0].metric.replace('_', ' ')}{' (%)' if runs[0].scale == 100 else ''}"
    for name, ylabel, xlabel, series in (
        (ACCURACY_PLOT, metric_axis, "round",
         lambda r: ([x["round"] + 1 for x in r.records], r.accuracy_curve())),
        (COMMUNICATION_PLOT, "busiest node MB per round (encoded, 1 MB = 1e6 B)", "round",
         lambda r: ([x["round"] + 1 for x in r.records], [x["busiest_node_bytes"] / 1e6 for x in r.records])),
        (ACCURACY_VS_COMM_PLOT, metric_axis, "cumulative busiest-node MB (encoded)",
         lambda r: (_cumulative([x["busiest_node_bytes"] / 1e6 for x in r.records]), r.accuracy_curve())),
    ):  # fmt: skip
        fig, axes = plt.subplots(1, len(columns), figsize=(6 * len(columns), 4.2), squeeze=False)
        for ax, col in zip(axes[0], columns, strict=True):
            for run in sorted((r for r in runs if r.column == col), key=lambda r: METHOD_ORDER.index(r.method)
                              if r.method in METHOD_ORDER else 99):  # fmt: skip
                xs, ys = series(run)
                ax.plot(xs, ys, marker="o", ms=3, label=run.label)
            ax.set_title(col)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _cumulative(values: Sequence[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def write_report(runs: Sequence[Run], out_dir: Path, target_acc: float | None = None) -> tuple[Table, list[Path]]:
    """Write table.md, table.csv, runs.csv and the plots into ``out_dir``; returns the table and the files."""
    table = build_table(runs, target_acc)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / TABLE_MD, table.markdown() + "\n" + caption(table, target_acc))
    atomic_write_text(out_dir / TABLE_CSV, table.csv())
    atomic_write_text(out_dir / RUNS_CSV, table.runs_csv())
    files = [out_dir / TABLE_MD, out_dir / TABLE_CSV, out_dir / RUNS_CSV, *plot_runs(runs, out_dir)]
    return table, files
