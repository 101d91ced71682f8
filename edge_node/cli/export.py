"""``edge-node export``: a node's (or a simulation client's) personalized model for onnxruntime, checked
against torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edge_node.cli._app import app
from edge_node.cli._config_options import given_flags
from edge_node.cli._node_options import load_saved_node_config, node_options
from edge_node.errors import ConfigError


@app.command(context_settings={"max_content_width": 120})
@click.option(
    "--onnx",
    "onnx_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the model [default: NODE_ID.onnx, or client-K.onnx with --run, in the current directory].",
)
@click.option(
    "--run",
    "run_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A simulation's run directory (edge-node simulate --output): export one of its clients (--client).",
)
@click.option("--client", type=click.IntRange(min=0), default=None, help="With --run: the client to export (0-based).")
@node_options
def export(onnx_path: Path | None, run_dir: Path | None, client: int | None, config_file: Path | None,
           **flags: Any) -> None:  # fmt: skip
    """Write a trained model (masked weights) as ONNX and check it with onnxruntime.

    A node: reads its identity from STATE_DIR's checkpoint and its settings from STATE_DIR/node-config.toml
    (written by ``start``): ``--state-dir`` is all it needs, for any model (built-in, entry point or
    package.module:function); other flags override (a conflicting identity is refused). A simulation:
    ``--run RUN_DIR --client K`` exports client K's model from the run's checkpoint.

    The model is exported once to a scratch directory first: one that cannot be exported is refused in one
    line and nothing is written. Prints the largest absolute difference of onnxruntime's logits from
    torch's and their top-1 agreement on the client's local test data.
    """
    from edge_node.api import node_trained, run_trained
    from edge_node.node.export import check_onnx, write_onnx

    if run_dir is not None:
        if client is None:
            raise ConfigError("--run needs --client K: the client of the simulation whose model to export")
        if config_file is not None or given_flags(flags):
            given = ["--config"] if config_file is not None else []
            given += ["--" + k.replace("_", "-") for k in given_flags(flags)]
            raise ConfigError(f"--run exports a simulation's client from its checkpoint; {given[0]} is a node's flag")
        trained = run_trained(run_dir, client, check_export=True)
    else:
        if client is not None:
            raise ConfigError("--client goes with --run RUN_DIR (a node's state dir holds one model)")
        trained = node_trained(load_saved_node_config(config_file, flags), check_export=True)
    path = onnx_path if onnx_path is not None else Path(trained.default_onnx)
    size = write_onnx(path, trained.model, trained.weights, trained.input_shape, trained.buffers)
    check = check_onnx(path, trained.model, trained.weights, trained.test_data.eval_batches(256), trained.buffers)
    click.echo(f"wrote {path} ({size / 1e6:.2f} MB): {trained.description}")
    click.echo(
        f"onnxruntime vs torch on {check.samples} local test samples: max |logit difference| "
        f"{check.max_abs_diff:.3g}, top-1 agreement {100 * check.argmax_agreement:.2f}%"
    )
