"""CIFAR python batches: loading the authors' format, the restricted unpickler, checksums and download."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import os
import pickle
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_node.data import cifar, load_dataset
from edge_node.data.cifar import CIFAR10_CLASSES, download, restricted_loads
from edge_node.errors import DataError


def _npz_files(folder: Path) -> list[Path]:
    return list(folder.rglob("*.npz")) if folder.exists() else []


def test_loads_fake_cifar10_batches_in_the_authors_layout(
    tmp_path: Path, write_cifar10_batches: Callable[..., dict[str, np.ndarray]]
) -> None:
    src = write_cifar10_batches(tmp_path / "data" / "cifar-10-batches-py")
    ds = load_dataset("cifar10", tmp_path / "data", cache_dir=tmp_path / "cache")
    assert ds.name == "cifar10" and ds.num_classes == 10 and ds.class_names == CIFAR10_CLASSES
    assert ds.train_x.shape == (100, 3, 32, 32) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (30, 3, 32, 32)
    assert ds.train_y.dtype == np.int64 and np.array_equal(ds.train_y, src["train_y"])
    assert np.array_equal(ds.test_y, src["test_y"])
    # Each row is 1024 red, then green, then blue values, image rows in order: NCHW is a plain reshape.
    i, c, h, w = 17, 2, 5, 30
    assert ds.train_x[i, c, h, w] == src["train_data"][i, c * 1024 + h * 32 + w]
    assert np.array_equal(ds.test_x.reshape(30, -1), src["test_data"])
    flat = src["train_data"].reshape(-1, 3, 1024) / 255.0
    assert ds.mean == pytest.approx(tuple(flat.mean(axis=(0, 2))), abs=1e-9)
    assert ds.std == pytest.approx(tuple(flat.std(axis=(0, 2))), abs=1e-9)
    assert len(_npz_files(tmp_path / "cache")) == 1


def test_loads_fake_cifar100_batches(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for split, n in (("train", 50), ("test", 20)):
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"fine_labels": [int(v) for v in rng.integers(0, 100, n)],
                 b"coarse_labels": [int(v) for v in rng.integers(0, 20, n)]}  # fmt: skip
        (folder / split).write_bytes(pickle.dumps(batch, protocol=2))
    ds = load_dataset("cifar100", tmp_path, cache_dir=tmp_path / "cache")
    assert ds.num_classes == 100 and len(ds.class_names) == 100 and ds.class_names[0] == "apple"
    assert ds.train_x.shape == (50, 3, 32, 32) and ds.test_x.shape == (20, 3, 32, 32)


def test_tarball_of_batches_loads_and_an_official_name_needs_the_official_md5(
    tmp_path: Path,
    write_cifar10_batches: Callable[..., dict[str, np.ndarray]],
    make_tarball: Callable[[Path, Path], Path],
) -> None:
    write_cifar10_batches(tmp_path / "src" / "cifar-10-batches-py")
    tgz = make_tarball(tmp_path / "src", tmp_path / "my-batches.tar.gz")
    ds = load_dataset("cifar10", tgz, cache_dir=tmp_path / "cache")
    assert ds.train_x.shape == (100, 3, 32, 32)

    fake_official = tmp_path / "dl" / "cifar-10-python.tar.gz"
    fake_official.parent.mkdir()
    fake_official.write_bytes(tgz.read_bytes())
    with pytest.raises(DataError, match="bad checksum") as err:
        load_dataset("cifar10", fake_official.parent, cache_dir=tmp_path / "cache2")
    assert "\n" not in str(err.value)
    assert not _npz_files(tmp_path / "cache2")


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_restricted_unpickler_refuses_a_malicious_batch(
    tmp_path: Path, write_cifar10_batches: Callable[..., dict[str, np.ndarray]]
) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar10_batches(folder)
    marker = tmp_path / "pwned"
    evil = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1], b"x": _Evil(marker)}
    (folder / "data_batch_3").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(DataError, match=r"refusing pickle global (posix|os|nt)\.system"):
        load_dataset("cifar10", tmp_path, cache_dir=tmp_path / "cache")
    assert not marker.exists(), "the pickle's payload ran"
    assert not _npz_files(tmp_path / "cache")


def test_restricted_unpickler_allows_only_plain_arrays() -> None:
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
    blob = pickle.dumps({b"data": arr}, protocol=2)
    assert np.array_equal(restricted_loads(blob, "x")[b"data"], arr)
    # The authors' files name numpy.core.multiarray (numpy 1.x); that spelling must load too.
    old = blob.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert np.array_equal(restricted_loads(old, "x")[b"data"], arr)
    for payload in (pickle.dumps(threading.Lock, protocol=2), pickle.dumps(_Evil(Path("/nonexistent/x")), protocol=4)):
        with pytest.raises(DataError, match="refusing pickle global"):
            restricted_loads(payload, "x")
    # _codecs.encode with another codec than latin-1 is refused.
    sneaky = b"\x80\x02c_codecs\nencode\nq\x00X\x01\x00\x00\x00aX\x05\x00\x00\x00rot13\x86R."
    with pytest.raises(DataError, match="latin-1"):
        restricted_loads(sneaky, "x")
    with pytest.raises(DataError, match="not a CIFAR python batch"):
        restricted_loads(b"garbage that is not a pickle", "x")
    with pytest.raises(DataError, match="corrupt pickle"):
        restricted_loads(blob[: len(blob) // 2], "x")


def test_wrong_batch_contents_raise_data_error(
    tmp_path: Path, write_cifar10_batches: Callable[..., dict[str, np.ndarray]]
) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar10_batches(folder)
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, 2))
    with pytest.raises(DataError, match="out of range"):
        load_dataset("cifar10", tmp_path, cache_dir=tmp_path / "cache")
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, 2))
    with pytest.raises(DataError, match=r"uint8 \[n, 3072\]"):
        load_dataset("cifar10", tmp_path, cache_dir=tmp_path / "cache")
    assert not _npz_files(tmp_path / "cache")


def test_absent_data_gives_a_one_line_message_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", tmp_path / "nowhere", cache_dir=tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "nowhere") in msg and "download" in msg


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A throwaway HTTP server on 127.0.0.1 serving ``tmp_path/www``; stopped and joined afterwards."""
    www = tmp_path / "www"
    www.mkdir()
    handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(*a, directory=str(www), **kw)  # noqa: E731
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-http")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", www
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_download_checks_md5_and_writes_atomically(http_root: tuple[str, Path], tmp_path: Path) -> None:
    url, www = http_root
    payload = os.urandom(300_000)
    (www / "file.tar.gz").write_bytes(payload)
    good_md5 = hashlib.md5(payload).hexdigest()
    dest = tmp_path / "data" / "file.tar.gz"
    download(f"{url}/file.tar.gz", dest, good_md5, timeout_s=5)
    assert dest.read_bytes() == payload

    other = tmp_path / "data2" / "file.tar.gz"
    with pytest.raises(DataError, match="bad checksum"):
        download(f"{url}/file.tar.gz", other, "0" * 32, timeout_s=5)
    assert not other.exists() and list(other.parent.iterdir()) == [], "a partial download was left behind"
    with pytest.raises(DataError, match="could not download"):
        download(f"{url}/missing.tar.gz", other, good_md5, timeout_s=5)
    assert list(other.parent.iterdir()) == []


def test_load_dataset_downloads_checks_and_loads_the_authors_tarball(
    http_root: tuple[str, Path],
    tmp_path: Path,
    write_cifar10_batches: Callable[..., dict[str, np.ndarray]],
    make_tarball: Callable[[Path, Path], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--download` end to end: absent data -> fetched from the (local) server -> MD5 checked -> decoded."""
    url, www = http_root
    src = write_cifar10_batches(tmp_path / "src" / "cifar-10-batches-py")
    tgz = make_tarball(tmp_path / "src", www / "cifar-10-python.tar.gz")
    md5 = hashlib.md5(tgz.read_bytes()).hexdigest()
    spec = dataclasses.replace(cifar.CIFAR10, url=f"{url}/cifar-10-python.tar.gz", md5=md5)
    monkeypatch.setitem(cifar.CIFAR_SPECS, "cifar10", spec)
    monkeypatch.setitem(cifar.OFFICIAL_MD5, spec.tarball, md5)
    data_dir = tmp_path / "data"
    with pytest.raises(DataError, match="--download"):  # without the flag: nothing is fetched
        load_dataset("cifar10", data_dir, cache_dir=tmp_path / "cache")
    assert not data_dir.exists()
    ds = load_dataset("cifar10", data_dir, cache_dir=tmp_path / "cache", download=True)
    assert np.array_equal(ds.train_y, src["train_y"]) and ds.train_x.shape == (100, 3, 32, 32)
    assert (data_dir / "cifar-10-python.tar.gz").read_bytes() == tgz.read_bytes()
    # A server handing out other bytes than the published checksum: refused, nothing kept or cached.
    monkeypatch.setitem(cifar.CIFAR_SPECS, "cifar10", dataclasses.replace(spec, md5="0" * 32))
    with pytest.raises(DataError, match="bad checksum") as err:
        load_dataset("cifar10", tmp_path / "data2", cache_dir=tmp_path / "cache2", download=True)
    assert "\n" not in str(err.value) and not (tmp_path / "data2" / "cifar-10-python.tar.gz").exists()
    assert not _npz_files(tmp_path / "cache2")


def test_download_without_network_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No route to the authors' server (here: a closed local port): one line naming the URL and the fix."""
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/cifar-100-python.tar.gz"
    monkeypatch.setitem(cifar.CIFAR_SPECS, "cifar100", dataclasses.replace(cifar.CIFAR100, url=url))
    with pytest.raises(DataError) as err:
        load_dataset("cifar100", tmp_path / "data", cache_dir=tmp_path / "cache", download=True)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"could not download {url}")
    assert f"put cifar-100-python.tar.gz (or cifar-100-python/) into {tmp_path / 'data'}" in msg
    assert [p.name for p in (tmp_path / "data").iterdir()] == []  # no partial file left behind
