"""A data folder that grows while the node runs: re-read at each round, decoding only what is new.

Two layouts, fixed at the first read:

- ``train/<class>/*`` + ``test/<class>/*`` keeps that split;
- ``<class>/*`` (flat) puts an image on the test side when the digest of its bytes says so
  (:func:`edge_node.data.content_split.is_test_sample`, a share ``test_fraction``): once and for good.

Class folders map onto the fleet's ``classes`` (a new class folder must not change the model's outputs).
Each side keeps its newest ``max_train`` / ``max_test`` images by file mtime (None: all). Only those are
read and decoded, newest first; a file's decoded pixels are cached under its path, size and mtime_ns, so a
later read decodes only new or changed files, and the cache holds no more than the files the last read
looked at (pixels only for the ones it kept): memory follows the bound, not the folder.

A file that cannot be used is skipped, counted by reason (:data:`REFUSAL_REASONS`) and logged once (its
size and mtime are remembered, so it is not read again until it changes); it never ends a read. A file
that changes while it is read is skipped for this read and read again at the next. A folder that is gone
is a :class:`DataError` for the caller to weigh (at start: refuse; later: keep the data it had).
"""

from __future__ import annotations

import heapq
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from edge_node.data.content_split import is_test_sample
from edge_node.data.image_folder import IMAGE_EXTENSIONS, decode_image
from edge_node.data.sources import one_line
from edge_node.errors import DataError

_LOG = logging.getLogger(__name__)

# Why a file is not used (the label of edge_node_data_refused_total): unreadable (I/O error), undecodable
# (not an image PIL can decode: a truncated JPEG), wrong_size (not the size of the first image, which the
# model was built for), unknown_class (its class folder is not among the fleet's classes), not_an_image (a
# file without an image extension in a class folder), changing (it changed while it was read; read again
# next time).
REFUSAL_REASONS = ("unreadable", "undecodable", "wrong_size", "unknown_class", "not_an_image", "changing")
LOGGED_PER_READ = 10  # refused files logged one by one per read; the rest in one line by reason
SIZE_PROBE_FILES = 25  # the newest images whose most common size fixes the size of all (unless it is given)


@dataclass(frozen=True)
class _File:
    """A candidate image as listed: no byte of it read yet."""

    mtime_ns: int
    rel: str  # POSIX path relative to the root
    size: int
    label: int
    test: bool | None  # the side its folder says (train/ or test/); None: flat, decided by its content


@dataclass
class _Entry:
    """What the cache knows of one file at one (size, mtime_ns): its side and label, and its pixels while kept."""

    size: int
    mtime_ns: int
    label: int
    test: bool
    image: np.ndarray | None = None  # uint8 [3, H, W], only while the file is among the kept ones
    refused: str | None = None  # why it is not used; then no pixels


@dataclass(frozen=True)
class FolderRead:
    """The kept samples of one read, newest first per side, and what the read skipped."""

    train_x: np.ndarray  # uint8 [N, 3, H, W]
    train_y: np.ndarray  # int64 [N]
    test_x: np.ndarray
    test_y: np.ndarray
    arrived: int  # kept samples that the previous read did not keep (new or changed files); all at the first
    refused: dict[str, int]  # files refused for the first time by this read, by reason
    listed: int  # image files in known class folders (both sides) before the bound

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_y.shape[0])


class FolderWatch:
    """Re-reads one data folder (:meth:`read`), decoding only new or changed files; see the module docstring."""

    def __init__(
        self, root: Path, classes: tuple[str, ...], *, test_fraction: float, max_train: int | None,
        max_test: int | None, size: tuple[int, int] | None = None,
    ) -> None:  # fmt: skip
        if not classes:
            raise DataError(f"{root}: a data folder that is re-read needs the fleet's class names (classes)")
        self.root = Path(root)
        self.classes = tuple(classes)
        self.test_fraction = test_fraction
        self.max_train, self.max_test = max_train, max_test
        self.size = size  # (W, H) of every image: unless given, the most common of the newest at the first read
        self.split: bool | None = None  # train/ + test/ layout; decided at the first read
        self.decoded = 0  # images decoded since start (a cache hit decodes nothing)
        self._cache: dict[str, _Entry] = {}
        self._kept: set[tuple[str, int, int]] = set()  # (rel, size, mtime_ns) of the last read's samples
        self._counted: dict[tuple[str, str], int] = {}  # (reason, folder) -> files counted: folder-level refusals

    # -- reading ----------------------------------------------------------------------------------------
    def read(self) -> FolderRead:
        """The folder's kept samples now.

        Raises:
            DataError: the folder is gone or is not a folder (the cache is kept for when it comes back).
        """
        if not self.root.is_dir():
            state = "is not a folder" if self.root.exists() else "does not exist (any more)"
            raise DataError(f"data folder {self.root} {state}")
        if self.split is None:
            self.split = (self.root / "train").is_dir()
        refused: Counter[str] = Counter()
        logged: list[str] = []
        if self.size is None:
            self.size = self._common_size()
        seen: set[str] = set()
        if self.split:
            train, listed_train = self._pick(lambda: self._listing("train", False, refused, logged),
                                             {False: self.max_train}, refused, logged, seen)  # fmt: skip
            test, listed_test = self._pick(lambda: self._listing("test", True, refused, logged),
                                           {True: self.max_test}, refused, logged, seen)  # fmt: skip
            kept, listed = {**train, **test}, listed_train + listed_test
        else:
            quota = {False: self.max_train, True: self.max_test}
            kept, listed = self._pick(lambda: self._listing("", None, refused, logged), quota, refused, logged, seen)
        for rel in list(self._cache):  # bounded: only what this read looked at stays
            if rel not in seen:
                del self._cache[rel]
        for rel, entry in self._cache.items():
            if not kept.get(entry.test, {}).get(rel):
                entry.image = None
        if len(logged) > LOGGED_PER_READ:
            _LOG.warning("... and %d more files skipped in %s (%s)", len(logged) - LOGGED_PER_READ, self.root,
                         ", ".join(f"{k}: {v}" for k, v in sorted(refused.items())))  # fmt: skip
        train_x, train_y, train_ids = self._stack(kept.get(False, {}))
        test_x, test_y, test_ids = self._stack(kept.get(True, {}))
        ids = train_ids | test_ids
        arrived = len(ids - self._kept)
        self._kept = ids
        return FolderRead(train_x, train_y, test_x, test_y, arrived, dict(sorted(refused.items())), listed)

    def held_bytes(self) -> int:
        """Bytes of decoded pixels the cache holds (the kept samples' only)."""
        return sum(e.image.nbytes for e in self._cache.values() if e.image is not None)

    def cached_files(self) -> int:
        """Files the cache knows (those the last read looked at: the kept ones, refused and unkept ones among them)."""
        return len(self._cache)

    # -- the pieces -------------------------------------------------------------------------------------
    def _common_size(self) -> tuple[int, int] | None:
        """The most common (W, H) among the newest :data:`SIZE_PROBE_FILES` images, from their headers only (no
        pixels decoded): one odd image must not decide the size the model is built for. None: no image read."""
        sink: Counter[str] = Counter()
        files = heapq.nsmallest(SIZE_PROBE_FILES, self._listing("", None, sink, None) if not self.split else (
            f for side in ("train", "test") for f in self._listing(side, side == "test", sink, None)
        ), key=_newest_first)  # fmt: skip
        sizes: Counter[tuple[int, int]] = Counter()
        for file in files:
            try:
                with Image.open(self.root / file.rel) as im:
                    sizes[im.size] += 1
            except Exception:  # noqa: BLE001,S112 -- a damaged file is the read's to refuse; here it has no size
                continue
        return sizes.most_common(1)[0][0] if sizes else None

    def _listing(
        self, split_dir: str, test: bool | None, refused: Counter[str], logged: list[str] | None
    ) -> Iterator[_File]:
        """Image files of ``split_dir/<class>/*`` (flat: ``<class>/*``) as listed, without reading them.

        Folder-level refusals (a class folder the fleet does not know, files that are no images) are counted
        here, once per file: a folder's count only grows (``logged`` None: a look that neither counts nor logs).
        """
        base = self.root / split_dir if split_dir else self.root
        for folder in _entries(base):
            if not folder.is_dir(follow_symlinks=True) or folder.name.startswith("."):
                continue
            rel_dir = f"{split_dir}/{folder.name}" if split_dir else folder.name
            # Streamed, never a list: a class folder of a million files costs the listing no memory of its own.
            files = (f for f in _entries(Path(folder.path)) if not f.name.startswith(".") and _is_file(f))
            if folder.name not in self.classes:
                self._count_folder("unknown_class", rel_dir, sum(1 for _ in files), refused, logged,
                                   f"class folder {folder.name!r} is not among the fleet's classes")  # fmt: skip
                continue
            label = self.classes.index(folder.name)
            others = 0
            for f in files:
                if os.path.splitext(f.name)[1].lower() not in IMAGE_EXTENSIONS:
                    others += 1
                    continue
                try:
                    st = f.stat()
                except OSError:  # gone between the listing and its stat: not there
                    continue
                yield _File(st.st_mtime_ns, f"{rel_dir}/{f.name}", st.st_size, label, test)
            if others:
                self._count_folder("not_an_image", rel_dir, others, refused, logged, "files without an image extension")

    def _count_folder(
        self, reason: str, rel_dir: str, files: int, refused: Counter[str], logged: list[str] | None, why: str
    ) -> None:
        before = self._counted.get((reason, rel_dir), 0)
        if files > before and logged is not None:
            refused[reason] += files - before
            self._counted[(reason, rel_dir)] = files
            self._log(logged, f"skipping {files - before} files in {self.root / rel_dir}: {why}")

    def _pick(
        self, listing: Callable[[], Iterable[_File]], quota: dict[bool, int | None], refused: Counter[str],
        logged: list[str], seen: set[str],
    ) -> tuple[dict[bool, dict[str, _Entry]], int]:  # fmt: skip
        """The newest usable files of each side up to its quota, decoded (from the cache where it can), and how
        many files were listed.

        Looks at the newest ``sum(quota)`` listed files first and widens the window (doubling) only while a
        side is short and older files exist: a folder of 100,000 files with a bound of 1,000 is listed, not read.
        """
        bounded = all(q is not None for q in quota.values())
        window = sum(q or 0 for q in quota.values()) if bounded else None
        while True:
            listed = 0

            def counted() -> Iterator[_File]:
                nonlocal listed
                for file in listing():
                    listed += 1
                    yield file

            if window is None:
                newest = sorted(counted(), key=_newest_first)
            else:
                newest = heapq.nsmallest(window, counted(), key=_newest_first)
            kept: dict[bool, dict[str, _Entry]] = {side: {} for side in quota}
            for file in newest:
                seen.add(file.rel)
                entry, blob = self._entry(file, refused, logged)
                if entry is None or entry.refused is not None or entry.test not in quota:
                    continue
                limit = quota[entry.test]
                if limit is not None and len(kept[entry.test]) >= limit:
                    continue
                if entry.image is None:
                    blob = blob if blob is not None else self._read(file, refused, logged)
                    if blob is None or not self._decode(file, entry, blob, refused, logged):
                        continue
                kept[entry.test][file.rel] = entry
            full = all(q is None or len(kept[s]) >= q for s, q in quota.items())
            if window is None or full or len(newest) < window:
                return kept, listed
            window *= 2

    def _entry(self, file: _File, refused: Counter[str], logged: list[str]) -> tuple[_Entry | None, bytes | None]:
        """The cache's entry of ``file`` at its size and mtime, or a new one when it changed (flat: its bytes read
        and hashed for its side; they come back too, to be decoded without a second read)."""
        entry = self._cache.get(file.rel)
        if entry is not None and (entry.size, entry.mtime_ns) == (file.size, file.mtime_ns):
            return entry, None
        blob = None
        if file.test is not None:
            entry = _Entry(file.size, file.mtime_ns, file.label, file.test)
        else:
            blob = self._read(file, refused, logged)
            if blob is None:
                return self._cache.get(file.rel), None  # a refused (unreadable) entry, or nothing
            entry = _Entry(file.size, file.mtime_ns, file.label, is_test_sample(blob, self.test_fraction))
        self._cache[file.rel] = entry
        return entry, blob

    def _decode(self, file: _File, entry: _Entry, blob: bytes, refused: Counter[str], logged: list[str]) -> bool:
        """Decode ``blob`` (the bytes of ``file``) into ``entry``; False (counted, logged, remembered) when it is no
        image of the expected size."""
        try:
            hwc = decode_image(blob, self.size)
        except ValueError as exc:
            reason = "wrong_size" if str(exc).startswith("size ") else "undecodable"
            return self._refuse(file, entry, reason, one_line(exc), refused, logged)
        except Exception as exc:  # noqa: BLE001 -- PIL raises many types for a damaged file; each is one skip
            return self._refuse(file, entry, "undecodable", f"{type(exc).__name__}: {one_line(exc)}", refused, logged)
        if self.size is None:
            self.size = (hwc.shape[1], hwc.shape[0])
        entry.image = np.ascontiguousarray(hwc.transpose(2, 0, 1))
        self.decoded += 1
        return True

    def _refuse(
        self, file: _File, entry: _Entry, reason: str, detail: str, refused: Counter[str], logged: list[str]
    ) -> bool:
        entry.refused, entry.image = reason, None
        refused[reason] += 1
        self._log(logged, f"skipping {self.root / file.rel} ({reason}): {detail}")
        return False

    def _read(self, file: _File, refused: Counter[str], logged: list[str]) -> bytes | None:
        """The file's bytes as listed; None when it is gone, unreadable (counted) or changed while read (counted,
        not remembered: read again next time)."""
        path = self.root / file.rel
        try:
            blob, before, after = read_file(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._cache[file.rel] = _Entry(file.size, file.mtime_ns, file.label, bool(file.test), refused="unreadable")
            refused["unreadable"] += 1
            self._log(logged, f"skipping {path} (unreadable): {exc.strerror or exc}")
            return None
        listed = (file.size, file.mtime_ns)
        if (
            (before.st_size, before.st_mtime_ns) != listed
            or (after.st_size, after.st_mtime_ns) != listed
            or (len(blob) != file.size)
        ):
            refused["changing"] += 1
            self._log(logged, f"skipping {path} for now (changing): it changed while it was read")
            return None
        return blob

    def _log(self, logged: list[str], line: str) -> None:
        logged.append(line)
        if len(logged) <= LOGGED_PER_READ:
            _LOG.warning("%s", line)

    def _stack(self, kept: dict[str, _Entry]) -> tuple[np.ndarray, np.ndarray, set[tuple[str, int, int]]]:
        """The kept samples as one array, in path order; each entry then holds a view of it (no second copy)."""
        rels = sorted(kept)
        w, h = self.size or (0, 0)
        x = np.empty((len(rels), 3, h, w), dtype=np.uint8)
        for i, rel in enumerate(rels):
            image = kept[rel].image
            assert image is not None
            x[i] = image
            kept[rel].image = x[i]
        y = np.asarray([kept[r].label for r in rels], dtype=np.int64)
        return x, y, {(r, kept[r].size, kept[r].mtime_ns) for r in rels}


def read_file(path: Path) -> tuple[bytes, os.stat_result, os.stat_result]:
    """A file's bytes with its status from the open file before reading and from its path after: a file
    replaced or rewritten while it was read shows a difference."""
    with open(path, "rb") as f:
        before = os.fstat(f.fileno())
        blob = f.read()
    return blob, before, os.stat(path)


def _entries(path: Path) -> Iterator[os.DirEntry[str]]:
    """The entries of a folder one by one; none, or no more, where it is gone or unreadable (a folder may vanish
    during a read)."""
    try:
        with os.scandir(path) as it:
            yield from it
    except OSError:
        return


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file(follow_symlinks=True)
    except OSError:
        return False


def _newest_first(file: _File) -> tuple[int, str]:
    return (-file.mtime_ns, file.rel)
