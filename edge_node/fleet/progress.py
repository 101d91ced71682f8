"""Live progress of a loopback fleet: a table that redraws in a terminal, plain lines in a pipe.

The table (``rich``) shows per node its round, phase (from the daemon's status socket), last accuracy
before and after local training, peers answered, bytes and state. In a pipe or a log, one line per
node round, one per completed fleet round (the mean accuracy), and one per start, exit or restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from edge_node.task_names import format_metric, format_record_metric, metric_label

if TYPE_CHECKING:
    from rich.console import Console


@dataclass
class NodeView:
    """What the display knows about one node."""

    node_id: str
    rounds_total: int
    rounds_done: int = 0
    phase: str = "starting"
    acc_before: float | None = None
    acc_after: float | None = None
    metric_is_fraction: bool = True  # the task's headline metric is shown as a percentage (accuracy, F1)
    peers_answered: list[str] = field(default_factory=list)
    refused: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    state: str = "starting"  # starting, running, done, exit N, SIGNAME (daemons.exit_description)

    def add_record(self, record: dict[str, Any]) -> None:
        if record.get("diverged"):
            return
        self.rounds_done = int(record["round"]) + 1
        self.acc_before, self.acc_after = record.get("acc_before"), record.get("acc_after")
        self.metric_is_fraction = bool(record.get("metric_is_fraction", True))
        self.peers_answered = list(record.get("peers_answered", []))
        self.refused += sum(int(v) for v in (record.get("refusals") or {}).values())
        self.bytes_in += int(record.get("bytes_in", 0))
        self.bytes_out += int(record.get("bytes_out", 0))


def _pct(value: float | None, fraction: bool = True) -> str:
    return "-" if value is None else format_metric(value, fraction=fraction)


def round_line(node: NodeView, record: dict[str, Any]) -> str:
    """One node's completed round as a plain line."""
    total = f"/{node.rounds_total}" if node.rounds_total else ""
    if record.get("diverged"):
        return f"{node.node_id} round {record['round'] + 1}{total}: DIVERGED ({record.get('reason')}), rolled back"
    refusals = record.get("refusals") or {}
    refused = f", refused {', '.join(f'{k} {v}' for k, v in refusals.items())}" if refusals else ""
    seconds = sum((record.get("seconds") or {}).values())
    return (
        f"{node.node_id} round {record['round'] + 1}{total}: {metric_label(record)} "
        f"{format_record_metric(record, 'acc_before')} -> {format_record_metric(record, 'acc_after')}, "
        f"peers {','.join(record.get('peers_answered', [])) or 'none'}{refused}, "
        f"in {record.get('bytes_in', 0) / 1e6:.2f} MB, out {record.get('bytes_out', 0) / 1e6:.2f} MB, {seconds:.1f} s"
    )


class LineProgress:
    """Plain lines, written through ``write`` (the command's echo)."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write

    def event(self, line: str) -> None:
        self.write(line)

    def record(self, node: NodeView, record: dict[str, Any]) -> None:
        self.write(round_line(node, record))

    def refresh(self, nodes: list[NodeView], title: str) -> None:
        """Nothing to redraw in a pipe."""

    def close(self) -> None:
        """Nothing to tear down."""


class LiveTable:
    """A table redrawn in place (``rich.live``); events scroll above it."""

    def __init__(self, stream: IO[str], console: Console | None = None) -> None:
        """Draw on ``stream``, or through ``console`` when given (tests pass one with a fixed width)."""
        from rich.console import Console
        from rich.live import Live

        self.console = console if console is not None else Console(file=stream)
        self._live = Live(console=self.console, auto_refresh=False, transient=False)
        self._live.start()
        self._started = time.monotonic()

    def event(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False)

    def record(self, node: NodeView, record: dict[str, Any]) -> None:
        """Rounds show in the table; only divergences are worth a line of their own."""
        if record.get("diverged"):
            self.event(round_line(node, record))

    def refresh(self, nodes: list[NodeView], title: str) -> None:
        from rich import box
        from rich.table import Table

        table = Table(title=f"{title}  [{time.monotonic() - self._started:.0f} s]", title_justify="left",
                      box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 0))  # fmt: skip
        for name, justify in (("node", "left"), ("round", "right"), ("phase", "left"), ("before", "right"),
                              ("after", "right"), ("peers", "right"), ("refused", "right"), ("MB in", "right"),
                              ("MB out", "right"), ("state", "left")):  # fmt: skip
            table.add_column(name, justify=justify, no_wrap=True, min_width=len(name))  # type: ignore[arg-type]
        for n in nodes:
            total = f"/{n.rounds_total}" if n.rounds_total else ""
            table.add_row(
                n.node_id, f"{n.rounds_done}{total}", n.phase, _pct(n.acc_before, n.metric_is_fraction),
                _pct(n.acc_after, n.metric_is_fraction),
                str(len(n.peers_answered)), str(n.refused), f"{n.bytes_in / 1e6:.1f}", f"{n.bytes_out / 1e6:.1f}",
                n.state,
            )  # fmt: skip
        self._live.update(table, refresh=True)

    def close(self) -> None:
        self._live.stop()
