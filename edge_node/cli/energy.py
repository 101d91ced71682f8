"""``edge-node energy DIR``: summarise the energy log of a run or daemon state directory."""

from __future__ import annotations

import json
from pathlib import Path

import click

from edge_node.cli._app import app
from edge_node.energy.report import format_summary, load_energy_log, plot_energy, summarize


@app.command()
@click.argument("run_or_state_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of a table.")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Output format (--json is short for --format json).",
)
@click.option(
    "--plot",
    "plot_png",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a PNG of energy per round (stacked by phase) to this file.",
)
def energy(run_or_state_dir: Path, as_json: bool, output_format: str, plot_png: Path | None) -> None:
    """Joules per round and phase, mean power and meter source from RUN_OR_STATE_DIR/energy.jsonl.

    Says plainly when the joules are an estimate (no meter was available) and keeps measured,
    estimated and modelled figures apart.
    """
    summary = summarize(load_energy_log(run_or_state_dir))
    if plot_png is not None:
        if plot_png.suffix.lower() != ".png":
            raise click.BadParameter(f"{str(plot_png)!r} must end in .png", param_hint="--plot")
        plot_energy(summary, plot_png)
    if as_json or output_format == "json":
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
    if plot_png is not None and not (as_json or output_format == "json"):
        print(f"plot written to {plot_png}")
