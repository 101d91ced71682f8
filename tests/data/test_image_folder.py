"""Image-folder trees and tarballs, Tiny-ImageNet layout, corrupt inputs, and the decoded-array cache."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_node.data import load_dataset
from edge_node.data.cache import CACHE_ENV, default_cache_dir
from edge_node.errors import DataError

from .conftest import CIFAR10_NAMES

Writer = Callable[..., dict[str, list[tuple[str, np.ndarray]]]]


def _npz_files(folder: Path) -> list[Path]:
    return list(folder.rglob("*.npz")) if folder.exists() else []


def _decode_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    """One "decoded N images" record per decoding pass of image files."""
    return [r.getMessage() for r in caplog.records if re.match(r"decoded \d+ images", r.getMessage())]


def test_image_folder_tree_loads_with_sorted_class_labels(tmp_path: Path, write_image_tree: Writer) -> None:
    written = write_image_tree(tmp_path / "tree")
    ds = load_dataset("cifar10", tmp_path / "tree", cache_dir=tmp_path / "cache")
    assert ds.class_names == tuple(CIFAR10_NAMES)
    assert ds.train_x.shape == (30, 3, 32, 32) and ds.test_x.shape == (20, 3, 32, 32)
    assert np.bincount(ds.train_y).tolist() == [3] * 10 and np.bincount(ds.test_y).tolist() == [2] * 10
    for split, x, y in (("train", ds.train_x, ds.train_y), ("test", ds.test_x, ds.test_y)):
        for i, (cls, img) in enumerate(written[split]):  # written in sorted class order, file order within
            assert CIFAR10_NAMES[y[i]] == cls
            assert np.array_equal(x[i].transpose(1, 2, 0), img), f"{split} image {i} differs from the file"


def test_tarball_of_a_tree_gives_the_same_arrays(
    tmp_path: Path, write_image_tree: Writer, make_tarball: Callable[[Path, Path], Path]
) -> None:
    write_image_tree(tmp_path / "tree")
    tgz = make_tarball(tmp_path / "tree", tmp_path / "tree.tar.gz")
    from_dir = load_dataset("cifar10", tmp_path / "tree", cache_dir=tmp_path / "cache")
    from_tar = load_dataset("cifar10", tgz, cache_dir=tmp_path / "cache")
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert np.array_equal(getattr(from_dir, name), getattr(from_tar, name))
    # A tree wrapped in one top-level folder inside the tarball is found too.
    wrapped = tmp_path / "wrapped"
    shutil.copytree(tmp_path / "tree", wrapped / "cifar10")
    tgz2 = make_tarball(wrapped, tmp_path / "wrapped.tar.gz")
    assert np.array_equal(load_dataset("cifar10", tgz2, cache_dir=tmp_path / "cache").train_x, from_dir.train_x)


def test_second_load_comes_from_the_cache_until_the_source_changes(
    tmp_path: Path, write_image_tree: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    write_image_tree(tmp_path / "tree")
    cache = tmp_path / "cache"
    caplog.set_level(logging.INFO, logger="edge_node.data")
    first = load_dataset("cifar10", tmp_path / "tree", cache_dir=cache)
    assert len(_decode_logs(caplog)) == 1 and len(_npz_files(cache)) == 1
    caplog.clear()
    second = load_dataset("cifar10", tmp_path / "tree", cache_dir=cache)
    assert _decode_logs(caplog) == [], "decoded again despite a cache entry"
    assert np.array_equal(first.train_x, second.train_x) and first.mean == second.mean
    # Replace one image: size/mtime change, so the cache key changes and the new pixels are decoded.
    victim = tmp_path / "tree" / "train" / "airplane" / "0000.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(victim)
    os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 10**9))
    caplog.clear()
    third = load_dataset("cifar10", tmp_path / "tree", cache_dir=cache)
    assert len(_decode_logs(caplog)) == 1
    assert (third.train_x[0] == 0).all() and not (first.train_x[0] == 0).all()


def test_cache_dir_defaults_to_the_environment_variable(
    tmp_path: Path, write_image_tree: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_image_tree(tmp_path / "tree")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "envcache"))
    assert default_cache_dir() == tmp_path / "envcache"
    load_dataset("cifar10", tmp_path / "tree")
    assert len(_npz_files(tmp_path / "envcache")) == 1


def test_a_corrupt_cache_entry_is_rebuilt(tmp_path: Path, write_image_tree: Writer) -> None:
    write_image_tree(tmp_path / "tree")
    first = load_dataset("cifar10", tmp_path / "tree", cache_dir=tmp_path / "cache")
    (entry,) = _npz_files(tmp_path / "cache")
    entry.write_bytes(b"not a zip file")
    again = load_dataset("cifar10", tmp_path / "tree", cache_dir=tmp_path / "cache")
    assert np.array_equal(first.train_x, again.train_x)
    assert entry.stat().st_size > 1000


def test_missing_test_split_is_a_data_error(tmp_path: Path, write_image_tree: Writer) -> None:
    write_image_tree(tmp_path / "tree")
    shutil.rmtree(tmp_path / "tree" / "test")
    with pytest.raises(DataError, match="no test/ split"):
        load_dataset("cifar10", tmp_path / "tree", cache_dir=tmp_path / "cache")
    assert not _npz_files(tmp_path / "cache")


def test_unreadable_image_is_a_data_error_naming_the_file(
    tmp_path: Path, write_image_tree: Writer, make_tarball: Callable[[Path, Path], Path]
) -> None:
    write_image_tree(tmp_path / "tree")
    (tmp_path / "tree" / "test" / "frog" / "0001.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated jpeg")
    with pytest.raises(DataError, match=r"unreadable image .*test/frog/0001\.jpg") as err:
        load_dataset("cifar10", tmp_path / "tree", cache_dir=tmp_path / "cache")
    assert "\n" not in str(err.value)
    tgz = make_tarball(tmp_path / "tree", tmp_path / "tree.tar.gz")
    with pytest.raises(DataError, match=r"test/frog/0001\.jpg"):
        load_dataset("cifar10", tgz, cache_dir=tmp_path / "cache")
    assert not _npz_files(tmp_path / "cache")


def test_wrong_class_count_or_image_size_is_a_data_error(tmp_path: Path, write_image_tree: Writer) -> None:
    write_image_tree(tmp_path / "nine", classes=CIFAR10_NAMES[:9])
    with pytest.raises(DataError, match="9 class folders, expected 10"):
        load_dataset("cifar10", tmp_path / "nine", cache_dir=tmp_path / "cache")
    write_image_tree(tmp_path / "big", size=40)
    with pytest.raises(DataError, match="size 40x40, expected 32x32"):
        load_dataset("cifar10", tmp_path / "big", cache_dir=tmp_path / "cache")
    assert not _npz_files(tmp_path / "cache")


def test_a_file_that_is_not_a_tarball_is_a_data_error(tmp_path: Path) -> None:
    bogus = tmp_path / "data.tar.gz"
    bogus.write_bytes(b"\x1f\x8b" + os.urandom(200))
    with pytest.raises(DataError, match="not a readable tar archive"):
        load_dataset("cifar10", bogus, cache_dir=tmp_path / "cache")
    assert not _npz_files(tmp_path / "cache")


def test_tiny_imagenet_layout(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    root = tmp_path / "tiny-imagenet-200"
    wnids = [f"n{i:08d}" for i in range(200)]
    ann = []
    for i, wnid in enumerate(wnids):
        (root / "train" / wnid / "images").mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(
            root / "train" / wnid / "images" / f"{wnid}_0.JPEG", format="JPEG"
        )
        if i % 50 == 0:
            ann.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63")
    (root / "val" / "images").mkdir(parents=True)
    for line in ann:
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(
            root / "val" / "images" / line.split("\t")[0], format="JPEG"
        )
    (root / "val" / "val_annotations.txt").write_text("\n".join(ann) + "\n")
    (root / "words.txt").write_text("".join(f"{w}\tthing {i}, other name\n" for i, w in enumerate(wnids)))
    ds = load_dataset("tiny-imagenet", tmp_path, cache_dir=tmp_path / "cache")
    assert ds.num_classes == 200 and ds.train_x.shape == (200, 3, 64, 64)
    assert ds.test_y.tolist() == [0, 50, 100, 150] and ds.test_x.shape == (4, 3, 64, 64)
    assert ds.class_names[3] == "thing 3"


def test_a_flipped_byte_inside_a_gzip_tarball_is_caught_by_its_checksum(
    tmp_path: Path, write_image_tree: Writer
) -> None:
    """gzip at level 0 stores its input: a flipped bit inside an image's bytes changes pixels, not the
    stream's structure. Only gzip's CRC-32 at the end of the stream can tell, and it must."""
    write_image_tree(tmp_path / "tree", n_train=2, n_test=1)
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz", compresslevel=0) as tar:
        for child in sorted((tmp_path / "tree").iterdir()):
            tar.add(child, arcname=child.name)
    blob = bytearray(good.read_bytes())
    # Flip a bit inside an image's stored bytes (found verbatim in the stream), never in a tar header.
    image = max((f for f in (tmp_path / "tree").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    data = image.read_bytes()
    at = blob.find(data[len(data) // 2 : len(data) // 2 + 64])
    assert at > 0, "the image's bytes should be stored uncompressed in the gzip stream"
    blob[at + 32] ^= 0x01
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(bytes(blob))
    with pytest.raises(DataError, match=r"bad\.tar\.gz is not a readable tar archive .*CRC check failed") as err:
        load_dataset("cifar10", bad, cache_dir=tmp_path / "cache")
    assert "\n" not in str(err.value)
    assert not _npz_files(tmp_path / "cache")


def test_a_damaged_header_in_a_plain_tar_does_not_silently_drop_files(tmp_path: Path, write_image_tree: Writer) -> None:
    """tarfile ends the archive quietly at a bad header after the first: that must not pass as the whole set."""
    write_image_tree(tmp_path / "tree", n_train=2, n_test=2)
    plain = tmp_path / "tree.tar"
    with tarfile.open(plain, "w") as tar:
        for child in sorted((tmp_path / "tree").iterdir()):
            tar.add(child, arcname=child.name)
    with tarfile.open(plain) as tar:
        headers = [m.offset for m in tar.getmembers()]
    blob = bytearray(plain.read_bytes())
    blob[headers[len(headers) // 2] + 148] ^= 0x55  # the header's checksum field
    plain.write_bytes(bytes(blob))
    with pytest.raises(DataError, match="damaged header") as err:
        load_dataset("cifar10", plain, cache_dir=tmp_path / "cache")
    assert "\n" not in str(err.value)


def test_a_file_that_is_no_archive_at_all_is_one_line(tmp_path: Path) -> None:
    """tarfile lists every method it tried on separate lines; the user gets them on one."""
    bogus = tmp_path / "data.tar.gz"
    bogus.write_bytes(b"just some text, not an archive\n" * 40)
    with pytest.raises(DataError, match="not a readable tar archive") as err:
        load_dataset("cifar10", bogus, cache_dir=tmp_path / "cache")
    assert "\n" not in str(err.value) and "method gz" in str(err.value)
