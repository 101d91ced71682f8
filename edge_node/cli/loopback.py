"""``edge-node loopback``: a fleet of real ``edge-node start`` daemons on this machine, watched and summarised."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click

from edge_node.cli._app import app, complete_model, fail, verbose_option
from edge_node.defaults import DEFAULTS, PRESETS, preset_note
from edge_node.errors import ConfigError
from edge_node.exit_codes import ExitCode
from edge_node.fleet.config import COMMAND, DEFAULT_OUTPUT, FleetConfig
from edge_node.robust_names import AGGREGATE_HELP, ATTACKS

_DATASETS = ("demo", "cifar10", "cifar100", "tiny-imagenet")  # edge_node.data.DATASET_NAMES, without importing torch
_MODELS = ("cnn", "resnet18", "vgg11")  # edge_node.models.MODEL_NAMES
_BACKENDS = ("auto", "nvml", "rapl", "jetson", "rpi5", "estimate")  # edge_node.energy.detect.BACKENDS
# How a poisoned fleet starts its nodes: `start` handed the attack by the CLI's internal entry (cli/_attacker.py).
POISONED_LAUNCHER = (sys.executable, "-m", "edge_node.cli._attacker")
HEADER = "# effective edge-node loopback settings (defaults < flags; node i runs edge-node start with them)"


def _demo(name: str) -> str:
    """How a flag's help names the demo preset's value of ``name``."""
    return f"demo quick-start preset: {PRESETS[COMMAND][name]}"


@app.command(context_settings={"max_content_width": 120})
@click.option("--nodes", type=click.IntRange(2, 64), required=True, help="Number of daemons (2..64).")
@click.option("--rounds", type=click.IntRange(min=0), default=5, show_default=True,
              help="Rounds each node runs (0: until Ctrl-C).")  # fmt: skip
@click.option("--netns", is_flag=True, help="Each node in its own network namespace on a bridge, found over mDNS "
              "(root).")  # fmt: skip
@click.option("--link", default=None, metavar="rate=..,delay=..,loss=..",
              help="Condition every node's link, e.g. 'rate=10mbit,delay=20ms,loss=1%' (with --netns; netem, or "
              "tbf + iptables where the kernel has no netem: then delay is not applied and the run says "
              "so).")  # fmt: skip
@click.option("--devices", "devices", multiple=True, metavar="PROFILES",
              help="Device profiles, enforced by cgroups and the links (root): named 'pi4:3,pi5:3,orin-nano:2' or "
              "custom 'cpu=0.25,mem=1g,rate=20mbit,count=2'; groups separated by ';' or by repeating the flag. "
              "Counts add up to --nodes (one profile without a count: every node). See README 'Device "
              "profiles'.")  # fmt: skip
@click.option("--lockstep", is_flag=True, help="The synchronous algorithm: the simulation's seeded neighbours, "
              "every node waits for the fleet each round.")  # fmt: skip
@click.option("--tls", is_flag=True, help="Mutual TLS: a fleet CA and one certificate per node in OUTPUT/tls.")
@click.option("--metrics", is_flag=True, help="Each node's Prometheus endpoint (metrics_listen) on a free port; the "
              "list, as Prometheus file_sd targets, in OUTPUT/metrics-targets.json.")  # fmt: skip
@click.option("--output", type=click.Path(path_type=Path), default=DEFAULT_OUTPUT, show_default=True,
              help="Fleet directory: a state dir and a log per node, the summary. Resumed if it holds a "
              "fleet.")  # fmt: skip
@click.option("--fresh", is_flag=True, help="Discard the fleet in --output and start over.")
@click.option("--fleet", "fleet_id", default="loopback", show_default=True, help="Fleet id.")
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True,
              help="Fleet seed (initial weights, partition, masks).")  # fmt: skip
@click.option(
    "--model",
    shell_complete=complete_model,
    default=DEFAULTS.model,
    show_default=True,
    help=f"{', '.join(_MODELS)}, an installed plug-in's name or a factory package.module:function.",
)
@click.option("--init-weights", type=click.Path(path_type=Path), default=None,
              help="Every node's start: a safetensors file or a weights-only state_dict (never a pickle) [default: "
              "none, all from --seed].")  # fmt: skip
@click.option("--trainable", default=None, metavar="GLOB[,GLOB]",
              help="Every node trains only the parameters matching these globs; the rest are frozen, never sent "
              "[default: all].")  # fmt: skip
@click.option(
    "--task",
    default=DEFAULTS.task,
    show_default=True,
    metavar="TASK",
    help="classification, regression, multilabel or a factory package.module:function (every node's).",
)
@click.option("--norm-stats", type=click.Choice(("local", "average")), default=DEFAULTS.norm_stats, show_default=True,
              help="A BatchNorm model's running statistics: local (each node's own, FedBN) or average (sent with "
              "the model and averaged with the peers'; refused for a model without them).")  # fmt: skip
@click.option("--aggregate", default=DEFAULTS.aggregate, show_default=True, metavar="mean|median|trimmed:BETA",
              help=f"Every node's aggregate. {AGGREGATE_HELP}.")  # fmt: skip
@click.option("--attackers", type=int, default=0, show_default=True, metavar="K",
              help="The last K nodes publish poisoned models (--attack; K below --nodes); every record and the "
              "summary name them. Only a loopback fleet has attackers: edge-node start accepts no attack.")  # fmt: skip
@click.option("--attack", default=None, metavar="|".join(ATTACKS),
              help="What the attackers do: sign-flip, scale:F (F > 0, finite), noise (Gaussian of their weights' "
              "rms), zero, label-flip (train on flipped labels), stale:R (publish the model of R rounds ago, R <= "
              "--rounds).")  # fmt: skip
@click.option("--dataset", default=DEFAULTS.dataset, show_default=True,
              help=f"Data set each node takes its slice of: {', '.join(_DATASETS)} (demo is built in) or a data "
              "factory package.module:function.")  # fmt: skip
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Where --dataset's files are.")
@click.option("--partition", default=DEFAULTS.partition, show_default=True,
              help="How the data set is split among the nodes.")  # fmt: skip
@click.option("--neighbours", type=int, default=None,
              help=f"Peers each node pulls per round [default: {DEFAULTS.neighbours}, at most N-1].")  # fmt: skip
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help=f"Local epochs per round [default: {DEFAULTS.epochs}; {_demo('epochs')}].")  # fmt: skip
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help=f"Training batch size [default: {DEFAULTS.batch_size}; {_demo('batch_size')}].")  # fmt: skip
@click.option("--lr", type=float, default=None, help=f"Initial learning rate [default: {DEFAULTS.lr}].")
@click.option("--capacity", default=None,
              help=f"Every node's density, any in (0, 1], or auto (each node measures its own) [default: "
              f"{DEFAULTS.capacity}; {_demo('capacity')}].")  # fmt: skip
@click.option("--tier-mode", type=click.Choice(("mask", "width", "both")), default="mask", show_default=True,
              help="What a capacity tier buys, every node's: mask (a sparse mask at the tier's density), width (the "
              "tier's narrow model, dense inside: its compute shrinks), both (the narrow model with a mask at "
              "--density inside).")  # fmt: skip
@click.option(
    "--density",
    type=float,
    default=None,
    help="--tier-mode both: the mask's density inside each node's narrow model [default: start's, 0.5].",
)
@click.option("--planned-rounds", type=click.IntRange(min=1), default=None,
              help="T of the prune schedule [default: --rounds].")  # fmt: skip
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help=f"Torch threads per node [default: this machine's cores shared among the nodes; "
              f"{_demo('threads')}].")  # fmt: skip
@click.option("--pull-timeout-s", type=float, default=DEFAULTS.pull_timeout_s, show_default=True,
              help="Per node: longest wait for a round's pulls.")  # fmt: skip
@click.option("--round-budget-s", type=float, default=DEFAULTS.round_budget_s, show_default=True,
              help="Per node: round budget (the lock-step wait bound).")  # fmt: skip
@click.option("--energy-backend", type=click.Choice(_BACKENDS), default="estimate", show_default=True,
              help="Energy meter per node (a machine-wide meter would count the same joules once per "
              "node).")  # fmt: skip
@click.option("--daemon-arg", "daemon_args", multiple=True, metavar="FLAG",
              help="One more `edge-node start` argument for every node (repeat; e.g. --daemon-arg=--value-type "
              "--daemon-arg=float16).")  # fmt: skip
@click.option("--progress/--no-progress", default=None,
              help="Live table [default: in a terminal], or plain lines (always in a pipe).")  # fmt: skip
@click.option("--print-config", is_flag=True, help="Print the fleet's settings (TOML) and exit.")
@verbose_option
def loopback(fresh: bool, progress: bool | None, fleet_id: str, daemon_args: tuple[str, ...],
             devices: tuple[str, ...], print_config: bool, **flags: Any) -> None:  # fmt: skip
    """Run N real edge-node daemons on this machine (127.0.0.1 or namespaces) and summarise the fleet.

    Each node is an `edge-node start` process with its own state directory, port and slice of the data
    set. Shows live progress, stops every daemon cleanly on Ctrl-C or when done, removes every namespace
    it made, and writes fleet-summary.json, fleet-summary.md and fleet-accuracy.png to --output.
    """
    from edge_node.fleet.netns import NetnsError
    from edge_node.fleet.progress import LineProgress, LiveTable
    from edge_node.fleet.summary import format_markdown
    from edge_node.fleet.supervise import run_fleet

    live = progress is not False and sys.stderr.isatty()
    flags["trainable"] = tuple((flags.get("trainable") or "").split(","))
    config = FleetConfig(fleet=fleet_id, daemon_args=daemon_args, progress=live,
                         devices=";".join(devices) if devices else None, **flags)  # fmt: skip
    if print_config:
        from edge_node.tomlconf import to_toml

        given = {k for k, v in flags.items() if v is not None}
        header = "\n".join(filter(None, [HEADER, preset_note(COMMAND, config.dataset, given)]))
        click.echo(to_toml(config, header=header), nl=False)
        return
    average = config.norm_stats == "average"
    if config.model not in _MODELS or config.dataset not in _DATASETS or config.task != "classification" or average:
        from edge_node.algorithm.norm_stats import has_running_stats
        from edge_node.api import check_model_and_data

        built = check_model_and_data(config.model, config.dataset, config.data_dir, seed=config.seed, task=config.task)
        if average and not has_running_stats(built):  # one line, before anything is written
            raise ConfigError(f"--norm-stats average: model {config.model} has no running statistics (BatchNorm "
                              "buffers) to average; use --norm-stats local (the default)")  # fmt: skip
    if config.init_weights is not None or config.trainable:  # a bad file or glob: one line, before anything is written
        from edge_node.api import check_start

        check_start(config.model, config.dataset, config.data_dir, config.init_weights, config.trainable,
                    seed=config.seed, task=config.task)  # fmt: skip
    stop = threading.Event()
    caught: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt  # second signal: kill the daemons now
        caught.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    display: Any = LiveTable(sys.stderr) if live else LineProgress(lambda line: click.echo(line, err=True))
    try:
        outcome = run_fleet(config, display, stop, fresh=fresh, poisoned_launcher=POISONED_LAUNCHER)
    except NetnsError as exc:
        raise fail(str(exc), ExitCode.NETWORK) from None
    finally:
        close = getattr(display, "close", None)
        if close is not None:
            close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo(format_markdown(outcome.summary))
    for path in outcome.files:
        click.echo(f"wrote {path.resolve()}")
    for line in outcome.warnings:
        click.echo(f"edge-node: warning: {line}", err=True)
    if outcome.code == ExitCode.INTERRUPTED:
        click.echo("edge-node: interrupted; every daemon stopped, completed rounds are kept", err=True)
    elif outcome.code != ExitCode.SUCCESS:
        click.echo(f"edge-node: error: {outcome.reason}; its log ends:", err=True)
        for line in outcome.log_tail.splitlines():
            click.echo(f"  | {line}", err=True)
    raise click.exceptions.Exit(outcome.code)
