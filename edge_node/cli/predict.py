"""``edge-node predict``: run the model a node handed over (STATE_DIR/handover/) on image files or .npy arrays."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click
import numpy as np

from edge_node.cli._app import app
from edge_node.cli._node_options import state_dir_of


@app.command(context_settings={"max_content_width": 120})
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--state-dir", type=click.Path(path_type=Path), default=None, help="The node's state dir.")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None, help="Find state_dir here.")
@click.option("--top", type=click.IntRange(min=1), default=3, show_default=True, help="Classes shown per input.")
@click.option("--resize", is_flag=True, help="Scale images of another size to the model's (else they are refused).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per input sample instead of text.")
def predict(
    inputs: tuple[Path, ...], state_dir: Path | None, config_file: Path | None, top: int, resize: bool, as_json: bool
) -> None:
    """Run the model a node handed over (STATE_DIR/handover/) on image files or .npy arrays.

    INPUTS: image files (PNG, JPEG, ... via Pillow) or .npy arrays (one sample or a batch). Follows
    STATE_DIR/handover/current.json to the pair it names and runs it in onnxruntime on the raw input its
    model.json describes (images: float32 in [0, 1], CHW). Prints the model's round and, per sample, the top
    classes with their probabilities (classification), the labels with probability above 0.5 (multilabel) or
    the predicted values (regression). An input of another shape, dtype or size is one line, exit 2.
    """
    from edge_node.handover_model import class_names, load_handover, read_input

    model = load_handover(state_dir_of(state_dir, config_file))
    batches = [(path, read_input(path, model.info, resize=resize)) for path in inputs]  # all checked first
    if not as_json:
        click.echo(model.describe())
    names = class_names(model.info)
    for path, batch in batches:
        outputs = model.predict(batch, str(path))
        for i, row in enumerate(outputs):
            name = str(path) if len(outputs) == 1 else f"{path}[{i}]"
            answer = _answer(model.info, names, row, top)
            if as_json:
                click.echo(json.dumps({"input": name, "round": model.round, **answer}))
            else:
                click.echo(f"{name}: {_text(answer)}")


def _answer(info: dict[str, Any], names: list[str], row: np.ndarray, top: int) -> dict[str, Any]:
    """What one sample's outputs say, by task: classes with probabilities, labels, or values."""
    task = info.get("task")
    if task == "classification":
        z = row.astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p)[:top]
        return {"classes": [[names[j], round(float(p[j]), 6)] for j in order]}
    if task == "multilabel":
        p = 1.0 / (1.0 + np.exp(-row.astype(np.float64)))
        return {"labels": [[names[j], round(float(p[j]), 6)] for j in np.flatnonzero(p > 0.5)]}
    return {"values": [float(v) for v in row]}


def _text(answer: dict[str, Any]) -> str:
    if "classes" in answer:
        return ", ".join(f"{name} {100 * p:.1f}%" for name, p in answer["classes"])
    if "labels" in answer:
        return ", ".join(f"{name} {100 * p:.1f}%" for name, p in answer["labels"]) or "no label"
    return ", ".join("nan" if math.isnan(v) else f"{v:.6g}" for v in answer["values"])
