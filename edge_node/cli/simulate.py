"""``edge-node simulate``: N clients of DisPFL or one of the paper's baselines in one process."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import click

from edge_node.api import read_records, run_simulation
from edge_node.cli._app import app, complete_model, verbose_option
from edge_node.cli._config_options import config_options, given_flags
from edge_node.data import PARTITION_NAMES
from edge_node.defaults import preset_note
from edge_node.errors import ConfigError
from edge_node.sim.config import COMMAND, DERIVED_KEYS, SimConfig, saved_settings
from edge_node.sim.report import SUMMARY_FILE, format_summary, plot_run
from edge_node.sim.runner import progress_bars_shown
from edge_node.sim.shard import is_writer
from edge_node.task_names import format_record_metric, metric_label
from edge_node.tomlconf import build, merge, read_toml, to_toml

_LOGGER = logging.getLogger(__name__)
MAX_JSON_CONFIG_BYTES = 1 << 20
PIPE_PROGRESS_S = 15.0  # without bars, a line this often within a round


def _complete_partition(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    forms = [f"{p}:{'0.3' if p.startswith('dir') else '2'}" for p in PARTITION_NAMES]
    return [f for f in forms if f.startswith(incomplete)]


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings of a TOML file, or of a run's ``config.json`` (in today's terms, ``saved_settings``; its
    derived keys dropped)."""
    if path.suffix.lower() != ".json":
        return read_toml(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_JSON_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is {len(data)} bytes; at most {MAX_JSON_CONFIG_BYTES} are read")
    try:
        values = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must hold a JSON object of settings")
    today = saved_settings(values)
    if today.get("partition") != values.get("partition"):
        click.echo(
            f"edge-node: warning: {path} predates partition variants: its {values['partition']} was the balanced "
            f"procedure, read as {today['partition']}",
            err=True,
        )
    return {k: v for k, v in today.items() if k not in DERIVED_KEYS}


CONFIG_HELP = "Settings from a TOML file (keys as the flags, with _ for -) or a run's config.json; flags override it."
_CONFIG = click.option(
    "--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None, help=CONFIG_HELP
)


@app.command()
@config_options(SimConfig, _CONFIG, complete={"model": complete_model, "partition": _complete_partition})
@click.option("--download", is_flag=True, help="Download CIFAR python batches (checksummed) when absent.")
@click.option("--fresh", is_flag=True, help="Discard a previous run in --output instead of resuming it.")
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None, help="Decoded data-set cache.")
@click.option("--print-config", is_flag=True, help="Print the settings as TOML (a --config file) and exit.")
@verbose_option
def simulate(
    config_file: Path | None,
    download: bool,
    fresh: bool,
    cache_dir: Path | None,
    print_config: bool,
    **flags: Any,
) -> None:
    """Simulate N clients of DisPFL or another method (FedSpa, FedP3, a baseline): the paper's figures.

    Writes per-round JSONL (accuracy, bytes per node, busiest node, paper-convention MB, FLOPs, wall time),
    energy.jsonl, summary.json and PNG plots to the run directory; a run resumes from its last completed
    round. Its config.json reproduces it: --config RUN/config.json --output OTHER.
    """
    file_values = read_config_file(config_file) if config_file is not None else {}
    given = given_flags(flags)
    values = merge(file_values, given)
    # What the user chose: flags and a TOML file's keys; a run's config.json records every setting.
    chosen = given if config_file is not None and config_file.suffix.lower() == ".json" else values
    if values.get("setting") == "ii" and chosen.get("density") is not None and values.get("tier_mode") != "both":
        raise ConfigError("--density and --setting ii exclude each other (setting ii uses tiers 0.2..1.0; with "
                          "--tier-mode both, --density is the mask's inside each tier's narrow model)")  # fmt: skip
    config = build(SimConfig, values, str(config_file) if config_file else "the command line")
    for warning in config.ignored(set(chosen)):
        click.echo(f"edge-node: warning: {warning}", err=True)
    if print_config:
        click.echo(to_toml(config, header=preset_note(COMMAND, config.dataset, values)), nl=False)
        return

    def started(effective: SimConfig, notes: list[str]) -> None:
        for note in notes:
            click.echo(f"edge-node: warning: {effective.run_dir}: {note}", err=True)
        click.echo(
            f"simulating {effective.method}: {effective.clients} clients of {effective.model} on {effective.dataset} "
            f"({effective.partition}, {effective.partition_variant} partition) for {effective.rounds} rounds -> "
            f"{effective.run_dir.resolve()}",
            err=True,
        )

    # Without bars (a pipe, a service, --no-progress): one line per round, unless -v logs them already.
    lines = not progress_bars_shown(config) and not _LOGGER.isEnabledFor(logging.INFO)
    run_dir = run_simulation(
        config, fresh=fresh, cache_dir=cache_dir, download=download, on_round=_round_line(config) if lines else None,
        on_start=started, on_client=_client_lines(config) if lines else None,
    )  # fmt: skip
    if not is_writer():
        return  # one of torchrun's processes: process 0 reports
    records = read_records(run_dir)
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    plots = plot_run(records, run_dir)
    click.echo(format_summary(summary))
    click.echo(f"\nrun directory: {run_dir.resolve()}")
    for path in plots:
        click.echo(f"plot: {path.resolve()}")


def _client_lines(config: SimConfig, every_s: float = PIPE_PROGRESS_S) -> Any:
    """Within a long round, without bars: a line every ``every_s`` seconds (a pipe or a journal is not silent)."""
    from edge_node.node.status import round_label

    started = {"round": -1, "at": 0.0, "said": 0.0}

    def line(t: int, done: int, total: int) -> None:
        now = time.monotonic()
        if t != started["round"]:
            started.update({"round": t, "at": now, "said": now})
        if now - started["said"] >= every_s and done < total:
            started["said"] = now
            click.echo(
                f"{round_label(t, config.rounds)}: {done} of {total} clients, {now - started['at']:.0f} s", err=True
            )

    return line


def _round_line(config: SimConfig) -> Any:
    def line(record: dict[str, Any]) -> None:
        click.echo(
            f"round {record['round'] + 1}/{config.rounds}: {metric_label(record)} "
            f"{format_record_metric(record, 'acc_mean', digits=2)} "
            f"({record['acc_mean_is']}), busiest node {record['busiest_node']} "
            f"{record['busiest_node_bytes'] / 1e6:.2f} MB, {record['wall_s']:.1f} s",
            err=True,
        )

    return line
