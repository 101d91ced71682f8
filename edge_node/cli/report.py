"""``edge-node report``: the paper's table across simulation runs, a run's mask analysis (--masks), or the
report of real runs (a daemon's state directory, a loopback fleet's output)."""

from __future__ import annotations

from pathlib import Path

import click

from edge_node.cli._app import app, verbose_option
from edge_node.errors import ConfigError


@app.command(short_help="The paper's table and plots across runs; --masks: mask distance vs data similarity of a run.")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--output",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write the files [default: FIRST_RUN_DIR/report; with --masks: the run directory]. "
    "(--out: deprecated alias.)",
)
@click.option(
    "--target-acc",
    type=float,
    default=None,
    help="Accuracy (%) for the rounds-to-target columns [default: 80% of the best final accuracy among each "
    "partition's runs].",
)
@click.option(
    "--masks",
    is_flag=True,
    help="For one run: the clients x clients matrices of aligned Hamming distances of their final masks and of "
    "cosine similarities of their label distributions, and their correlation (heat-map PNG, a CSV per matrix "
    "and one of all pairs).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["markdown", "csv"]),
    default="markdown",
    show_default=True,
    help="What to print (both are written).",
)
@verbose_option
def report(run_dirs: tuple[Path, ...], out_dir: Path | None, target_acc: float | None, masks: bool,
           output_format: str) -> None:  # fmt: skip
    """A table like the DisPFL paper's from simulation RUN_DIRS (method x Dir/Path accuracy, busiest-node MB
    in encoded bytes and in the paper's convention, FLOPs per client per round, rounds to a target accuracy)
    as Markdown and CSV, with accuracy and communication plots of all runs; or, with --masks, a run's
    mask-distance analysis (the paper's section 4.4).

    RUN_DIRS may instead be daemons' state directories or loopback fleets' outputs: then per node accuracy
    over rounds and wall time, tiers, bytes, refusals and energy, with a run that stopped early said so."""
    from edge_node.fleet.report import kind_of, write_real_report

    kinds = {path: kind_of(path) for path in run_dirs}
    real = [path for path, kind in kinds.items() if kind in ("node", "fleet")]
    if real and not masks:
        if len(real) != len(run_dirs):
            other = next(path for path in run_dirs if path not in real)
            raise ConfigError(f"{other} is not a node's state dir or a fleet's output like {real[0]}: report apart")
        markdown, files = write_real_report(list(run_dirs), out_dir or run_dirs[0] / "report")
        click.echo(markdown, nl=False)
        for path in files:
            click.echo(f"wrote {path}", err=True)
        return
    if masks:
        from edge_node.sim.masks import mask_report, write_mask_report

        if len(run_dirs) != 1:
            raise ConfigError(f"--masks takes one run directory, got {len(run_dirs)}")
        result = mask_report(run_dirs[0])
        files = write_mask_report(result, out_dir or run_dirs[0])
        click.echo(result.summary())
    else:
        from edge_node.sim.table import caption, read_run, write_report

        if target_acc is not None and not 0 <= target_acc <= 100:
            raise ConfigError(f"--target-acc {target_acc} must be a percentage in 0..100")
        runs = [read_run(path) for path in run_dirs]
        table, files = write_report(runs, out_dir or run_dirs[0] / "report", target_acc)
        if output_format == "markdown":
            click.echo(table.markdown() + "\n" + caption(table, target_acc), nl=False)
        else:
            click.echo(table.csv(), nl=False)
    for path in files:
        click.echo(f"wrote {path}", err=True)
