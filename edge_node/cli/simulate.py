"""``edge-node simulate``: N clients of DisPFL or one of the paper's baselines in one process."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import click

from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.algorithm.fedp3 import AGGREGATIONS, SCHEDULES
from edge_node.algorithm.masks import MASK_METHODS
from edge_node.algorithm.norm_stats import NORM_STATS
from edge_node.algorithm.prune_regrow import REGROW_RULES
from edge_node.algorithm.topology import TOPOLOGIES
from edge_node.api import read_records, run_simulation
from edge_node.cli._app import app, complete_model, verbose_option
from edge_node.data import DATASET_NAMES, PARTITION_NAMES
from edge_node.energy.detect import BACKENDS
from edge_node.errors import ConfigError
from edge_node.models import MODEL_NAMES
from edge_node.sim.config import (
    DERIVED_KEYS,
    DEVICES,
    METHODS,
    OUTPUT_PATTERN,
    SETTINGS,
    SimConfig,
    saved_settings,
)
from edge_node.sim.report import SUMMARY_FILE, format_summary, plot_run
from edge_node.sim.runner import progress_bars_shown
from edge_node.sim.shard import is_writer
from edge_node.task_names import format_record_metric, metric_label
from edge_node.tomlconf import build, merge, read_toml, to_toml

_LOGGER = logging.getLogger(__name__)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SimConfig)}
MAX_JSON_CONFIG_BYTES = 1 << 20
PIPE_PROGRESS_S = 15.0  # without bars, a line this often within a round


def _default(name: str) -> str:
    value = _DEFAULTS[name]
    return "none" if value is None else str(value)


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


def _choice(values: tuple[str, ...] | list[str]) -> click.Choice:
    return click.Choice(list(values), case_sensitive=False)


@app.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Settings from a TOML file (keys as the flags, with _ for -) or a run's config.json; flags override it.",
)
@click.option("--method", type=_choice(METHODS), help=f"Learning method [default: {_default('method')}].")
@click.option(
    "--dataset",
    help=f"Data set: {', '.join(DATASET_NAMES)} ('demo' is built in and needs no download), or a data factory "
    f"package.module:function [default: {_default('dataset')}].",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Data set location: python batches, an image-folder or Tiny-ImageNet tree, or a .tar.gz of one.",
)
@click.option("--download", is_flag=True, help="Download CIFAR python batches (checksummed) when absent.")
@click.option(
    "--model",
    shell_complete=complete_model,
    help=f"Model: {', '.join(MODEL_NAMES)}, an installed plug-in's name or a factory package.module:function "
    f"[default: {_default('model')}].",
)
@click.option(
    "--init-weights",
    type=click.Path(path_type=Path),
    default=None,
    help="Every client's start: a safetensors file or a weights-only state_dict (never a pickle); parameters it "
    "leaves out (a new head) come from --seed [default: none, all from --seed].",
)
@click.option(
    "--trainable",
    metavar="GLOB[,GLOB]",
    help="Train only the parameters matching these globs (layer4.*,linear.*); the rest stay frozen and are never "
    "sent (dispfl only) [default: all train].",
)
@click.option(
    "--task",
    help="What is learnt: classification, regression, multilabel or a factory package.module:function (its loss, "
    f"how a data factory's labels are read, the records' headline metric) [default: {_default('task')}].",
)
@click.option("--clients", type=int, help=f"Number of clients [default: {_default('clients')}; paper: 100].")
@click.option(
    "--neighbours",
    type=int,
    help=f"Peers each client pulls per round, random topology [default: {_default('neighbours')}; paper: 10].",
)
@click.option("--topology", type=_choice(TOPOLOGIES), help=f"Who pulls from whom [default: {_default('topology')}].")
@click.option("--max-in-degree", type=int, help="Cap pulls a node serves per round (paper: 10) [default: none].")
@click.option(
    "--rounds", type=int, help=f"Rounds to run; resume: run up to this [default: {_default('rounds')}; paper: 500]."
)
@click.option("--planned-rounds", type=int, help="T of the cosine prune schedule [default: --rounds].")
@click.option("--epochs", type=int, help=f"Local epochs per round [default: {_default('epochs')}].")
@click.option("--batch-size", type=int, help=f"[default: {_default('batch_size')}]")
@click.option(
    "--micro-batch",
    type=int,
    help="Send a batch through the model in slices of this many samples, summing their gradients (a device's "
    "memory; the same default as edge-node start); 0: the whole batch [default: "
    f"{DisPFLParams().micro_batch}; 0 with --cuda-graphs]. A BatchNorm model always trains whole batches (its "
    "statistics come from the batch, not from slices) and skips a last batch of one sample.",
)
@click.option("--lr", type=float, help=f"Initial learning rate, x0.998 per round [default: {_default('lr')}].")
@click.option(
    "--density",
    type=float,
    help="Model density in (0, 1] of the sparse methods (sub-fedavg: the density it prunes down to) "
    "[default: 0.5; the dense baselines use 1].",
)
@click.option(
    "--setting",
    type=_choice(SETTINGS),
    help="'ii': heterogeneous tiers 0.2..1.0, client i gets tier i mod 5 [default: i].",
)
@click.option(
    "--mask-init",
    type=_choice(MASK_METHODS),
    help=f"erk, uniform (random positions) or magnitude (the start's largest |w|, ERK's counts) "
    f"[default: {_default('mask_init')}]",
)
@click.option(
    "--regrow", type=_choice(REGROW_RULES), help="gradient (the paper) or random (reference code) [default: random]."
)
@click.option(
    "--partition",
    shell_complete=_complete_partition,
    help="dir:ALPHA, path:K (the reference code's procedure), dir-reuse:ALPHA, dir-balanced:ALPHA, "
    f"path-balanced:K (see docs) [default: {_default('partition')}].",
)
@click.option("--samples-per-client", type=int, help="Quota per client [default: training set size // clients].")
@click.option(
    "--fedavg-clients",
    type=int,
    help="fedavg, fedspa, ditto, sub-fedavg: clients a server trains per round "
    f"[default: {_default('fedavg_clients')}].",
)
@click.option(
    "--ditto-lambda",
    type=float,
    help=f"ditto: pull of the personal model towards the global one [default: {_default('ditto_lambda')}].",
)
@click.option(
    "--ditto-personal-share",
    type=float,
    help="ditto: share of a round's E epochs of steps that train the personal model, the rest the global one "
    f"[default: {_default('ditto_personal_share')}: 3 of 5 epochs].",
)
@click.option(
    "--subfedavg-prune-rate",
    type=float,
    help=f"sub-fedavg: fraction of active weights one prune removes [default: {_default('subfedavg_prune_rate')}].",
)
@click.option(
    "--subfedavg-dist-threshold",
    type=float,
    help="sub-fedavg: prune only when the first and last epochs' candidate masks differ by more than this "
    f"[default: {_default('subfedavg_dist_threshold')}].",
)
@click.option(
    "--subfedavg-acc-threshold",
    type=float,
    help="sub-fedavg: keep a prune only when the pruned model's accuracy is at least this "
    f"[default: {_default('subfedavg_acc_threshold')}].",
)
@click.option(
    "--target-density",
    type=float,
    help=f"dispfl-s2s: prune further down to this density [default: {_default('target_density')}].",
)
@click.option(
    "--s2s-stable-threshold",
    type=float,
    help="dispfl-s2s: a client votes stable when |D_t - D_t-1| / D_0 <= this "
    f"[default: {_default('s2s_stable_threshold')}].",
)
@click.option(
    "--fedp3-layers",
    type=_choice(SCHEDULES),
    help="fedp3: hidden layers each client owns: lowerb (1), opu2/opu3 (2/3 consecutive), opr2 (2 random a "
    f"round); all also train and upload the final layer [default: {_default('fedp3_layers')}].",
)
@click.option(
    "--fedp3-keep",
    type=float,
    help=f"fedp3: fraction of each non-owned weight tensor the server sends [default: {_default('fedp3_keep')}].",
)
@click.option(
    "--fedp3-aggregation",
    type=_choice(AGGREGATIONS),
    help=f"fedp3: per-layer mean, or weighted by layers owned [default: {_default('fedp3_aggregation')}].",
)
@click.option(
    "--privacy",
    type=_choice(("none", "ldp")),
    help="ldp: LDP-FedP3, every client trains with DP-SGD (per-sample clip + Gaussian noise) at the noise that "
    "spends --epsilon at --delta by the last round (fedp3 only) [default: none].",
)
@click.option("--epsilon", type=float, help="Privacy budget of the whole run, per client's data set.")
@click.option("--delta", type=float, help=f"Privacy delta [default: {_default('delta')}].")
@click.option("--dp-clip", type=float, help=f"DP-SGD per-sample gradient clip C [default: {_default('dp_clip')}].")
@click.option(
    "--screen/--no-screen",
    default=None,
    help="DisPFL: refuse a peer's model whose scale is far outside the client's own and its other peers' before "
    "aggregating, as a device does (edge_node/algorithm/robust.py) [default: screen].",
)
@click.option(
    "--norm-stats",
    type=_choice(NORM_STATS),
    help="A BatchNorm model's running statistics: local (FedBN: each client keeps its own, used in its evaluation, "
    "checkpointed, never sent nor averaged; dispfl, dispfl-s2s, local, dpsgd and dpsgd-ft) [default: local].",
)
@click.option("--seed", type=int, help=f"[default: {_default('seed')}]")
@click.option(
    "--cuda-graphs/--no-cuda-graphs",
    default=None,
    help="CUDA only: replay each full training batch's SGD step as one captured CUDA graph instead of hundreds of "
    "kernel launches (the same steps up to float rounding). Needs --device cuda and no --privacy, and sets "
    "--micro-batch 0 unless it is given (another value is refused); "
    "DisPFL, dispfl-s2s, fedp3, dpsgd, dpsgd-ft and local use it [default: off].",
)
@click.option("--device", type=_choice(DEVICES), help=f"[default: {_default('device')}]")
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help=f"Run directory [default: {OUTPUT_PATTERN}, ':' dropped]. Resumed if it holds a run.",
)
@click.option("--fresh", is_flag=True, help="Discard a previous run in --output instead of resuming it.")
@click.option("--energy-backend", type=_choice(BACKENDS), help=f"Energy meter [default: {_default('energy_backend')}].")
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None, help="Decoded data-set cache.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bars when stderr is a terminal; without them (a pipe, a service, --no-progress) one line "
    "per round [default: progress].",
)
@click.option("--print-config", is_flag=True, help="Print the settings as TOML (a --config file) and exit.")
@verbose_option
@click.pass_context
def simulate(
    ctx: click.Context,
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
    given_flags = {
        k: v
        for k, v in flags.items()
        if v is not None and ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE
    }
    values = merge(file_values, given_flags)
    # What the user chose: flags and a TOML file's keys; a run's config.json records every setting.
    chosen = given_flags if config_file is not None and config_file.suffix.lower() == ".json" else values
    if values.get("setting") == "ii" and chosen.get("density") is not None:
        raise ConfigError("--density and --setting ii exclude each other (setting ii uses tiers 0.2..1.0)")
    config = build(SimConfig, values, str(config_file) if config_file else "the command line")
    for warning in config.ignored(set(chosen)):
        click.echo(f"edge-node: warning: {warning}", err=True)
    if print_config:
        click.echo(to_toml(config), nl=False)
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
