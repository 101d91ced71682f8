"""``edge-node predict`` on image files and .npy arrays, the API helper that follows the node, and bad input:
one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_node.cli import main
from edge_node.errors import HandoverError
from edge_node.handover_model import load_handover
from tests.handovers import handover, image_data, image_model, linear, linear_weights, sign_data


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(args)
    return int(exc.value.code or 0)


@pytest.fixture(scope="module")
def image_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir whose handed-over model takes 8x8 RGB images and names its 3 classes (round 2)."""
    state = tmp_path_factory.mktemp("image") / "state"
    model = image_model()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    node = handover(state, model, image=True, class_names=["cat", "dog", "owl"])
    assert node.after_round(2, weights, {}, image_data()) is not None
    return state


@pytest.fixture(scope="module")
def features_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("features") / "state"
    assert handover(state, linear()).after_round(5, linear_weights(1.0), {}, sign_data(10)) is not None
    return state


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("edge-node: error: "), err
    return err[0]


def test_predict_prints_the_round_and_the_top_classes_of_images(image_state, tmp_path, capsys):
    png, big = tmp_path / "a.png", tmp_path / "big.jpg"
    Image.fromarray(np.full((8, 8, 3), 200, dtype=np.uint8)).save(png)
    Image.fromarray(np.zeros((32, 48, 3), dtype=np.uint8)).save(big)
    assert run_cli(["predict", "--state-dir", str(image_state), "--top", "2", "--resize", str(png), str(big)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("model of n0 after round 2: accuracy ") and "local test samples" in lines[0], lines
    assert len(lines) == 3 and lines[1].startswith(f"{png}: ") and lines[2].startswith(f"{big}: "), lines
    shown = [part.rsplit(" ", 1) for part in lines[1].split(": ", 1)[1].split(", ")]
    assert len(shown) == 2 and all(name in ("cat", "dog", "owl") and p.endswith("%") for name, p in shown), lines
    assert run_cli(["predict", "--state-dir", str(image_state), "--json", str(png)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["input"] == str(png) and answer["round"] == 2 and len(answer["classes"]) == 3
    assert abs(sum(p for _, p in answer["classes"]) - 1.0) < 1e-4


def test_predict_reads_npy_samples_and_batches(features_state, tmp_path, capsys):
    one, batch = tmp_path / "one.npy", tmp_path / "batch.npy"
    np.save(one, np.array([2.0, 0, 0, 0]))  # float64 is taken (as float32)
    np.save(batch, np.array([[-1.0, 0, 0, 0], [1.0, 0, 0, 0]], dtype=np.float32))
    assert run_cli(["predict", "--state-dir", str(features_state), "--top", "1", str(one), str(batch)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("model of n0 after round 5: accuracy 100.0% on 10 local test samples"), lines
    assert lines[1].startswith(f"{one}: 1 ") and lines[2].startswith(f"{batch}[0]: 0 "), lines
    assert lines[3].startswith(f"{batch}[1]: 1 "), lines


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: np.save(p, np.zeros((2, 5), dtype=np.float32)), "shape (2, 5); the model takes (4,) (one sample)"),
        (lambda p: np.save(p, np.zeros(4, dtype=np.int64)), "dtype int64; the model takes float32"),
        (lambda p: np.save(p, np.array([1.0, np.nan, 0, 0])), "holds NaN or infinite values"),
        (lambda p: p.write_bytes(b"not an array"), "not a readable .npy array"),
    ],
)  # fmt: skip
def test_a_bad_npy_input_is_one_line_exit_2(features_state, tmp_path, capsys, make, message):
    path = tmp_path / "x.npy"
    make(path)
    assert run_cli(["predict", "--state-dir", str(features_state), str(path)]) == 2
    line = _one_error_line(capsys)
    assert f"{path}: " in line and message in line, line
    assert capsys.readouterr().out == ""  # every input is checked before anything is printed


def test_a_bad_image_input_is_one_line_exit_2(image_state, tmp_path, capsys):
    big, text = tmp_path / "big.png", tmp_path / "notes.txt"
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(big)
    text.write_text("hello")
    assert run_cli(["predict", "--state-dir", str(image_state), str(big)]) == 2
    assert "image of 16x16 pixels; the model takes 8x8 (--resize scales it)" in _one_error_line(capsys)
    assert run_cli(["predict", "--state-dir", str(image_state), str(text)]) == 2
    assert "not an image Pillow can read, nor a .npy array" in _one_error_line(capsys)
    pixels = tmp_path / "pixels.npy"
    np.save(pixels, np.full((3, 8, 8), 255.0, dtype=np.float32))
    assert run_cli(["predict", "--state-dir", str(image_state), str(pixels)]) == 2
    assert "values from 255 to 255; the model takes float32 pixels in [0, 1]" in _one_error_line(capsys)


def test_predict_without_a_handed_over_model_is_one_line(tmp_path, capsys):
    sample = tmp_path / "x.npy"
    np.save(sample, np.zeros(4, dtype=np.float32))
    assert run_cli(["predict", "--state-dir", str(tmp_path), str(sample)]) == 2
    assert "holds no handed-over model yet" in _one_error_line(capsys)


def test_the_api_helper_reloads_when_the_node_hands_over_anew(tmp_path):
    with pytest.raises(HandoverError, match="holds no handed-over model yet"):
        load_handover(tmp_path)
    node = handover(tmp_path, linear(), mode="latest")
    node.after_round(1, linear_weights(1.0), {}, sign_data(10))
    model = load_handover(tmp_path, threads=1)
    sample = np.array([1.0, 0, 0, 0], dtype=np.float32)
    assert model.round == 1 and model.top(sample, k=1)[0][0][0] == "1"
    assert not model.reload_if_changed()
    node.after_round(2, linear_weights(-1.0), {}, sign_data(10))
    assert model.round == 1 and model.reload_if_changed() and model.round == 2
    assert model.top(sample, k=1)[0][0][0] == "0" and model.predict(sample[None]).shape == (1, 2)
    with pytest.raises(HandoverError, match=r"input: shape \(3,\); the model takes \(4,\)"):
        model.predict(np.zeros(3, dtype=np.float32))
