"""On-disk cache of decoded data sets: decoding 60k JPEGs takes tens of seconds, loading the arrays back
takes well under one.

A cache entry is one uncompressed ``.npz`` of plain arrays (no object arrays, loaded with
``allow_pickle=False``), named after a key that changes whenever the source changes: the content hash of
a tarball, or the relative path, size and mtime of every file of a directory tree. Writes go to a
temporary file in the same folder and are renamed into place, so a reader never sees half an entry.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

_LOG = logging.getLogger(__name__)

CACHE_ENV = "EDGE_NODE_CACHE"
_HASH_CHUNK_BYTES = 1 << 20


def default_cache_dir() -> Path:
    """``$EDGE_NODE_CACHE`` if set, else ``~/.cache/edge-node``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edge-node"


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's content, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_fingerprint(root: Path, rel_paths: Iterable[str]) -> str:
    """Hash of (relative path, size, mtime) of the given files: cheap, and changes when any file does."""
    digest = hashlib.sha256()
    for rel in sorted(rel_paths):
        st = (root / rel).stat()
        digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def cache_key(*parts: str) -> str:
    """A short stable key from strings (dataset name, format version, source identity...)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def load_arrays(path: Path, required: Iterable[str]) -> dict[str, np.ndarray] | None:
    """The arrays of a cache entry, or None when it is absent or unreadable (then it is rebuilt)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        _LOG.warning("ignoring unreadable cache entry %s: %s", path, exc)
        return None
    missing = set(required) - arrays.keys()
    if missing:
        _LOG.warning("ignoring cache entry %s: missing %s", path, sorted(missing))
        return None
    return arrays


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write an uncompressed ``.npz`` atomically (temporary file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            # numpy's stub checks **arrays against savez's allow_pickle: bool too; our keys are only array names.
            np.savez(f, **arrays)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, 0o644)  # decoded public data, readable like any other cache file
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _LOG.info("cached decoded arrays in %s (%.1f MB)", path, path.stat().st_size / 1e6)
