"""Image-folder trees (``train/<class>/*``, ``test/<class>/*``) and the Tiny-ImageNet layout
(``train/<wnid>/images/*``, ``val/images/*`` + ``val/val_annotations.txt``), decoded into uint8 NCHW arrays.

Classes are the sorted folder names of ``train/`` (= label index). Every image must decode and have the
same size; otherwise :class:`DataError` names the first offending file. Large trees are decoded by a
small pool of processes (PIL holds the GIL for tiny images, so threads do not help).
"""

from __future__ import annotations

import io
import logging
import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
from PIL import Image
from tqdm import tqdm

from edge_node.data.sources import Tree, join, one_line
from edge_node.errors import DataError

_LOG = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".gif", ".webp", ".tif", ".tiff"})
PARALLEL_MIN_IMAGES = 4000  # below this, starting worker processes costs more than it saves
_CHUNK_IMAGES = 2500
_MAX_WORKERS = 8


def _is_image(rel: str) -> bool:
    return os.path.splitext(rel)[1].lower() in IMAGE_EXTENSIONS


def decode_image(blob: bytes, size: tuple[int, int] | None) -> np.ndarray:
    """HWC uint8 RGB; ValueError when the image does not decode or has another size than ``size``."""
    with Image.open(io.BytesIO(blob)) as im:
        if size is not None and im.size != size:
            raise ValueError(f"size {im.size[0]}x{im.size[1]}, expected {size[0]}x{size[1]}")
        im.load()
        rgb = im if im.mode == "RGB" else im.convert("RGB")
        return np.asarray(rgb, dtype=np.uint8)


def _decode_chunk(blobs: Sequence[bytes], size: tuple[int, int]) -> tuple[np.ndarray | None, int, str]:
    """Decode a chunk into NCHW; on failure (None, index of the bad image, reason). Runs in workers."""
    out = np.empty((len(blobs), 3, size[1], size[0]), dtype=np.uint8)
    for i, blob in enumerate(blobs):
        try:
            out[i] = decode_image(blob, size).transpose(2, 0, 1)
        except Exception as exc:  # noqa: BLE001 -- PIL raises many types; each becomes a DataError naming the file
            return None, i, f"{type(exc).__name__}: {one_line(exc)}"
    return out, -1, ""


def decode_images(tree: Tree, rels: Sequence[str], size: tuple[int, int] | None = None) -> np.ndarray:
    """Decode ``rels`` of ``tree`` into uint8 [N, 3, H, W]; ``size`` (W, H) defaults to the first image's."""
    if not rels:
        return np.empty((0, 3, 0, 0), dtype=np.uint8)
    if size is None:
        try:
            first = decode_image(tree.read(rels[0]), None)
        except Exception as exc:  # noqa: BLE001 -- see _decode_chunk
            raise DataError(f"unreadable image {tree.label}:{rels[0]}: {type(exc).__name__}: {one_line(exc)}") from exc
        size = (first.shape[1], first.shape[0])
    started = time.perf_counter()
    chunks = [list(rels[i : i + _CHUNK_IMAGES]) for i in range(0, len(rels), _CHUNK_IMAGES)]
    workers = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                  _MAX_WORKERS)  # fmt: skip
    results: list[tuple[np.ndarray | None, int, str]] | None = None
    # A bar in a terminal (tqdm hides itself when stderr is not one), INFO lines for logs.
    with tqdm(total=len(rels), desc=f"decoding {tree.label}", unit="img", disable=None, leave=False) as bar:
        if workers > 1 and len(rels) >= PARALLEL_MIN_IMAGES:
            results = _decode_parallel(tree, chunks, size, workers, bar)
        if results is None:
            results = []
            bar.reset()
            for chunk in chunks:
                results.append(_decode_chunk([tree.read(r) for r in chunk], size))
                if results[-1][0] is None:
                    break
                _progress(tree, bar, len(chunk))
    arrays = []
    for chunk, (arr, bad, reason) in zip(chunks, results, strict=False):
        if arr is None:
            raise DataError(f"unreadable image {tree.label}:{chunk[bad]}: {reason}")
        arrays.append(arr)
    _LOG.info("decoded %d images from %s in %.1f s", len(rels), tree.label, time.perf_counter() - started)
    return np.concatenate(arrays)


def _progress(tree: Tree, bar: tqdm, images: int) -> None:
    bar.update(images)
    _LOG.info("decoding %s: %d / %d images", tree.label, bar.n, bar.total)


def _decode_parallel(
    tree: Tree, chunks: list[list[str]], size: tuple[int, int], workers: int, bar: tqdm
) -> list[tuple[np.ndarray | None, int, str]] | None:
    """Decode chunks in worker processes; None if a pool cannot run here (then decode in this process)."""
    # spawn, not fork: the caller may hold threads (torch, grpc) whose locks a forked child would inherit.
    ctx = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [pool.submit(_decode_chunk, [tree.read(r) for r in chunk], size) for chunk in chunks]
            results = []
            for chunk, fut in zip(chunks, futures, strict=True):
                results.append(fut.result())
                _progress(tree, bar, len(chunk))
            return results
    except (BrokenProcessPool, RuntimeError, OSError) as exc:
        _LOG.warning("parallel decoding unavailable (%s); decoding in this process", exc)
        return None


def _class_files(tree: Tree, split_dir: str, classes: Sequence[str], sub: str = "") -> tuple[list[str], list[int]]:
    """Image files of ``split_dir/<class>/[sub/]*`` with their label indices."""
    rels: list[str] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        base = join(join(split_dir, cls), sub) if sub else join(split_dir, cls)
        files = [f for f in tree.files_under(base) if f.count("/") == base.count("/") + 1]
        images = [f for f in files if _is_image(f)]
        if len(images) < len(files):
            _LOG.warning("ignoring %d non-image files in %s:%s", len(files) - len(images), tree.label, base)
        if not images:
            raise DataError(f"no images in {tree.label}:{base}/")
        rels += images
        labels += [label] * len(images)
    return rels, labels


def _check_classes(tree: Tree, classes: Sequence[str], num_classes: int | None, where: str) -> None:
    if not classes:
        raise DataError(f"no class folders in {tree.label}:{where}/")
    if num_classes is not None and len(classes) != num_classes:
        raise DataError(f"{tree.label}:{where}/ has {len(classes)} class folders, expected {num_classes}")


def _decode_splits(
    tree: Tree,
    train: tuple[list[str], list[int]],
    test: tuple[list[str], list[int]],
    class_names: Sequence[str],
    size: tuple[int, int] | None,
) -> dict[str, Any]:
    """The data set's arrays from the (image paths, labels) of each split, decoded in one pass."""
    (train_rels, train_y), (test_rels, test_y) = train, test
    all_x = decode_images(tree, train_rels + test_rels, size)
    return {
        "train_x": all_x[: len(train_rels)],
        "train_y": np.asarray(train_y, dtype=np.int64),
        "test_x": all_x[len(train_rels) :],
        "test_y": np.asarray(test_y, dtype=np.int64),
        "class_names": tuple(class_names),
    }


def load_image_folder(
    tree: Tree, prefix: str, *, num_classes: int | None, size: tuple[int, int] | None
) -> dict[str, Any]:
    """Arrays of a ``train/<class>/*`` + ``test/<class>/*`` tree rooted at ``prefix``."""
    train_dir, test_dir = join(prefix, "train"), join(prefix, "test")
    if not tree.is_dir(test_dir):
        raise DataError(f"{tree.label}: image-folder tree has {train_dir}/ but no {test_dir}/ split")
    classes = tree.subdirs(train_dir)
    _check_classes(tree, classes, num_classes, train_dir)
    test_classes = tree.subdirs(test_dir)
    if test_classes != classes:
        missing = sorted(set(classes) ^ set(test_classes))
        raise DataError(f"{tree.label}: class folders of {test_dir}/ differ from {train_dir}/: {missing[:5]}")
    train_rels, train_y = _class_files(tree, train_dir, classes)
    test_rels, test_y = _class_files(tree, test_dir, classes)
    _LOG.info("decoding %d train + %d test images of %d classes from %s",
              len(train_rels), len(test_rels), len(classes), tree.label)  # fmt: skip
    return _decode_splits(tree, (train_rels, train_y), (test_rels, test_y), classes, size)


def load_tiny_imagenet(
    tree: Tree, prefix: str, *, num_classes: int | None, size: tuple[int, int] | None
) -> dict[str, Any]:
    """Arrays of the Tiny-ImageNet layout; its labelled ``val/`` split serves as the test set."""
    train_dir = join(prefix, "train")
    classes = tree.subdirs(train_dir)
    _check_classes(tree, classes, num_classes, train_dir)
    train_rels, train_y = _class_files(tree, train_dir, classes, sub="images")
    ann_rel = join(prefix, "val/val_annotations.txt")
    if not tree.is_file(ann_rel):
        raise DataError(f"{tree.label}: Tiny-ImageNet tree has no {ann_rel} (the test split's labels)")
    index = {wnid: i for i, wnid in enumerate(classes)}
    test_rels: list[str] = []
    test_y: list[int] = []
    for lineno, line in enumerate(tree.read(ann_rel).decode("utf-8", "replace").splitlines(), 1):
        fields = line.split("\t")
        if not line.strip():
            continue
        if len(fields) < 2 or fields[1] not in index:
            raise DataError(f"{tree.label}:{ann_rel} line {lineno}: expected '<file>\\t<wnid>' of a train class")
        rel = join(prefix, f"val/images/{fields[0]}")
        if not tree.is_file(rel):
            raise DataError(f"{tree.label}: {ann_rel} line {lineno} names missing image {rel}")
        test_rels.append(rel)
        test_y.append(index[fields[1]])
    if not test_rels:
        raise DataError(f"{tree.label}: {ann_rel} lists no images")
    names = list(classes)
    words_rel = join(prefix, "words.txt")
    if tree.is_file(words_rel):
        words = dict(
            line.split("\t", 1) for line in tree.read(words_rel).decode("utf-8", "replace").splitlines() if "\t" in line
        )
        names = [words.get(wnid, wnid).split(",")[0].strip() or wnid for wnid in classes]
    return _decode_splits(tree, (train_rels, train_y), (test_rels, test_y), names, size)
