"""CIFAR-10 / CIFAR-100 from the python batches as Krizhevsky distributes them, and their download.

The batches are pickles. Unpickling runs whatever callables the stream names, so they are only ever
read with :class:`RestrictedUnpickler`, which resolves just the few numpy globals an array needs (and
``_codecs.encode`` restricted to latin-1, which protocol-2 pickles written by Python 3 use for bytes);
anything else, such as ``os.system``, raises :class:`DataError` before it can run. A batch must also
pass a format check first (pickle protocol header, size bound), and a tarball with the authors' file
name must match their published MD5.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import logging
import os
import pickle
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_node.data.sources import Tree, join, one_line
from edge_node.errors import DataError

_LOG = logging.getLogger(__name__)

MAX_BATCH_BYTES = 512 << 20  # the largest official file (cifar-100 train) is ~155 MB
DOWNLOAD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CifarSpec:
    """Where the authors put things for one of the two data sets."""

    name: str
    num_classes: int
    folder: str  # folder inside the tarball
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    label_key: bytes
    names_key: bytes
    tarball: str
    url: str
    md5: str


CIFAR10 = CifarSpec(
    name="cifar10",
    num_classes=10,
    folder="cifar-10-batches-py",
    train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_file="test_batch",
    meta_file="batches.meta",
    label_key=b"labels",
    names_key=b"label_names",
    tarball="cifar-10-python.tar.gz",
    url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    md5="c58f30108f718f92721af3b95e74349a",
)
CIFAR100 = CifarSpec(
    name="cifar100",
    num_classes=100,
    folder="cifar-100-python",
    train_files=("train",),
    test_file="test",
    meta_file="meta",
    label_key=b"fine_labels",
    names_key=b"fine_label_names",
    tarball="cifar-100-python.tar.gz",
    url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    md5="eb9058c3a382ffc7106e4002c42a8d85",
)
CIFAR_SPECS = {spec.name: spec for spec in (CIFAR10, CIFAR100)}
OFFICIAL_MD5 = {spec.tarball: spec.md5 for spec in (CIFAR10, CIFAR100)}

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
CIFAR100_CLASSES = tuple(
    """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly
    camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup
    dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower
    leopard lion lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid
    otter palm_tree pear pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray road
    rocket rose sea seal shark shrew skunk skyscraper snail snake spider squirrel streetcar sunflower
    sweet_pepper table tank telephone television tiger tractor train trout tulip turtle wardrobe whale
    willow_tree wolf woman worm""".split()  # noqa: SIM905
)
_DEFAULT_NAMES = {"cifar10": CIFAR10_CLASSES, "cifar100": CIFAR100_CLASSES}


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes, refusing any other codec."""
    if not isinstance(text, str) or codecs.lookup(encoding).name != "iso8859-1":
        raise DataError(f"pickle asks for _codecs.encode with encoding {encoding!r}; only latin-1 is allowed")
    return text.encode("latin-1")


_RECONSTRUCT = np.zeros(1).__reduce__()[0]  # numpy's array _reconstruct, wherever this numpy keeps it
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that can rebuild plain numpy arrays, dicts, lists, bytes and numbers, and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DataError(f"refusing pickle global {module}.{name}: not a numpy array component") from None


def restricted_loads(data: bytes, what: str) -> Any:
    """Unpickle ``data`` (named ``what`` in errors) after a format check, with the restricted unpickler."""
    if len(data) > MAX_BATCH_BYTES:
        raise DataError(f"{what} is {len(data)} bytes, larger than any CIFAR batch")
    if len(data) < 2 or data[0] != 0x80 or not 2 <= data[1] <= pickle.HIGHEST_PROTOCOL:
        raise DataError(f"{what} is not a CIFAR python batch (no pickle protocol 2+ header)")
    try:
        return RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    except DataError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise DataError(f"{what} is a corrupt pickle: {one_line(exc)}") from exc


def _parse_batch(obj: Any, spec: CifarSpec, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [n, 3, 32, 32], labels int64 [n]) from one unpickled batch dict."""
    if not isinstance(obj, dict) or b"data" not in obj or spec.label_key not in obj:
        raise DataError(f"{what} is not a {spec.name} batch: expected a dict with b'data' and {spec.label_key!r}")
    data, labels = obj[b"data"], obj[spec.label_key]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        shape = getattr(data, "shape", None)
        raise DataError(f"{what}: b'data' must be uint8 [n, 3072], got {type(data).__name__} {shape}")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: labels are not integers: {one_line(exc)}") from exc
    if y.shape != (data.shape[0],):
        raise DataError(f"{what}: {y.shape} labels for {data.shape[0]} images")
    if y.size and (y.min() < 0 or y.max() >= spec.num_classes):
        raise DataError(f"{what}: label {int(y.max())} out of range for {spec.num_classes} classes")
    # The authors store each row as 1024 red, 1024 green, 1024 blue values, rows of the image in order.
    return np.ascontiguousarray(data.reshape(-1, 3, 32, 32)), y


def find_batch_folder(tree: Tree, prefix: str, spec: CifarSpec) -> bool:
    """Whether ``prefix`` holds the authors' batch files of ``spec``."""
    needed = (*spec.train_files, spec.test_file)
    return all(tree.is_file(join(prefix, f)) for f in needed)


def load_batches(tree: Tree, prefix: str, spec: CifarSpec) -> dict[str, Any]:
    """Decode the python batches under ``prefix`` into arrays and class names."""
    parts = []
    for fname in (*spec.train_files, spec.test_file):
        rel = join(prefix, fname)
        what = f"{tree.label}:{rel}"
        parts.append(_parse_batch(restricted_loads(tree.read(rel), what), spec, what))
    train_x = np.concatenate([p[0] for p in parts[:-1]])
    train_y = np.concatenate([p[1] for p in parts[:-1]])
    test_x, test_y = parts[-1]
    class_names: tuple[str, ...] = _DEFAULT_NAMES[spec.name]
    meta_rel = join(prefix, spec.meta_file)
    if tree.is_file(meta_rel):
        meta = restricted_loads(tree.read(meta_rel), f"{tree.label}:{meta_rel}")
        names = meta.get(spec.names_key) if isinstance(meta, dict) else None
        if not isinstance(names, list) or len(names) != spec.num_classes:
            got = len(names) if isinstance(names, list) else type(names).__name__
            raise DataError(f"{tree.label}:{meta_rel}: expected {spec.num_classes} class names, got {got}")
        class_names = tuple(n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names)
    return {
        "train_x": train_x,
        "train_y": train_y,
        "test_x": test_x,
        "test_y": test_y,
        "class_names": class_names,
    }


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_official_tarball(path: Path) -> None:
    """A tarball named like the authors' must have their MD5; others are not checked (unknown sums)."""
    expected = OFFICIAL_MD5.get(path.name)
    if expected is None:
        return
    actual = file_md5(path)
    if actual != expected:
        raise DataError(f"bad checksum for {path}: md5 {actual}, the authors publish {expected}; delete it and retry")


def download(url: str, dest: Path, md5: str, *, timeout_s: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Fetch ``url`` to ``dest`` (temporary file, MD5 check, then rename); DataError on any failure."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310
            total = int(resp.headers.get("Content-Length") or 0)
            next_log = 0.0
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if total and size / total >= next_log:
                    _LOG.info("downloading %s: %.0f%% of %.1f MB", url, 100 * size / total, total / 1e6)
                    next_log += 0.1
        if digest.hexdigest() != md5:
            raise DataError(f"bad checksum for download of {url}: md5 {digest.hexdigest()}, expected {md5}")
        os.replace(tmp_name, dest)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        Path(tmp_name).unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        raise DataError(f"could not download {url} to {dest}: {' '.join(str(reason).split())}") from exc
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _LOG.info("downloaded %s (%d bytes) to %s", url, size, dest)
    return dest
