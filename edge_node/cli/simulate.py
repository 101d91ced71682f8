"""``edge-node simulate``: N DisPFL clients in one process on a benchmark data set."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from edge_node.cli._app import app
from edge_node.data import DATASET_NAMES, load_dataset
from edge_node.energy.report import load_energy_log
from edge_node.energy.report import summarize as energy_summary
from edge_node.errors import ConfigError
from edge_node.sim.config import SimConfig
from edge_node.sim.report import SUMMARY_FILE, format_summary, plot_run, read_rounds, summarize
from edge_node.sim.runner import resolve_device, run_simulation
from edge_node.storage import atomic_write_text

_LOGGER = logging.getLogger(__name__)


@app.command()
@click.option("--method", default="dispfl", show_default=True, help="Learning method (baselines follow).")
@click.option(
    "--dataset",
    default="demo",
    show_default=True,
    help=f"One of {', '.join(DATASET_NAMES)}; 'demo' is built in and needs no download.",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Data set location: python batches, an image-folder tree, or a .tar.gz of either.",
)
@click.option("--download", is_flag=True, help="Download CIFAR python batches (checksummed) when absent.")
@click.option("--model", default="cnn", show_default=True, help="cnn, resnet18 or vgg11.")
@click.option("--clients", default=100, show_default=True, type=int)
@click.option("--neighbours", default=10, show_default=True, type=int, help="Peers each client pulls per round.")
@click.option("--topology", default="random", show_default=True, help="random, ring or full.")
@click.option("--max-in-degree", default=None, type=int, help="Cap pulls a node serves per round (paper: 10).")
@click.option("--rounds", default=500, show_default=True, type=int, help="Rounds to run (resume: run up to this).")
@click.option("--planned-rounds", default=None, type=int, help="T of the cosine prune schedule [default: --rounds].")
@click.option("--epochs", default=5, show_default=True, type=int, help="Local epochs per round.")
@click.option("--batch-size", default=128, show_default=True, type=int)
@click.option("--lr", default=0.1, show_default=True, type=float, help="Initial learning rate (x0.998 per round).")
@click.option("--density", default=None, type=float, help="Model density in (0, 1] [default: 0.5].")
@click.option(
    "--setting", default="i", show_default=True, help="'ii': heterogeneous tiers 0.2..1.0 (client i gets tier i mod 5)."
)
@click.option("--mask-init", default="erk", show_default=True, help="erk or uniform.")
@click.option("--regrow", default="random", show_default=True, help="gradient (paper) or random (reference).")
@click.option("--partition", default="dir:0.3", show_default=True, help="dir:ALPHA or path:K.")
@click.option(
    "--samples-per-client",
    default=None,
    type=int,
    help="dir partitions: samples per client [default: training set size // clients].",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Run directory [default: runs/<dataset>-<model>-<setting>-seed<N>]. Resumed if it holds a run.",
)
@click.option("--fresh", is_flag=True, help="Discard a previous run in --output instead of resuming it.")
@click.option("--energy-backend", default="auto", show_default=True, help="auto, nvml, rapl, jetson, rpi5 or estimate.")
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None, help="Decoded data-set cache.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bars on stderr.")
def simulate(
    method: str,
    dataset: str,
    data_dir: Path | None,
    download: bool,
    model: str,
    clients: int,
    neighbours: int,
    topology: str,
    max_in_degree: int | None,
    rounds: int,
    planned_rounds: int | None,
    epochs: int,
    batch_size: int,
    lr: float,
    density: float | None,
    setting: str,
    mask_init: str,
    regrow: str,
    partition: str,
    samples_per_client: int | None,
    seed: int,
    device: str,
    output: Path | None,
    fresh: bool,
    energy_backend: str,
    cache_dir: Path | None,
    progress: bool,
) -> None:
    """Run DisPFL with N simulated clients and report what the paper reports.

    Writes per-round JSONL (accuracy before/after local training, bytes per node, busiest node,
    paper-convention MB, FLOPs, wall time), energy.jsonl, summary.json and PNG plots to the run
    directory; a run is resumable from its last completed round.
    """
    if setting == "ii" and density is not None:
        raise ConfigError("--density and --setting ii exclude each other (setting ii uses tiers 0.2..1.0)")
    if output is None:
        output = Path("runs") / f"{dataset}-{model}-setting{setting}-seed{seed}"
    config = SimConfig(
        method=method,
        dataset=dataset,
        data_dir=data_dir,
        model=model,
        clients=clients,
        neighbours=neighbours,
        topology=topology,
        max_in_degree=max_in_degree,
        rounds=rounds,
        planned_rounds=planned_rounds,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        density=0.5 if density is None else density,
        setting=setting,
        mask_init=mask_init,
        regrow=regrow,
        partition=partition,
        samples_per_client=samples_per_client,
        seed=seed,
        device=device,
        output=output,
        energy_backend=energy_backend,
        progress=progress,
    )
    resolve_device(config.device)  # before the (possibly long) data decode
    data = load_dataset(dataset, data_dir, cache_dir=cache_dir, download=download)
    click.echo(
        f"simulating {clients} clients of {model} on {dataset} for {rounds} rounds -> {output.resolve()}", err=True
    )
    run_dir = run_simulation(config, data, fresh=fresh)
    records = read_rounds(run_dir)
    summary = summarize(records, energy_summary(load_energy_log(run_dir)))
    atomic_write_text(run_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    plots = plot_run(records, run_dir)
    click.echo(format_summary(summary))
    click.echo(f"\nrun directory: {run_dir.resolve()}")
    for path in plots:
        click.echo(f"plot: {path.resolve()}")
