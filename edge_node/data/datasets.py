"""The :class:`Dataset` record and :func:`load_dataset`: find a data set's files, decode them once, cache.

``data_dir`` may be a folder holding the authors' python batches (or their tarball), an image-folder
tree ``train/<class>/*`` + ``test/<class>/*`` (Tiny-ImageNet: its own layout), or a ``.tar.gz`` of any of
these. Decoded arrays are cached (see :mod:`edge_node.data.cache`), so only the first load is slow.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_node.data import cache, cifar, demo, image_folder
from edge_node.data.sources import DirTree, TarTree, Tree, join
from edge_node.errors import DataError
from edge_node.plugins import is_factory_path

_LOG = logging.getLogger(__name__)

DATASET_NAMES = ("cifar10", "cifar100", "tiny-imagenet", "demo")
DATA_DIR_ENV = "EDGE_NODE_DATA_DIR"
_CACHE_FORMAT = "1"  # bump when the cached arrays' meaning changes
_STATS_CHUNK = 2048
_ARRAY_KEYS = ("train_x", "train_y", "test_x", "test_y", "class_names", "mean", "std")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A decoded data set, ready to be moved to a device once: samples and int64 labels.

    Images are uint8 ``[N, 3, H, W]`` (augmented and normalised per channel when batched); any other samples
    (audio features, sensor windows, tabular rows: a data factory's) are float32 ``[N, *shape]``, batched as
    they are, with empty ``mean``/``std``.
    """

    name: str
    train_x: np.ndarray  # uint8 [N, 3, H, W] images, or float32 [N, *shape] samples
    train_y: np.ndarray  # int64 [N]
    test_x: np.ndarray  # like train_x, [M, ...]
    test_y: np.ndarray  # int64 [M]
    num_classes: int
    class_names: tuple[str, ...]
    mean: tuple[float, ...]  # images: per channel, in [0, 1] units, of the training images; else ()
    std: tuple[float, ...]
    # A task whose targets are not the labels (regression, multi-label: edge_node.algorithm.tasks): float32
    # [N, K] targets; the int64 labels above are then the partitions' keys (quantile bins, label sets).
    train_t: np.ndarray | None = None
    test_t: np.ndarray | None = None

    def __post_init__(self) -> None:
        image = self.train_x.dtype == np.uint8
        for split, x, y in (("train", self.train_x, self.train_y), ("test", self.test_x, self.test_y)):
            if image and (x.dtype != np.uint8 or x.ndim != 4 or x.shape[1] != 3):
                raise DataError(f"{self.name} {split} images must be uint8 [N, 3, H, W], got {x.dtype} {x.shape}")
            if not image and (x.dtype != np.float32 or x.ndim < 2):
                raise DataError(f"{self.name} {split} samples must be float32 [N, ...], got {x.dtype} {x.shape}")
            if y.dtype != np.int64 or y.shape != (x.shape[0],):
                raise DataError(f"{self.name} {split} labels must be int64 [{x.shape[0]}], got {y.dtype} {y.shape}")
            if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                raise DataError(f"{self.name} {split} labels outside 0..{self.num_classes - 1}")
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise DataError(f"{self.name}: train samples {self.train_x.shape[1:]} vs test {self.test_x.shape[1:]}")
        if (self.train_t is None) != (self.test_t is None):
            raise DataError(f"{self.name}: targets for one split only")
        for split, t, x in (("train", self.train_t, self.train_x), ("test", self.test_t, self.test_x)):
            if t is not None and (t.dtype != np.float32 or t.ndim != 2 or t.shape[0] != x.shape[0]):
                wanted = f"float32 [{x.shape[0]}, K]"
                raise DataError(f"{self.name} {split} targets must be {wanted}, got {t.dtype} {t.shape}")
        if len(self.class_names) != self.num_classes:
            raise DataError(f"{self.name}: {len(self.class_names)} class names for {self.num_classes} classes")
        channels = 3 if image else 0
        if len(self.mean) != channels or len(self.std) != channels:
            raise DataError(f"{self.name}: mean and std need {channels} values (one per image channel)")

    @property
    def num_outputs(self) -> int:
        """The model's output width: the class count, or the targets' width."""
        return self.num_classes if self.train_t is None else int(self.train_t.shape[1])

    @property
    def is_image(self) -> bool:
        """True for uint8 images, which get the CIFAR augmentation; False for a factory's float samples."""
        return bool(self.train_x.dtype == np.uint8)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample: (3, H, W) for images."""
        return tuple(int(d) for d in self.train_x.shape[1:])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(3, H, W) of an image data set."""
        if not self.is_image:
            raise DataError(f"{self.name} holds samples of shape {self.input_shape}, not images")
        return (3, int(self.train_x.shape[2]), int(self.train_x.shape[3]))


@dataclass(frozen=True)
class _Spec:
    num_classes: int
    size: tuple[int, int]  # (W, H) every image must have
    layouts: tuple[str, ...]  # accepted layouts, in the order they are looked for
    subfolders: tuple[str, ...]  # folders (inside data_dir or the tarball) where the authors put the files
    hint: str  # how to provide the data, for the not-found message


_SPECS = {
    "cifar10": _Spec(
        10, (32, 32), ("cifar10-batches", "image-folder"), ("cifar-10-batches-py",),
        "cifar-10-batches-py/, cifar-10-python.tar.gz, or an image-folder tree train/<class>/ + test/<class>/ "
        "(or a .tar.gz of one); use --download (download=True) to fetch the authors' tarball",
    ),
    "cifar100": _Spec(
        100, (32, 32), ("cifar100-batches", "image-folder"), ("cifar-100-python",),
        "cifar-100-python/, cifar-100-python.tar.gz, or an image-folder tree train/<class>/ + test/<class>/ "
        "(or a .tar.gz of one); use --download (download=True) to fetch the authors' tarball",
    ),
    "tiny-imagenet": _Spec(
        200, (64, 64), ("tiny-imagenet", "image-folder"), ("tiny-imagenet-200",),
        "tiny-imagenet-200/ (train/<wnid>/images/, val/images/ + val/val_annotations.txt), a .tar.gz of it, "
        "or an image-folder tree train/<class>/ + test/<class>/",
    ),
}  # fmt: skip


def check_dataset_name(name: object) -> None:
    """Refuse a data set name that is neither built in nor a factory ``package.module:function``."""
    if not isinstance(name, str) or not (name in DATASET_NAMES or is_factory_path(name)):
        names = ", ".join(DATASET_NAMES)
        raise DataError(f"dataset={name!r} must be one of {names} or a factory package.module:function")


def default_data_dir() -> Path:
    """``$EDGE_NODE_DATA_DIR`` if set, else ``<cache dir>/datasets``."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else cache.default_cache_dir() / "datasets"


def channel_stats(x: np.ndarray) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Per-channel mean and std in [0, 1] units of uint8 NCHW images, in chunks to bound memory."""
    total = np.zeros(3)
    total_sq = np.zeros(3)
    for start in range(0, len(x), _STATS_CHUNK):
        chunk = x[start : start + _STATS_CHUNK].astype(np.float32)  # integers < 2**24: sums stay exact
        total += chunk.sum(axis=(0, 2, 3), dtype=np.float64)
        total_sq += (chunk * chunk).sum(axis=(0, 2, 3), dtype=np.float64)
    count = x.shape[0] * x.shape[2] * x.shape[3]
    if count == 0:
        return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    mean = total / count / 255.0
    std = np.sqrt(np.maximum(total_sq / count / 255.0**2 - mean**2, 1e-12))
    return (float(mean[0]), float(mean[1]), float(mean[2])), (float(std[0]), float(std[1]), float(std[2]))


def _detect(tree: Tree, name: str, spec: _Spec) -> tuple[str, str] | None:
    """(layout, prefix) of ``name``'s files in ``tree``, or None. DataError for a half-present tree."""
    prefixes = ["", *spec.subfolders]
    top = tree.subdirs("")
    if len(top) == 1 and top[0] not in ("train", "test", "val"):
        prefixes += [top[0], *(join(top[0], s) for s in spec.subfolders)]
    for prefix in prefixes:
        for layout in spec.layouts:
            if layout.endswith("-batches"):
                if cifar.find_batch_folder(tree, prefix, cifar.CIFAR_SPECS[name]):
                    return layout, prefix
            elif layout == "tiny-imagenet":
                if tree.is_dir(join(prefix, "train")) and tree.is_dir(join(prefix, "val")):
                    return layout, prefix
            elif tree.is_dir(join(prefix, "train")):
                if not tree.is_dir(join(prefix, "test")):
                    test_dir = join(prefix, "test")
                    raise DataError(
                        f"{tree.label}: image-folder tree has {join(prefix, 'train')}/ but no {test_dir}/ split"
                    )
                return layout, prefix
    return None


def _layout_files(tree: Tree, name: str, layout: str, prefix: str) -> list[str]:
    """The files a layout reads, whose (path, size, mtime) key the cache of a folder source."""
    if layout.endswith("-batches"):
        c = cifar.CIFAR_SPECS[name]
        names = (*c.train_files, c.test_file, c.meta_file)
        return [join(prefix, f) for f in names if tree.is_file(join(prefix, f))]
    parts = ("train", "val", "words.txt") if layout == "tiny-imagenet" else ("train", "test")
    files: list[str] = []
    for part in parts:
        rel = join(prefix, part)
        files += [rel] if tree.is_file(rel) else tree.files_under(rel)
    return files


def _decode(tree: Tree, name: str, spec: _Spec) -> dict[str, Any]:
    found = _detect(tree, name, spec)
    if found is None:
        raise DataError(f"no {name} data in {tree.label}: expected {spec.hint}")
    layout, prefix = found
    _LOG.info("reading %s as %s layout from %s%s", name, layout, tree.label, f" ({prefix}/)" if prefix else "")
    if layout.endswith("-batches"):
        return cifar.load_batches(tree, prefix, cifar.CIFAR_SPECS[name])
    loader = image_folder.load_tiny_imagenet if layout == "tiny-imagenet" else image_folder.load_image_folder
    return loader(tree, prefix, num_classes=spec.num_classes, size=spec.size)


def _resolve_source(name: str, spec: _Spec, data_dir: Path, download: bool) -> Path:
    """The folder or tarball to read ``name`` from, downloading the authors' tarball if asked to."""
    if data_dir.is_file():
        return data_dir
    if data_dir.is_dir():
        tree = DirTree(data_dir)
        if _detect(tree, name, spec) is not None:
            return data_dir
        cspec = cifar.CIFAR_SPECS.get(name)
        if cspec is not None and (data_dir / cspec.tarball).is_file():
            return data_dir / cspec.tarball
    cspec = cifar.CIFAR_SPECS.get(name)
    if download and cspec is not None:
        _LOG.info("%s not found in %s; downloading %s", name, data_dir, cspec.url)
        try:
            return cifar.download(cspec.url, data_dir / cspec.tarball, cspec.md5)
        except DataError as exc:
            raise DataError(f"{exc}; or put {cspec.tarball} (or {spec.hint.split(',')[0]}) into {data_dir}") from exc
    state = "does not exist" if not data_dir.exists() else "has none of them"
    raise DataError(f"no {name} data at {data_dir} ({state}): provide {spec.hint}")


def _to_dataset(name: str, num_classes: int, arrays: dict[str, Any]) -> Dataset:
    mean, std = arrays["mean"], arrays["std"]
    return Dataset(
        name=name,
        train_x=arrays["train_x"],
        train_y=arrays["train_y"].astype(np.int64, copy=False),
        test_x=arrays["test_x"],
        test_y=arrays["test_y"].astype(np.int64, copy=False),
        num_classes=num_classes,
        class_names=tuple(str(c) for c in arrays["class_names"]),
        mean=(float(mean[0]), float(mean[1]), float(mean[2])),
        std=(float(std[0]), float(std[1]), float(std[2])),
    )


def _with_stats(arrays: dict[str, Any]) -> dict[str, Any]:
    mean, std = channel_stats(arrays["train_x"])
    return {
        **arrays,
        "mean": np.asarray(mean),
        "std": np.asarray(std),
        "class_names": np.asarray(arrays["class_names"]),
    }


def load_dataset(
    name: str, data_dir: Path | None = None, *, cache_dir: Path | None = None, download: bool = False,
    task: str = "classification", test_fraction: float = 0.2,
) -> Dataset:  # fmt: skip
    """Load a data set by name (one of :data:`DATASET_NAMES`).

    Args:
        name: ``cifar10``, ``cifar100``, ``tiny-imagenet`` or ``demo`` (built in; ignores ``data_dir``), or a
            data factory ``package.module:function`` (docs/PLUGINS.md; ignores ``data_dir``, not cached).
        data_dir: a folder or ``.tar.gz`` with the data (see the module docstring); default
            ``$EDGE_NODE_DATA_DIR`` or ``~/.cache/edge-node/datasets``.
        cache_dir: where decoded arrays are cached; default ``$EDGE_NODE_CACHE`` or ``~/.cache/edge-node``.
        download: fetch the authors' CIFAR tarball into ``data_dir`` when no data is found there.
        task: how a data factory's labels are read (edge_node.algorithm.tasks); the built-in sets are
            classification only.
        test_fraction: the test share of a data factory that returns ``(samples, None)`` (split by content).

    Raises:
        DataError: the data is absent (the message says where it looked and how to provide it),
            corrupt, or of the wrong layout; nothing is cached then.
    """
    if is_factory_path(name):
        from edge_node.data.factory import load_factory_dataset  # imports torch: only for a factory

        return load_factory_dataset(name, task, test_fraction)
    if task != "classification":
        raise DataError(f"data set {name!r} holds classes; --task {task} needs a data factory (docs/PLUGINS.md)")
    if name not in DATASET_NAMES:
        raise DataError(
            f"unknown data set {name!r}; choose one of {', '.join(DATASET_NAMES)} or a factory package.module:function"
        )
    if name == "demo":
        return _to_dataset(name, len(demo.DEMO_CLASSES), _with_stats(demo.make_demo()))
    spec = _SPECS[name]
    data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    source = _resolve_source(name, spec, data_dir, download)

    def layout_identity(tree: Tree) -> tuple[str, ...]:
        found = _detect(tree, name, spec)
        assert found is not None, "_resolve_source returned a folder without a layout"
        layout, prefix = found
        files = _layout_files(tree, name, layout, prefix)
        return layout, prefix, cache.tree_fingerprint(source, files)

    return _load_cached(
        name, source, cache_dir, lambda tree: _decode(tree, name, spec), spec.num_classes, layout_identity
    )


def _load_cached(
    name: str,
    source: Path,
    cache_dir: Path | None,
    decode: Callable[[Tree], dict[str, Any]],
    num_classes: int | None,
    folder_identity: Callable[[Tree], tuple[str, ...]],
) -> Dataset:
    """``decode(tree)`` of ``source`` (a folder or tarball), through the cache.

    The cache entry is keyed by the tarball's sha256, or by the folder's path and ``folder_identity``
    (which files, sizes and times make up the data).
    """
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else cache.default_cache_dir()
    tree: Tree
    identity: tuple[str, ...]
    if source.is_file():
        identity = ("tar", cache.file_sha256(source))
    else:
        tree = DirTree(source)
        identity = ("dir", str(source.resolve()), *folder_identity(tree))
    entry = cache_dir / f"{name}-{cache.cache_key(name, _CACHE_FORMAT, *identity)}.npz"
    cached = cache.load_arrays(entry, _ARRAY_KEYS)
    if cached is not None:
        try:
            ds = _to_dataset(name, num_classes or len(cached["class_names"]), cached)
        except DataError as exc:
            _LOG.warning("ignoring inconsistent cache entry %s: %s", entry, exc)
        else:
            _LOG.info("loaded %s from cache %s", name, entry)
            return ds

    started = time.perf_counter()
    if source.is_file():
        if name in cifar.CIFAR_SPECS:
            cifar.check_official_tarball(source)
        tree = TarTree(source)
    arrays = _with_stats(decode(tree))
    ds = _to_dataset(name, num_classes or len(arrays["class_names"]), arrays)  # validates before anything is written
    _LOG.info("decoded %s from %s in %.1f s", name, source, time.perf_counter() - started)
    cache.save_arrays(entry, {k: arrays[k] for k in _ARRAY_KEYS})
    return ds


def load_local_dataset(path: Path, *, cache_dir: Path | None = None) -> Dataset:
    """A device's own data: CIFAR-10/100 python batches, or an image-folder tree of any classes and size.

    ``path`` is a folder or a ``.tar.gz`` holding ``cifar-10-batches-py/`` / ``cifar-100-python/`` (or their
    files), or ``train/<class>/*`` + ``test/<class>/*``. Labels of an image-folder tree are its sorted class
    folder names; decoded arrays are cached like :func:`load_dataset`'s.

    Raises:
        DataError: nothing usable at ``path`` (the message says what was looked for), or corrupt files.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"no data at {path}: it does not exist")
    tree: Tree = TarTree(path) if path.is_file() else DirTree(path)
    for name in ("cifar10", "cifar100"):
        spec = _SPECS[name]
        found = _detect(tree, name, spec)
        if found is not None and found[0].endswith("-batches"):
            return load_dataset(name, path, cache_dir=cache_dir)
    prefixes = [""] + [top for top in tree.subdirs("") if top not in ("train", "test")][:1]
    prefix = next((p for p in prefixes if tree.is_dir(join(p, "train"))), None)
    if prefix is None:
        raise DataError(
            f"no data at {path}: expected CIFAR python batches (cifar-10-batches-py/, cifar-100-python/) or an"
            " image-folder tree train/<class>/* + test/<class>/* (or a .tar.gz of either)"
        )

    def folder_identity(t: Tree) -> tuple[str, ...]:
        files = t.files_under(join(prefix, "train")) + t.files_under(join(prefix, "test"))
        return prefix, cache.tree_fingerprint(path, files)

    return _load_cached(
        "local",
        path,
        cache_dir,
        lambda t: image_folder.load_image_folder(t, prefix, num_classes=None, size=None),
        None,
        folder_identity,
    )
