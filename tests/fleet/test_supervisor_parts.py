"""The supervisor's parts without a fleet (quick): following a restarted daemon's rounds log, status queries
that cannot stall a poll, how an exit is named, the summary (JSON, Markdown, plot) and the live table."""

from __future__ import annotations

import io
import json
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import matplotlib.image
from rich.console import Console

from edge_node.fleet import supervise
from edge_node.fleet.config import FleetConfig
from edge_node.fleet.daemons import ROUNDS_LOG, DaemonProcess, exit_description
from edge_node.fleet.fleet import Fleet
from edge_node.fleet.progress import LiveTable, NodeView
from edge_node.fleet.summary import SUMMARY_PLOT, format_markdown, summarize, write_summary
from edge_node.storage import append_line, truncate_jsonl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _daemon(tmp_path: Path) -> DaemonProcess:
    state = tmp_path / "node0"
    state.mkdir()
    return DaemonProcess(node_id="node0", state_dir=state, argv=["true"], log_path=tmp_path / "node0.log")


def _append(state_dir: Path, t: int, run: int) -> None:
    append_line(state_dir / ROUNDS_LOG, json.dumps({"round": t, "run": run, "pad": "x" * (40 + 7 * t)}))


def test_a_rounds_log_replaced_by_a_resume_is_read_again_even_when_it_grew_past_the_last_offset(tmp_path):
    daemon = _daemon(tmp_path)
    for t in range(3):
        _append(daemon.state_dir, t, run=1)
    assert [r["round"] for r in daemon.read_new_records()] == [0, 1, 2]
    # The daemon is killed and restarted: it keeps round 0 (its checkpoint's), replaces the log, and
    # runs rounds 1..3 again before the supervisor looks: the file is now longer than what was read.
    size_read = (daemon.state_dir / ROUNDS_LOG).stat().st_size
    truncate_jsonl(daemon.state_dir / ROUNDS_LOG, 1)
    for t in range(1, 4):
        _append(daemon.state_dir, t, run=2)
    assert (daemon.state_dir / ROUNDS_LOG).stat().st_size > size_read
    new = daemon.read_new_records()
    assert [(r["round"], r["run"]) for r in new] == [(0, 1), (1, 2), (2, 2), (3, 2)]
    assert [(r["round"], r["run"]) for r in daemon.records] == [(0, 1), (1, 2), (2, 2), (3, 2)]
    _append(daemon.state_dir, 4, run=2)  # and it is followed from there on
    assert [r["round"] for r in daemon.read_new_records()] == [4]
    assert daemon.read_new_records() == []


def test_a_rounds_log_cut_shorter_is_read_again(tmp_path):
    daemon = _daemon(tmp_path)
    for t in range(3):
        _append(daemon.state_dir, t, run=1)
    daemon.read_new_records()
    truncate_jsonl(daemon.state_dir / ROUNDS_LOG, 1)
    assert [(r["round"], r["run"]) for r in daemon.read_new_records()] == [(0, 1)]
    assert [r["round"] for r in daemon.records] == [0]


class _Running:
    """A stand-in for a running daemon whose status query the test controls."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.state_dir = Path(node_id)
        self.running = True


def test_status_queries_run_at_once_and_a_slow_node_does_not_hold_the_poll(monkeypatch):
    answer_s, hung = 0.4, threading.Event()
    calls: dict[str, int] = {}

    def phase(state_dir: Path) -> str | None:
        calls[str(state_dir)] = calls.get(str(state_dir), 0) + 1
        if str(state_dir) == "node15":
            hung.wait(10)  # never answers while the test polls
            return "train"
        time.sleep(answer_s)
        return "communicate"

    monkeypatch.setattr(supervise, "_phase", phase)
    daemons: list[Any] = [_Running(f"node{i}") for i in range(16)]
    views = {d.node_id: NodeView(d.node_id, 5) for d in daemons}
    watcher = supervise.PhaseWatcher(wait_s=1.0)
    try:
        started = time.monotonic()
        watcher.update(daemons, views)
        first_s = time.monotonic() - started
        # 15 answers of 0.4 s each and a hung one, in one poll bounded by 1 s (one after the other: 6 s and
        # more, and for ever); the margin is for a busy machine
        assert first_s < 3.0, first_s
        assert all(views[f"node{i}"].phase == "communicate" for i in range(15))
        assert views["node15"].phase == "starting"
        daemons[0].running = False  # exited meanwhile: its next answer is not asked for
        started = time.monotonic()
        watcher.update(daemons, views)
        assert time.monotonic() - started < 3.0
        assert calls["node15"] == 1 and calls["node0"] == 1 and calls["node1"] == 2  # a hung node is not asked again
    finally:
        hung.set()
        watcher.close(wait=True)  # no thread outlives the test


def test_an_exit_is_named_the_same_way_everywhere():
    assert exit_description(2) == "exited with code 2" and exit_description(2, short=True) == "exit 2"
    assert exit_description(-signal.SIGKILL) == "killed by signal 9 (SIGKILL)"
    assert exit_description(-signal.SIGKILL, short=True) == "SIGKILL"
    assert exit_description(-200) == "killed by signal 200"


def _record(t: int, *, acc: float, bytes_in: int, bytes_out: int, joules: float, label: str,
            refusals: dict[str, int] | None = None, answered: tuple[str, ...] = (),
            retries: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"round": t, "acc_before": acc - 0.1, "acc_after": acc, "bytes_in": bytes_in, "bytes_out": bytes_out,
            "energy_total_j": joules, "energy_label": label, "refusals": refusals or {},
            "pull_retries": retries or {}, "peers_answered": list(answered)}  # fmt: skip


def test_summary_names_the_busiest_node_energy_with_its_label_and_refusal_totals(tmp_path):
    per_node = {
        "node0": [
            _record(0, acc=0.2, bytes_in=1_000_000, bytes_out=1_500_000, joules=1.25, label="estimated",
                    refusals={"decode": 1}, answered=("node1",), retries={"unreachable": 2}),
            _record(1, acc=0.4, bytes_in=1_000_000, bytes_out=500_000, joules=1.5, label="estimated",
                    answered=("node1",)),
        ],
        "node1": [
            _record(0, acc=0.3, bytes_in=3_000_000, bytes_out=2_000_000, joules=2.0, label="estimated",
                    refusals={"decode": 1, "timeout": 2}, answered=("node0",)),
            {"round": 1, "diverged": True, "refusals": {"tls": 1},  # refusals and retries count; its energy does not
             "pull_retries": {"timeout": 1, "unreachable": 1}},
            _record(1, acc=0.5, bytes_in=1_000_000, bytes_out=0, joules=3.0, label="measured", answered=("node0",)),
        ],
    }  # fmt: skip
    fleet = {"nodes": 2, "model": "cnn", "dataset": "demo", "partition": "dir:0.3", "wall_s": 12.0, "outcome": "done"}
    summary = summarize(fleet, per_node, {"node0": 0, "node1": -signal.SIGKILL}, {"node0": 1, "node1": 2})
    assert summary["busiest_node"] == {"node_id": "node1", "bytes": 6_000_000}
    nodes = {n["node_id"]: n for n in summary["nodes"]}
    assert (nodes["node0"]["energy_j"], nodes["node0"]["energy_label"]) == (2.75, "estimated")
    assert (nodes["node1"]["energy_j"], nodes["node1"]["energy_label"]) == (5.0, "estimated+measured")
    assert nodes["node1"]["peers_refused"] == {"decode": 1, "timeout": 2, "tls": 1}
    assert summary["peers_refused_total"] == {"decode": 2, "timeout": 2, "tls": 1}
    assert (nodes["node0"]["pull_retries"], nodes["node1"]["pull_retries"]) == (
        {"unreachable": 2},
        {"timeout": 1, "unreachable": 1},
    )
    assert summary["pull_retries_total"] == {"timeout": 1, "unreachable": 3}
    assert (nodes["node1"]["rounds"], nodes["node1"]["restarts"], nodes["node1"]["exit_code"]) == (2, 1, -9)
    markdown = format_markdown(summary)
    assert "| node0 | 2 | 20.0% -> 40.0% | 2.00 | 2.00 | node1 | decode 1 | 2.8 (estimated) |" in markdown
    assert "| node1 (restarted 1x, SIGKILL) | 2 | 30.0% -> 50.0% | 4.00 | 2.00 | node0 | decode 1, timeout 2, tls 1 |"\
        " 5.0 (estimated+measured) |" in markdown  # fmt: skip
    assert "Busiest node: node1, 6.00 MB received + sent." in markdown
    assert "Pull calls retried after a transient failure, by kind: timeout 1, unreachable 3." in markdown
    files = write_summary(tmp_path, summary, per_node)
    assert [p.name for p in files] == ["fleet-summary.json", "fleet-summary.md", SUMMARY_PLOT]
    assert json.loads(files[0].read_text()) == summary and files[1].read_text() == markdown
    plot = tmp_path / SUMMARY_PLOT
    assert plot.read_bytes()[:8] == PNG_MAGIC
    height, width, _ = matplotlib.image.imread(plot).shape
    assert (width, height) == (1100, 400)  # 11 x 4 inches at 100 dpi: both panels drawn


_TOKENS = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z]|\n|\r)")


def _screen(output: str) -> list[str]:
    """What a terminal shows after ``output``: newlines, carriage returns, cursor up (ESC[nA) and erase
    line (ESC[2K) applied, other escapes (cursor visibility) ignored."""
    lines, row, col = [""], 0, 0
    for token in _TOKENS.split(output):
        if token == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif token == "\r":
            col = 0
        elif token.startswith("\x1b["):
            if token.endswith("A"):
                row = max(0, row - int(token[2:-1] or 1))
            elif token == "\x1b[2K":
                lines[row] = ""
        elif token:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token) :]
            col += len(token)
    return [line.rstrip() for line in lines if line.strip()]


def test_live_table_shows_round_phase_and_accuracy_per_node_within_80_columns():
    console = Console(file=io.StringIO(), force_terminal=True, width=80, color_system=None)
    table = LiveTable(console.file, console=console)
    views = [NodeView(f"node{i}", 100) for i in range(12)]
    table.refresh(views, "loopback fleet demo")
    views[0].add_record({"round": 41, "acc_before": 0.41, "acc_after": 0.555, "peers_answered": ["node1", "node2"],
                         "refusals": {"decode": 1}, "bytes_in": 1_234_500_000, "bytes_out": 300_000_000})  # fmt: skip
    views[0].phase, views[0].state = "train", "running"
    views[1].phase, views[1].state = "communicate", "running"
    views[11].phase, views[11].state = "stopped", exit_description(-signal.SIGKILL, short=True)
    table.event("node11: killed by signal 9 (SIGKILL); stopping the fleet")
    table.refresh(views, "loopback fleet demo")
    table.close()
    screen = _screen(console.file.getvalue())
    assert max(len(line) for line in screen) <= 80, screen
    text = "\n".join(screen)
    assert "…" not in text, text  # nothing cut off
    assert screen[0] == "node11: killed by signal 9 (SIGKILL); stopping the fleet", text  # events scroll above
    assert re.fullmatch(r"loopback fleet demo +\[\d+ s\]", screen[1]), text
    assert re.fullmatch(r"node +round +phase +before +after +peers +refused +MB in +MB out +state", screen[2]), text
    assert len(screen) == 4 + len(views), text  # one table: the first frame was redrawn in place
    assert re.fullmatch(r"node0 +42/100 +train +41\.0% +55\.5% +2 +1 +1234\.5 +300\.0 +running", screen[4]), text
    assert re.fullmatch(r"node1 +0/100 +communicate +- +- +0 +0 +0\.0 +0\.0 +running", screen[5]), text
    assert re.fullmatch(r"node11 +0/100 +stopped +- +- +0 +0 +0\.0 +0\.0 +SIGKILL", screen[-1]), text


def test_a_loopback_fleet_scales_the_per_host_caps_its_own_peers_share(tmp_path):
    """Every peer of a fleet on 127.0.0.1 is one host to the server's guard; a 40-node fleet must fit."""
    big = Fleet(FleetConfig(output=tmp_path / "big", nodes=40))
    big.endpoints = [("127.0.0.1", 20000 + i) for i in range(40)]
    flags = big.node_flags(0)
    assert flags[flags.index("--server-max-calls-per-host") + 1] == "64"  # 2 per peer, at most the 64 in all
    assert flags[flags.index("--server-max-connections-per-host") + 1] == "160"
    small = Fleet(FleetConfig(output=tmp_path / "small", nodes=3))
    small.endpoints = [("127.0.0.1", 20000 + i) for i in range(3)]
    flags = small.node_flags(0)  # the defaults hold for a small fleet
    assert flags[flags.index("--server-max-calls-per-host") + 1] == "8"
    assert flags[flags.index("--server-max-connections-per-host") + 1] == "32"
