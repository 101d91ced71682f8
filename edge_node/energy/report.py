"""Read an energy log (``energy.jsonl``), summarise it per round and phase, and plot it.

Measured, estimated and modelled joules are kept apart everywhere: totals are per label, and
an estimated log says in its first lines that no measurement was available.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from edge_node.energy.accounting import PHASES
from edge_node.energy.modelled import MODELLED
from edge_node.errors import CheckpointError

LOG_NAME = "energy.jsonl"
LABELS = ("measured", "estimated", MODELLED)


@dataclass
class EnergyLog:
    """The records of one energy log, plus notes about what was skipped while reading it."""

    path: Path
    records: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def _number(value: object) -> TypeGuard[int | float]:
    """A finite JSON number (``bool`` is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_record(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise CheckpointError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if not isinstance(record.get("round"), int) or isinstance(record.get("round"), bool):
        raise CheckpointError(f"{where}: 'round' missing or not an integer")
    if not _number(record.get("total_j")):
        raise CheckpointError(f"{where}: 'total_j' missing or not a number")
    if record.get("label") not in LABELS:
        raise CheckpointError(f"{where}: 'label' is {record.get('label')!r}, expected one of {', '.join(LABELS)}")
    joules = record.get("joules", {})
    if not isinstance(joules, dict) or not all(_number(v) for v in joules.values()):
        raise CheckpointError(f"{where}: 'joules' must map phases to numbers")
    return record


def log_path_for(run_or_state_dir: Path) -> Path:
    """``DIR/energy.jsonl`` for a directory; a file path is taken as the log itself."""
    path = Path(run_or_state_dir)
    return path / LOG_NAME if path.is_dir() else path


def load_energy_log(run_or_state_dir: Path) -> EnergyLog:
    """Read and check every record of a run's or daemon's energy log.

    A last line cut short without a newline (a process killed while writing) is skipped with a
    note; any other unreadable line is an error naming its line number.

    Raises:
        CheckpointError: the log is missing, empty or corrupt.
    """
    if not Path(run_or_state_dir).exists():
        raise CheckpointError(
            f"{run_or_state_dir} does not exist (expected a run or state directory holding {LOG_NAME})"
        )
    path = log_path_for(run_or_state_dir)
    if not path.is_file():
        raise CheckpointError(
            f"no energy log at {path} (expected the {LOG_NAME} that `edge-node simulate` or the daemon writes)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read energy log {path}: {exc}") from exc
    lines = text.split("\n")
    records, notes = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # no newline after it: cut short by a kill
                notes.append(f"line {number} is incomplete (process stopped while writing) and was skipped")
                continue
            raise CheckpointError(f"energy log {path} line {number} is not JSON: {exc.msg}") from exc
        records.append(_check_record(record, f"energy log {path} line {number}"))
    if not records:
        raise CheckpointError(f"energy log {path} has no records (no round finished yet)")
    return EnergyLog(path, records, notes)


def _modelled_j(record: dict[str, Any]) -> float | None:
    """The modelled joules attached to a measured/estimated record, if any.

    Accepts ``modelled`` (a ``ModelledEnergy.to_dict()`` or a number) or ``modelled_j`` (a number).
    """
    value = record.get("modelled", record.get("modelled_j"))
    if isinstance(value, dict):
        value = value.get("total_j")
    return float(value) if _number(value) else None


def summarize(log: EnergyLog) -> dict[str, Any]:
    """Per-round rows and per-label totals (JSON-ready); measured and estimated never summed."""
    rows: list[dict[str, Any]] = []
    totals: dict[str, dict[str, Any]] = {}
    modelled_total, modelled_rounds = 0.0, 0
    for record in log.records:
        label = record["label"]
        if label == MODELLED:
            modelled_total += record["total_j"]
            modelled_rounds += 1
            continue
        joules = {p: float(record.get("joules", {}).get(p, 0.0)) for p in PHASES}
        duration = record.get("duration_s")
        duration = float(duration) if _number(duration) else None
        modelled = _modelled_j(record)
        if modelled is not None:
            modelled_total += modelled
            modelled_rounds += 1
        rows.append(
            {
                "round": record["round"],
                "label": label,
                "source": record.get("source", "?"),
                "total_j": float(record["total_j"]),
                "joules": joules,
                "duration_s": duration,
                "mean_power_w": record["total_j"] / duration if duration else None,
                "samples": record.get("samples"),
                "modelled_j": modelled,
            }
        )
        total = totals.setdefault(
            label,
            {"rounds": 0, "total_j": 0.0, "joules": dict.fromkeys(PHASES, 0.0), "duration_s": 0.0, "sources": []},
        )
        total["rounds"] += 1
        total["total_j"] += float(record["total_j"])
        for phase in PHASES:
            total["joules"][phase] += joules[phase]
        total["duration_s"] += duration or 0.0
        if record.get("source", "?") not in total["sources"]:
            total["sources"].append(record.get("source", "?"))
    details = sorted({str(r.get("detail")) for r in log.records if r.get("detail") and r["label"] != MODELLED})
    for total in totals.values():
        total["mean_power_w"] = total["total_j"] / total["duration_s"] if total["duration_s"] > 0 else None
    return {
        "path": str(log.path),
        "records": len(log.records),
        "rows": rows,
        "totals": totals,
        "details": details,
        "measured": bool(rows) and all(r["label"] == "measured" for r in rows),
        "estimated": any(r["label"] == "estimated" for r in rows),
        "modelled": {"rounds": modelled_rounds, "total_j": modelled_total, "label": MODELLED}
        if modelled_rounds
        else None,
        "notes": list(log.notes),
    }


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def headline(summary: dict[str, Any]) -> list[str]:
    """The lines that say what kind of joules these are (first thing a reader sees)."""
    lines = []
    if summary["estimated"]:
        lines.append(
            "NO energy measurement was available: joules labelled 'estimated' are process CPU time x "
            "a per-core power guess, NOT measured."
        )
    if summary["totals"] and not summary["measured"] and not summary["estimated"]:
        lines.append("No measured rounds in this log.")
    if len(summary["totals"]) > 1:
        lines.append("This log mixes measured and estimated rounds; their totals are shown separately.")
    if summary["modelled"] is not None:
        lines.append("'modelled' joules are a DA-DPFL-style model (FLOPs and bytes x device constants), not measured.")
    return lines


def format_summary(summary: dict[str, Any]) -> str:
    """The ``edge-node energy`` table: J per round and phase, mean power, source, label."""
    out = [f"energy log {summary['path']}: {summary['records']} record(s)"]
    out += ["", *headline(summary)] if headline(summary) else []
    for detail in summary["details"]:
        out.append(f"meter: {detail}")
    show_modelled = any(r["modelled_j"] is not None for r in summary["rows"])
    header = ["round", "label", "source", "total J", *[f"{p} J" for p in PHASES], "time s", "mean W", "samples"]
    if show_modelled:
        header.append("modelled J")
    table = [header]
    for row in summary["rows"]:
        cells = [
            str(row["round"] + 1),  # people count rounds from 1; the record keeps the 0-based index
            row["label"],
            str(row["source"]),
            _fmt(row["total_j"]),
            *[_fmt(row["joules"][p]) for p in PHASES],
            _fmt(row["duration_s"], 2),
            _fmt(row["mean_power_w"], 2),
            "-" if row["samples"] is None else str(row["samples"]),
        ]
        if show_modelled:
            cells.append(_fmt(row["modelled_j"]))
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    out.append("")
    for cells in table:
        out.append(
            "  ".join(c.rjust(w) if i >= 3 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        )
    out.append("")
    for label, total in summary["totals"].items():
        phases = ", ".join(f"{p} {_fmt(total['joules'][p])} J" for p in PHASES)
        out.append(
            f"total {label.upper()} ({', '.join(total['sources'])}): {_fmt(total['total_j'])} J over "
            f"{total['rounds']} round(s), {_fmt(total['duration_s'])} s, mean {_fmt(total['mean_power_w'], 2)} W"
        )
        out.append(f"  per phase: {phases}")
    if summary["modelled"] is not None:
        out.append(
            f"total MODELLED (not measured): {_fmt(summary['modelled']['total_j'], 3)} J over "
            f"{summary['modelled']['rounds']} round(s)"
        )
    for note in summary["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out)


def plot_energy(summary: dict[str, Any], out_png: Path) -> Path:
    """Stacked bars of joules per phase per round (estimated rounds hatched), modelled as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = summary["rows"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        xs = [r["round"] + 1 for r in rows]
        bottom = [0.0] * len(rows)
        hatches = ["//" if r["label"] == "estimated" else "" for r in rows]
        for phase in PHASES:
            heights = [r["joules"][phase] for r in rows]
            bars = ax.bar(xs, heights, bottom=bottom, label=f"{phase}")
            for bar, hatch in zip(bars, hatches, strict=True):
                bar.set_hatch(hatch)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        modelled = [(r["round"] + 1, r["modelled_j"]) for r in rows if r["modelled_j"] is not None]
        if modelled:
            ax.plot(*zip(*modelled, strict=True), "k.--", label="modelled (not measured)")
        if summary["estimated"]:
            title = "ESTIMATED energy per round (no meter: CPU time x W/core; hatched)"
        else:
            sources = sorted({str(r["source"]) for r in rows})
            title = f"Measured energy per round ({', '.join(sources) or 'no rounds'})"
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("energy (J)")
        ax.legend(fontsize="small")
        out_png = Path(out_png)
        out_png.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(out_png, dpi=100)
    finally:
        plt.close(fig)
    return out_png
