"""Data that arrives while the node runs (data_refresh = "round"): the settings it needs, the node-level
re-read (a folder that disappears, a factory called again), and a running daemon that trains on more samples
the round after they arrive, skipping and counting a corrupt file."""

from __future__ import annotations

import io
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from edge_node.errors import ConfigError, DataError
from edge_node.node.config import NodeConfig
from edge_node.node.data_refresh import DataRefresh, open_local_data
from edge_node.records import read_records
from tests import plugin_factories

CLASSES = ("cat", "dog")
T0 = 1_700_000_000 * 10**9


def _png(value: int, size: int = 32) -> bytes:
    rng = np.random.default_rng(value)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def _images(root: Path, split: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        path = root / split / CLASSES[i % 2] / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_png(i if split == "train" else 10_000 + i))
        os.utime(path, ns=(T0 + i, T0 + i))


def _config(tmp_path: Path, **overrides: object) -> NodeConfig:
    settings: dict[str, object] = dict(
        node_id="solo", fleet="test", capacity="0.4", discovery="static", peers=("ghost@127.0.0.1:1",),
        listen="127.0.0.1:0", state_dir=tmp_path / "state", insecure=True, threads=1, epochs=1, batch_size=8,
        energy_backend="estimate", export_onnx=False, data=tmp_path / "data", classes=CLASSES,
        data_refresh="round",
    )  # fmt: skip
    settings.update(overrides)
    return NodeConfig(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"data": None, "classes": ()}, r"re-reads the node's own data .* dataset = 'demo' is a built-in set's slice"),
        ({"classes": ()}, r"needs the fleet's classes"),
        ({"data": None, "classes": (), "dataset": "tests.plugin_factories:growing_blobs"}, r"needs num_classes"),
        ({"data": None, "dataset": "tests.plugin_factories:growing_blobs", "num_clients": 2, "client_index": 0},
         r"a data factory with num_clients=2"),
        ({"privacy": "dp-sgd", "epsilon": 4.0}, r"privacy dp-sgd .* data_refresh = \"round\" excludes it"),
        ({"data_refresh": "hourly"}, r"data_refresh='hourly' must be one of off, round"),
        ({"data_test_fraction": 1.0}, r"data_test_fraction=1.0 must be a share between 0 and 1"),
        ({"max_train_samples": -1}, r"max_train_samples=-1 must be at least 0"),
        ({"data_refresh": "off", "max_test_samples": 10}, r"max_test_samples=10 .* needs data_refresh = \"round\""),
    ],
)  # fmt: skip
def test_data_refresh_is_refused_where_it_cannot_keep_its_promises(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, **overrides)


def test_off_is_todays_read_once_and_a_start_without_data_is_refused(tmp_path):
    _images(tmp_path / "data", "train", 4)
    _images(tmp_path / "data", "test", 2)
    local, refresh = open_local_data(_config(tmp_path, data_refresh="off"), 0, torch.device("cpu"))
    assert refresh is None and (local.data.num_train, local.data.num_test) == (4, 2)
    with pytest.raises(DataError, match="does not exist"):
        open_local_data(_config(tmp_path, data=tmp_path / "nothing"), 0, torch.device("cpu"))


def test_a_folder_that_disappears_keeps_the_data_the_node_had(tmp_path, caplog):
    data = tmp_path / "data"
    _images(data, "train", 6)
    _images(data, "test", 2)
    refresh = DataRefresh(_config(tmp_path, max_train_samples=4), torch.device("cpu"))
    assert (refresh.local.data.num_train, refresh.local.data.num_test, refresh.arrived) == (4, 2, 0)
    mean = refresh.local.data.pool.mean
    shutil.move(data, tmp_path / "unmounted")
    with caplog.at_level(logging.WARNING, logger="edge_node.node.data_refresh"):
        for _ in range(3):
            local = refresh.refresh()
    assert local.data.num_train == 4 and refresh.take_refused() == {"folder_missing": 3}
    assert len([r for r in caplog.records if "does not exist" in r.getMessage()]) == 1  # logged once
    shutil.move(tmp_path / "unmounted", data)
    _images(data, "train", 2, start=6)
    local = refresh.refresh()
    assert local.data.num_train == 4 and refresh.arrived == 2 and refresh.take_refused() == {}
    assert local.data.pool.mean == mean  # the normalisation stays the first read's
    for path in (data / "test").rglob("*.png"):
        path.unlink()  # an empty side: the node keeps what it had
    assert refresh.refresh().data.num_test == 2 and refresh.take_refused() == {"no_samples": 1}


def test_a_factory_is_called_again_and_its_split_never_moves(tmp_path, monkeypatch):
    monkeypatch.setitem(plugin_factories.GROWING, "rows", 100)
    config = _config(tmp_path, data=None, classes=(), dataset="tests.plugin_factories:growing_blobs",
                     num_classes=3, max_train_samples=0, max_test_samples=0)  # fmt: skip
    refresh = DataRefresh(config, torch.device("cpu"))
    first = refresh.local.data
    assert first.num_train + first.num_test == 100 and 5 <= first.num_test <= 40
    test_rows = {r.numpy().tobytes() for r in first.pool.test_x}
    monkeypatch.setitem(plugin_factories.GROWING, "rows", 130)
    second = refresh.refresh().data
    assert second.num_train + second.num_test == 130 and refresh.arrived == 30
    assert test_rows <= {r.numpy().tobytes() for r in second.pool.test_x}  # every test sample stayed a test sample
    monkeypatch.setitem(plugin_factories.GROWING, "fail", True)
    assert refresh.refresh().data.num_train == second.num_train and refresh.take_refused() == {"factory_error": 1}


def test_a_running_daemon_trains_on_the_samples_that_arrived_and_skips_a_corrupt_one(tmp_path):
    from edge_node.node.daemon import Node

    data = tmp_path / "data"
    _images(data, "train", 12)
    _images(data, "test", 4)
    node = Node(_config(tmp_path))
    try:
        node.startup()
        node.run_round(0)
        _images(data, "train", 6, start=12)  # six new samples arrive between rounds...
        corrupt = data / "train" / "cat" / "truncated.png"
        corrupt.write_bytes(_png(99)[:100])  # ...and a file the camera did not finish
        node.run_round(1)
        node.run_round(2)
        first, second, third = read_records(tmp_path / "state")
        assert (first["samples"], first["test_samples"], first["samples_arrived"]) == (12, 4, 0)
        assert (second["samples"], second["test_samples"], second["samples_arrived"]) == (18, 4, 6)
        assert second["data_refused"] == {"undecodable": 1}
        assert (third["samples"], third["samples_arrived"], third["data_refused"]) == (18, 0, {})  # counted once
        status = node.status()
        assert (status["train_samples"], status["test_samples"], status["data_refresh"]) == (18, 4, "round")
        assert status["data_refused"] == {"undecodable": 1}
        registry = node.metrics.registry
        assert registry.get_sample_value("edge_node_data_refused_total", {"reason": "undecodable"}) == 1
        assert registry.get_sample_value("edge_node_train_samples") == 18
        assert registry.get_sample_value("edge_node_samples_arrived_total") == 6
    finally:
        node.shutdown()
