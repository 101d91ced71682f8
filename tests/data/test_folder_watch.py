"""A data folder re-read at each round (edge_node.data.folder_watch): cache hits and misses, the content split,
the newest-N bound, and files that cannot be used (skipped, counted once, never an error)."""

from __future__ import annotations

import io
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_node.data import folder_watch
from edge_node.data.content_split import is_test_sample
from edge_node.data.folder_watch import FolderWatch
from edge_node.errors import DataError

CLASSES = ("cat", "dog")
T0 = 1_700_000_000 * 10**9  # mtimes are set explicitly (ns), so "newest" does not depend on the clock


def png(value: int, size: int = 4) -> bytes:
    """A tiny PNG whose pixels (and so whose bytes) depend on ``value``."""
    pixels = np.full((size, size, 3), value % 256, dtype=np.uint8)
    pixels[0, 0] = [value // 256 % 256, value // 65536 % 256, 7]
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def put(path: Path, blob: bytes, age: int) -> Path:
    """Write ``blob`` at ``path`` with mtime ``T0 + age`` ns (a larger ``age`` is newer)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(blob)
    os.utime(path, ns=(T0 + age, T0 + age))
    return path


def split_tree(root: Path, train: int, test: int, start: int = 0) -> None:
    for i in range(start, start + train):
        put(root / "train" / CLASSES[i % 2] / f"{i}.png", png(i), i)
    for i in range(start, start + test):
        put(root / "test" / CLASSES[i % 2] / f"{i}.png", png(1000 + i), i)


def watch(root: Path, max_train: int | None = None, max_test: int | None = None) -> FolderWatch:
    return FolderWatch(root, CLASSES, test_fraction=0.2, max_train=max_train, max_test=max_test)


def test_a_second_read_decodes_only_new_or_changed_files(tmp_path: Path):
    split_tree(tmp_path, 10, 4)
    w = watch(tmp_path)
    first = w.read()
    assert (first.num_train, first.num_test, first.arrived, first.refused) == (10, 4, 14, {})
    assert w.decoded == 14 and first.train_x.shape == (10, 3, 4, 4) and first.train_x.dtype == np.uint8
    again = w.read()
    assert w.decoded == 14 and again.arrived == 0  # every file a cache hit
    np.testing.assert_array_equal(again.train_x, first.train_x)
    put(tmp_path / "train" / "cat" / "new.png", png(500), 100)  # a new file
    put(tmp_path / "train" / "dog" / "1.png", png(501), 101)  # a changed one (size or mtime)
    third = w.read()
    assert w.decoded == 16 and third.num_train == 11 and third.arrived == 2
    assert sorted(third.train_y.tolist()) == [0] * 6 + [1] * 5  # labels are the fleet's class indices


def test_the_flat_layout_splits_by_content_and_never_moves_a_sample(tmp_path: Path):
    blobs = [png(i) for i in range(200)]
    for i, blob in enumerate(blobs):
        put(tmp_path / CLASSES[i % 2] / f"{i}.png", blob, i)
    first = watch(tmp_path).read()
    expected_test = sum(is_test_sample(b, 0.2) for b in blobs)
    assert first.num_test == expected_test and first.num_train == 200 - expected_test
    assert 20 <= expected_test <= 60  # about the stated share
    # A restart (a new watch), renamed files and new arrivals: every old sample stays on its side.
    for i in range(0, 200, 3):
        (tmp_path / CLASSES[i % 2] / f"{i}.png").rename(tmp_path / CLASSES[i % 2] / f"renamed-{i}.png")
    for i in range(200, 260):
        put(tmp_path / CLASSES[i % 2] / f"{i}.png", png(i), i)
    second = watch(tmp_path).read()
    old_test = {bytes(x.tobytes()) for x in first.test_x}
    old_train = {bytes(x.tobytes()) for x in first.train_x}
    new_test = {bytes(x.tobytes()) for x in second.test_x}
    new_train = {bytes(x.tobytes()) for x in second.train_x}
    assert old_test <= new_test and old_train <= new_train and not (new_test & new_train)
    assert is_test_sample(blobs[5], 0.2) == is_test_sample(bytes(blobs[5]), 0.2)  # a pure function of the bytes


def test_the_newest_n_of_each_side_are_kept_and_the_cache_stays_bounded(tmp_path: Path):
    split_tree(tmp_path, 30, 12)
    w = watch(tmp_path, max_train=5, max_test=3)
    read = w.read()
    assert (read.num_train, read.num_test, read.listed) == (5, 3, 42)
    kept = sorted(int(v) for v in read.train_x[:, 0, 1, 1])  # pixel value = file index: the 5 newest
    assert kept == [25, 26, 27, 28, 29]
    assert w.decoded == 8 and w.cached_files() == 8 and w.held_bytes() == 8 * 3 * 4 * 4
    split_tree(tmp_path, 4, 0, start=30)  # 4 newer training files arrive
    read = w.read()
    assert sorted(int(v) for v in read.train_x[:, 0, 1, 1]) == [29, 30, 31, 32, 33] and read.arrived == 4
    assert w.decoded == 12 and w.cached_files() == 8 and w.held_bytes() == 8 * 3 * 4 * 4


def test_a_bad_file_is_skipped_counted_and_logged_once(tmp_path: Path, caplog):
    split_tree(tmp_path, 6, 2)
    put(tmp_path / "train" / "cat" / "truncated.png", png(77)[:30], 50)
    put(tmp_path / "train" / "cat" / "big.png", png(78, size=8), 51)
    put(tmp_path / "train" / "cat" / "notes.txt", b"hello", 52)
    put(tmp_path / "train" / "horse" / "h.png", png(79), 53)
    w = watch(tmp_path)
    with caplog.at_level(logging.WARNING, logger="edge_node.data.folder_watch"):
        read = w.read()
    expected = {"not_an_image": 1, "undecodable": 1, "unknown_class": 1, "wrong_size": 1}
    assert read.refused == expected and read.num_train == 6 and read.num_test == 2
    assert any("truncated.png (undecodable)" in r.getMessage() for r in caplog.records)
    assert len([r for r in caplog.records if "'horse' is not among the fleet's classes" in r.getMessage()]) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edge_node.data.folder_watch"):
        again = w.read()
    assert again.refused == {} and not caplog.records and w.decoded == 8  # not read, decoded or logged again
    put(tmp_path / "train" / "cat" / "truncated.png", png(77), 60)  # the camera finished writing it
    put(tmp_path / "train" / "horse" / "h2.png", png(80), 61)
    third = w.read()
    assert third.num_train == 7 and third.refused == {"unknown_class": 1}


def test_a_file_replaced_while_it_is_read_is_read_again_next_time(tmp_path: Path, monkeypatch):
    split_tree(tmp_path, 4, 2)
    target = tmp_path / "train" / "cat" / "0.png"
    real = folder_watch.read_file

    def replaced_during_read(path: Path):
        blob, before, _after = real(path)
        if path == target:
            put(target, png(999), 500)  # replaced after its bytes were read
        return blob, before, os.stat(path)

    monkeypatch.setattr(folder_watch, "read_file", replaced_during_read)
    w = watch(tmp_path)
    read = w.read()
    assert read.refused == {"changing": 1} and read.num_train == 3
    monkeypatch.setattr(folder_watch, "read_file", real)
    read = w.read()
    assert read.refused == {} and read.num_train == 4 and 999 % 256 in read.train_x[:, 0, 1, 1].tolist()


def test_a_folder_that_disappears_is_an_error_and_its_cache_survives(tmp_path: Path):
    root = tmp_path / "data"
    split_tree(root, 4, 2)
    w = watch(root)
    w.read()
    moved = tmp_path / "away"
    root.rename(moved)
    with pytest.raises(DataError, match=r"data folder .*data does not exist"):
        w.read()
    moved.rename(root)
    read = w.read()
    assert read.num_train == 4 and w.decoded == 6  # back: nothing decoded again


def test_a_folder_of_100000_tiny_files_is_listed_not_decoded(tmp_path: Path):
    """10x max_train_samples files arrive: the decoded bytes and the cache stay within the bound."""
    max_train, max_test, files = 10_000, 1_000, 100_000
    started = time.monotonic()
    blob = png(1)
    for cls in CLASSES:
        (tmp_path / "train" / cls).mkdir(parents=True)
    (tmp_path / "test" / "cat").mkdir(parents=True)
    for i in range(max_test):
        (tmp_path / "test" / "cat" / f"{i}.png").write_bytes(blob)
    for i in range(files):
        (tmp_path / "train" / CLASSES[i % 2] / f"{i:06d}.png").write_bytes(blob)
    written = time.monotonic() - started
    w = watch(tmp_path, max_train=max_train, max_test=max_test)
    started = time.monotonic()
    read = w.read()
    first_read = time.monotonic() - started
    bound = (max_train + max_test) * 3 * 4 * 4
    assert (read.num_train, read.num_test, read.listed) == (max_train, max_test, files + max_test)
    assert w.decoded == max_train + max_test and w.held_bytes() == bound
    assert w.cached_files() == max_train + max_test
    assert read.train_x.nbytes + read.test_x.nbytes == bound  # the entries hold views of these, not copies
    started = time.monotonic()
    w.read()
    again = time.monotonic() - started
    assert w.decoded == max_train + max_test  # nothing decoded twice
    print(f"100,000 files: written in {written:.1f} s, first read {first_read:.1f} s, second {again:.1f} s")
    shutil.rmtree(tmp_path)
