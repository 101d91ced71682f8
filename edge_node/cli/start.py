"""``edge-node start``: run this device's node until stopped (or for ``--rounds``)."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import click

from edge_node.cli._app import app
from edge_node.cli._node_options import load_node_config, node_options

_LOGGER = logging.getLogger(__name__)


LOG_FORMATS = ("text", "json")
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"  # renamed below to time, level, logger, message


def _formatter(log_format: str) -> logging.Formatter:
    """Text lines (no own timestamps under journald, ``JOURNAL_STREAM``), or one JSON object per line."""
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        return JsonFormatter(
            JSON_FIELDS, rename_fields={"asctime": "time", "levelname": "level", "name": "logger"}, timestamp=False
        )
    if os.environ.get("JOURNAL_STREAM"):
        return logging.Formatter("%(levelname)s %(name)s: %(message)s")
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def configure_daemon_logging(level: int, log_format: str = "text") -> None:
    """Lines to stderr at ``level`` (or lower if -v asked), as text or JSON (``--log-format``, for log shippers)."""
    root = logging.getLogger()
    if root.level > level or root.level == logging.NOTSET:
        root.setLevel(level)
    handlers = root.handlers or [logging.StreamHandler(sys.stderr)]
    for handler in handlers:
        handler.setFormatter(_formatter(log_format))
    if not root.handlers:
        root.addHandler(handlers[0])


@app.command(context_settings={"max_content_width": 120})
@click.option("--print-config", is_flag=True, help="Print the effective config (TOML) and exit.")
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="Log lines as text, or one JSON object per line (time, level, logger, message) for log shippers.",
)
@node_options
def start(print_config: bool, log_format: str, config_file: Path | None, **flags: Any) -> None:
    """Run this device's DisPFL node: discover peers, pull their models, train, publish, log.

    Every setting is a key of the TOML config file (--config) and a flag; flags win. Logs go to stderr
    (one line per round), per-round records to STATE_DIR/rounds.jsonl, energy to STATE_DIR/energy.jsonl.
    SIGTERM or Ctrl-C stops it within 5 s, also during start-up (the round in progress is dropped;
    exit 0); a second one only skips the grace for transfers in flight.
    """
    from edge_node.node.memory import configure_allocator

    configure_allocator()  # before the node starts any thread (edge_node/node/memory.py says why)
    config = load_node_config(config_file, flags)
    if print_config:
        from edge_node.node.config import node_id_from_hostname
        from edge_node.tomlconf import to_toml

        resolved = dataclasses.replace(config, node_id=config.node_id or node_id_from_hostname())
        config.check_runnable()
        click.echo(to_toml(resolved, header="# effective edge-node config (defaults < file < flags)"), nl=False)
        return
    from edge_node.api import run_node
    from edge_node.node.daemon import Node, Stopped

    configure_daemon_logging(logging.WARNING, log_format)  # start-up failures are one line (exit 2, 3 or 4)

    def install_signals(node: Node) -> None:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if node.should_exit.is_set():
                _LOGGER.warning("second %s: stopping without waiting for transfers in flight", name)
                node.handle_exit()  # never raises: shutdown (mDNS goodbye, lock release) must run to its end
                return
            _LOGGER.info("%s: stopping", name)
            if node.handle_exit():
                raise Stopped  # in a compute-only section: do not wait for the step to end

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)

    def serving(node: Node) -> None:
        configure_daemon_logging(logging.INFO, log_format)  # serving: one line per round from here
        _LOGGER.info("%s", node.describe())

    poisoning = click.get_current_context().find_root().obj  # only edge_node.cli._attacker sets it
    try:
        run_node(config, before_start=install_signals, serving=serving, poisoning=poisoning)
    finally:
        # Stopped and cleaned up: a signal while the interpreter winds down (it resets Python handlers to
        # the default there, not ignored ones) must not turn a clean stop into a death by signal.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
