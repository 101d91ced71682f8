"""``edge-node start --log-format``: JSON lines for log shippers; journald's text lines unchanged by default."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from edge_node.exit_codes import ExitCode
from tests.daemons import run_cli

_LOG_ONE_LINE = (
    "import logging, sys\n"
    "from edge_node.cli.start import configure_daemon_logging\n"
    "configure_daemon_logging(logging.INFO, sys.argv[1])\n"
    "logging.getLogger('edge_node.node.daemon').info('round %d: %s', 3, 'accuracy 50.0%')\n"
)


def _log_line(log_format: str, **env: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _LOG_ONE_LINE, log_format], capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"} | env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stderr.strip()


def test_json_lines_carry_time_level_logger_and_the_message():
    record = json.loads(_log_line("json"))
    assert record["level"] == "INFO" and record["logger"] == "edge_node.node.daemon"
    assert record["message"] == "round 3: accuracy 50.0%" and record["time"][:2] == "20"


def test_text_lines_are_unchanged_under_journald_and_on_a_terminal():
    assert _log_line("text", JOURNAL_STREAM="8:1") == "INFO edge_node.node.daemon: round 3: accuracy 50.0%"
    assert _log_line("text").endswith(" INFO edge_node.node.daemon: round 3: accuracy 50.0%")


def test_an_unknown_log_format_is_one_line_and_exit_2():
    result = run_cli(["start", "--log-format", "xml", "--fleet", "f", "--insecure"])
    assert result.returncode == int(ExitCode.BAD_INPUT)
    assert result.stderr.strip().count("\n") == 0 and "--log-format" in result.stderr
