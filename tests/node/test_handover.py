"""The model handed over: pairs behind a pointer replaced by rename (never a mix, never a torn file, the last K
kept), the best/latest policy (a worse round is kept out under best; a grown test set re-scores the old model),
raw input with the normalisation inside the graph, the node's BatchNorm statistics, and a full disk."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import threading
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from edge_node.algorithm.tasks import TASKS
from edge_node.data.augment import normalize_batch
from edge_node.errors import HandoverError, StorageError
from edge_node.handover import (
    POINTER_FILE,
    current_folder,
    handover_dir,
    incoming,
    pair_folders,
    prune,
    publish,
    read_pair,
)
from edge_node.handover_model import load_handover
from edge_node.node.export import INPUT_NAME, ONNX_FILE, with_weights
from edge_node.node.handover import hands_over, tolerance
from tests.handovers import (
    MEAN,
    STD,
    features_data,
    handover,
    image_data,
    image_model,
    linear,
    linear_weights,
    sign_data,
    sign_features,
)


def _publish_bytes(state_dir: Path, payload: bytes, round_done: int, keep: int = 3) -> str:
    with incoming(state_dir) as pending:
        (pending / "model.onnx").write_bytes(payload)
        return publish(pending, {"format": 1, "round": round_done}, round_done=round_done, keep=keep)


# -- the format ---------------------------------------------------------------------------------------
def test_a_pair_is_read_through_the_pointer_and_checked(tmp_path):
    assert read_pair(tmp_path) is None and current_folder(tmp_path) is None
    name = _publish_bytes(tmp_path, b"first", 1)
    pair = read_pair(tmp_path)
    assert pair is not None and pair.folder.name == name and name.startswith("r000001-")
    assert pair.onnx == b"first" and pair.info["onnx_sha256"] == hashlib.sha256(b"first").hexdigest()
    assert json.loads((handover_dir(tmp_path) / POINTER_FILE).read_text())["folder"] == name
    again = _publish_bytes(tmp_path, b"first", 1)  # the same round and bytes again (a re-run round): a new folder
    assert again != name and read_pair(tmp_path).folder.name == again  # type: ignore[union-attr]


def test_the_last_k_pairs_are_kept_and_never_the_current_one(tmp_path):
    names = [_publish_bytes(tmp_path, f"model {i}".encode(), i, keep=3) for i in range(5)]
    assert [p.name for p in pair_folders(handover_dir(tmp_path))] == names[-3:]
    assert current_folder(tmp_path) == names[-1]
    assert not [p for p in handover_dir(tmp_path).iterdir() if p.name.startswith(".incoming-")]
    prune(handover_dir(tmp_path), 2, current=names[-3])  # the pointer's folder stays, however old
    assert [p.name for p in pair_folders(handover_dir(tmp_path))] == names[-3:]
    prune(handover_dir(tmp_path), 2, current=names[-1])
    assert [p.name for p in pair_folders(handover_dir(tmp_path))] == names[-2:]


@pytest.mark.parametrize(
    ("pointer", "message"),
    [("{not json", "is not a handover pointer"), ('{"format": 9, "folder": "r000001-0123456789ab"}', "has format 9"),
     ('{"format": 1, "folder": "../../etc"}', "not a handover folder")],
)  # fmt: skip
def test_a_bad_pointer_is_one_line(tmp_path, pointer, message):
    handover_dir(tmp_path).mkdir()
    (handover_dir(tmp_path) / POINTER_FILE).write_text(pointer)
    with pytest.raises(HandoverError, match=message) as exc:
        read_pair(tmp_path)
    assert "\n" not in str(exc.value)


def test_a_reader_following_the_pointer_never_sees_a_mixed_pair_nor_fails(tmp_path):
    """A writer replaces the pair 300 times back to back (keep 2, the least: the folder before the current one
    goes at each write; a node writes once a round) while a thread reads in a loop."""
    _publish_bytes(tmp_path, b"model 0" * 1000, 0, keep=2)
    done, seen, failures = threading.Event(), set(), []

    def read_loop() -> None:
        while not done.is_set():
            try:
                pair = read_pair(tmp_path)
                assert pair is not None
                assert hashlib.sha256(pair.onnx).hexdigest() == pair.info["onnx_sha256"]
                assert pair.onnx == f"model {pair.info['round']}".encode() * 1000
                seen.add(pair.info["round"])
            except Exception as exc:  # noqa: BLE001 -- any failure of a read is what this test looks for
                failures.append(repr(exc))

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        for i in range(1, 301):
            _publish_bytes(tmp_path, f"model {i}".encode() * 1000, i, keep=2)
    finally:
        done.set()
        reader.join()
    assert not failures, failures[:3]
    assert len(seen) > 1, seen


def test_an_application_holding_the_old_file_open_reads_it_whole_after_replacement(tmp_path):
    _publish_bytes(tmp_path, b"old model " * 1000, 1, keep=2)
    pair = read_pair(tmp_path)
    assert pair is not None
    with open(pair.folder / "model.onnx", "rb") as held:
        for i in range(2, 5):
            _publish_bytes(tmp_path, f"new {i}".encode(), i, keep=2)
        assert not pair.folder.exists()  # pruned while open
        assert held.read() == b"old model " * 1000


def test_a_full_disk_while_publishing_leaves_the_old_pair_readable(tmp_path, monkeypatch):
    old = _publish_bytes(tmp_path, b"old", 1)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("edge_node.handover.os.rename", full)
    with pytest.raises(StorageError, match="No space left on device"):
        _publish_bytes(tmp_path, b"new", 2)
    pair = read_pair(tmp_path)
    assert pair is not None and pair.folder.name == old and pair.onnx == b"old"
    assert [p.name for p in handover_dir(tmp_path).iterdir() if p.name != POINTER_FILE] == [old]


# -- the policy ---------------------------------------------------------------------------------------
def test_the_policy_and_its_tolerance():
    assert tolerance(fraction=True, test_samples=50, incumbent=0.9) == pytest.approx(0.02)
    assert tolerance(fraction=False, test_samples=10, incumbent=-2.0) == pytest.approx(0.2)
    assert tolerance(fraction=True, test_samples=0, incumbent=0.9) == 0.0
    assert tolerance(fraction=True, test_samples=50, incumbent=0.9, given=0.0) == 0.0
    assert hands_over("best", 0.88, 0.9, higher_is_better=True, slack=0.02)
    assert not hands_over("best", 0.87, 0.9, higher_is_better=True, slack=0.02)
    assert hands_over("latest", 0.1, 0.9, higher_is_better=True, slack=0.0)
    assert hands_over("best", 0.1, None, higher_is_better=True, slack=0.0)  # nothing handed over yet
    assert not hands_over("best", float("nan"), 0.5, higher_is_better=True, slack=0.0)
    assert hands_over("best", 1.1, 1.0, higher_is_better=False, slack=0.1)  # an error (MAE): lower is better
    assert not hands_over("best", 1.2, 1.0, higher_is_better=False, slack=0.1)


@pytest.mark.parametrize(("mode", "handed_over"), [("best", False), ("latest", True)])
def test_a_worse_round_is_not_handed_over_under_best_and_is_under_latest(tmp_path, mode, handed_over):
    outcomes: list[str] = []
    node = handover(tmp_path, linear(), mode=mode, on_outcome=outcomes.append)
    data = sign_data(20)
    first = node.after_round(1, linear_weights(1.0), {}, data)
    assert first is not None and read_pair(tmp_path).info["metric_value"] == 1.0  # type: ignore[union-attr]
    second = node.after_round(2, linear_weights(-1.0), {}, data)  # every test sample wrong
    pair = read_pair(tmp_path)
    assert pair is not None
    assert (second is not None) == handed_over and pair.info["round"] == (2 if handed_over else 1)
    assert outcomes == ["handed_over", "handed_over" if handed_over else "kept"]
    compat = onnxruntime.InferenceSession(str(tmp_path / ONNX_FILE), providers=["CPUExecutionProvider"])
    logits = compat.run(None, {INPUT_NAME: np.array([[1.0, 0, 0, 0]], dtype=np.float32)})[0]
    assert logits.argmax() == 0  # model.onnx stays the latest round's (today's meaning), whatever the policy


def test_a_grown_test_set_rescores_the_handed_over_model_so_it_never_freezes(tmp_path):
    """Model A (class = sign of feature 0) scored 100 % on 20 samples. 20 samples arrive whose class is the sign of
    feature 1, which disagrees with feature 0 there: A scores 50 % on the 40. Model B (feature 1; right on half the
    old samples) scores 75 %: worse than A's recorded 100 %, better than A re-scored. B is handed over."""
    x_old = sign_features(20)
    x_old[:10, 1] = np.abs(x_old[:10, 1]) * np.sign(x_old[:10, 0])  # feature 1 agrees with feature 0 on 10 of 20
    x_old[10:, 1] = -np.abs(x_old[10:, 1]) * np.sign(x_old[10:, 0])
    x_new = sign_features(20, seed=1)
    x_new[:, 1] = -np.abs(x_new[:, 1]) * np.sign(x_new[:, 0])
    y_old, y_new = (x_old[:, 0] > 0).astype(np.int64), (x_new[:, 1] > 0).astype(np.int64)
    node = handover(tmp_path, linear(), mode="best")
    assert node.after_round(1, linear_weights(1.0), {}, features_data(x_old, y_old)) is not None
    grown = features_data(np.concatenate([x_old, x_new]), np.concatenate([y_old, y_new]))
    assert node.after_round(2, linear_weights(1.0, feature=1), {}, grown) is not None
    info = read_pair(tmp_path).info  # type: ignore[union-attr]
    assert info["round"] == 2 and info["metric_value"] == 0.75 and info["test_samples"] == 40
    assert node.after_round(3, linear_weights(1.0), {}, grown) is None  # A again: 50 % < 75 % - 1/40, kept


# -- what the graph takes -----------------------------------------------------------------------------
def test_images_are_fed_raw_and_the_nodes_batchnorm_statistics_are_used(tmp_path):
    """The handover graph normalises inside (raw [0, 1] pixels in, the training model's outputs out) and holds
    the node's running statistics, not the built model's."""
    model = image_model()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    buffers["1.running_mean"] = torch.tensor([0.3, -0.2, 0.5, 0.1])
    buffers["1.running_var"] = torch.tensor([2.0, 0.5, 1.5, 3.0])
    data = image_data()
    name = handover(tmp_path, model, image=True, class_names=["a", "b", "c"]).after_round(4, weights, buffers, data)
    assert name is not None
    served = load_handover(tmp_path)
    pixels = data.pool.test_x
    got = served.predict(pixels.float().numpy() / 255.0)
    trained = with_weights(model, weights, buffers)
    with torch.no_grad():
        expected = trained(normalize_batch(pixels, MEAN, STD)).numpy()
        built = with_weights(model, weights)(normalize_batch(pixels, MEAN, STD)).numpy()
    assert np.abs(got - expected).max() < 1e-4
    assert np.abs(got - built).max() > 1e-2  # the node's statistics make a difference the test can see
    info = served.info
    assert info["input"] | {"raw": None} == {
        "name": "input", "shape": ["batch", 3, 8, 8], "dtype": "float32", "kind": "image", "range": [0.0, 1.0],
        "raw": None, "normalised_in_graph": {"mean": list(MEAN), "std": list(STD)},
    }  # fmt: skip
    assert info["class_names"] == ["a", "b", "c"] and info["round"] == 4 and info["node_id"] == "n0"
    assert {"arch_id", "task", "metric", "metric_value", "time_utc", "onnx_sha256", "format"} <= set(info)
    compat = onnxruntime.InferenceSession(str(tmp_path / ONNX_FILE), providers=["CPUExecutionProvider"])
    normalised = normalize_batch(pixels, MEAN, STD).numpy()
    assert np.abs(compat.run(None, {INPUT_NAME: normalised})[0] - expected).max() < 1e-4  # the old file's input


def test_a_failure_while_handing_over_is_one_warning_and_the_old_pair_stays(tmp_path, monkeypatch, caplog):
    failures: list[int] = []
    node = handover(tmp_path, linear(), mode="latest", on_failure=lambda: failures.append(1))
    first = node.after_round(1, linear_weights(1.0), {}, sign_data(10))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("edge_node.handover.os.rename", full)
    caplog.set_level(logging.WARNING, logger="edge_node.node.handover")
    assert node.after_round(2, linear_weights(-1.0), {}, sign_data(10)) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "edge_node.node.handover"]
    assert len(warnings) == 1 and "No space left on device" in warnings[0] and "training goes on" in warnings[0]
    assert failures == [1]
    pair = read_pair(tmp_path)
    assert pair is not None and pair.folder.name == first and pair.info["round"] == 1


def test_a_regression_model_is_scored_by_its_error(tmp_path):
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 1))
    data = sign_data(10)
    targets = data.pool.test_x[:, :1].clone()  # y = first feature: the weights below are exact
    pool = type(data.pool)(data.pool.train_x, targets, data.pool.test_x, targets, (), (), 1)
    data = type(data).from_indices(pool, np.arange(10), np.arange(10))
    exact = {"1.weight": torch.tensor([[1.0, 0, 0, 0]]), "1.bias": torch.zeros(1)}
    node = handover(tmp_path, model, task=TASKS["regression"])
    assert node.after_round(1, exact, {}, data) is not None
    info = read_pair(tmp_path).info  # type: ignore[union-attr]
    assert info["metric"] == "mae" and info["metric_value"] == 0.0 and info["metric_higher_is_better"] is False
    off = {"1.weight": torch.tensor([[1.0, 0, 0, 0]]), "1.bias": torch.ones(1)}
    assert node.after_round(2, off, {}, data) is None  # MAE 1 against 0: kept


def test_a_daemon_on_a_full_disk_keeps_the_old_pair_and_trains_on(tmp_path, monkeypatch, caplog):
    """Round 1 is handed over; the disk is full while round 2's pair is written: one warning, one count, round 1's
    pair stays readable, and the node completes its rounds (checkpoint and records written)."""
    from edge_node.node.config import NodeConfig
    from edge_node.node.daemon import Node

    config = NodeConfig(
        node_id="n0", fleet="lab", num_clients=2, client_index=0, capacity="0.6", discovery="static",
        peers=("ghost@127.0.0.1:1",), listen="127.0.0.1:0", state_dir=tmp_path / "state", insecure=True, threads=1,
        epochs=1, batch_size=16, energy_backend="estimate", model="tests.plugin_factories:tiny_mlp",
        dataset="tests.plugin_factories:blobs", handover="latest",
    )  # fmt: skip
    node = Node(config)
    caplog.set_level(logging.WARNING, logger="edge_node.node.handover")
    try:
        node.startup()
        node.run_round(0)
        first = read_pair(config.state_dir)
        assert first is not None and first.info["round"] == 1 and first.info["node_id"] == "n0"

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr("edge_node.handover.os.rename", full)
        node.run_round(1)
        assert node.rounds_done == 2
        assert node.metrics.registry.get_sample_value("edge_node_export_failures_total") == 1.0
        handed = node.metrics.registry.get_sample_value("edge_node_handover_rounds_total", {"outcome": "handed_over"})
        assert handed == 1.0
    finally:
        node.shutdown()
    warnings = [r.getMessage() for r in caplog.records if r.name == "edge_node.node.handover"]
    assert len(warnings) == 1 and "No space left on device" in warnings[0], warnings
    pair = read_pair(config.state_dir)
    assert pair is not None and pair.folder.name == first.folder.name and pair.onnx == first.onnx
    assert (config.state_dir / ONNX_FILE).is_file()  # the compatibility file: written, the rename of the pair failed
