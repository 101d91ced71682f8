"""``edge-node export --onnx FILE``: the node's personalized model for onnxruntime, checked against torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edge_node.cli._app import app
from edge_node.cli._node_options import load_saved_node_config, node_options
from edge_node.errors import CheckpointError


@app.command(context_settings={"max_content_width": 120})
@click.option("--onnx", "onnx_path", type=click.Path(path_type=Path), required=True, help="Where to write the model.")
@node_options
def export(onnx_path: Path, config_file: Path | None, **flags: Any) -> None:
    """Write the node's latest checkpointed model (masked weights) as ONNX and check it with onnxruntime.

    Reads the node's identity from its checkpoint and its settings from STATE_DIR/node-config.toml (written
    by ``start``): ``--state-dir`` is all it needs; other flags override (and a conflicting identity is
    refused). Prints
    the largest absolute difference of onnxruntime's logits from torch's and their top-1 agreement on a
    batch of the node's local test data.
    """
    import torch

    from edge_node.node.export import check_onnx, write_onnx
    from edge_node.node.local_data import load_local_data
    from edge_node.node.local_model import node_model
    from edge_node.node.state import CHECKPOINT_FILE, Identity, load_checkpoint
    from edge_node.node.status import round_label

    config = load_saved_node_config(config_file, flags)
    node_id = config.resolved_node_id
    client = config.resolved_client_index
    device = torch.device("cpu")
    local = load_local_data(config, client, device)
    model, spec = node_model(config, local)
    path = config.state_dir / CHECKPOINT_FILE
    saved = load_checkpoint(path, Identity(node_id, config.fleet, spec.arch_id, config.seed, client), device)
    if saved is None:
        raise CheckpointError(f"no checkpoint at {path}: the node has not completed a round there yet")
    size = write_onnx(onnx_path, model, saved.state.weights, local.data.pool.input_shape)
    check = check_onnx(onnx_path, model, saved.state.weights, local.data.eval_batches(256))
    click.echo(f"wrote {onnx_path} ({size / 1e6:.2f} MB): {node_id}'s model after {round_label(saved.rounds_done - 1)}")
    click.echo(
        f"onnxruntime vs torch on {check.samples} local test samples: max |logit difference| "
        f"{check.max_abs_diff:.3g}, top-1 agreement {100 * check.argmax_agreement:.2f}%"
    )
