"""The handed-over model on disk: pairs of ``model.onnx`` + ``model.json`` under ``STATE_DIR/handover/``.

A node hands its personalized model to the device's application as a *pair*: the ONNX graph (input
normalisation inside: the application feeds raw samples) and ``model.json`` saying what it is (round, task,
metric on the node's test set, architecture, input name/shape/dtype, class names, node, time, the SHA-256
of the ONNX bytes, :data:`FORMAT_VERSION`). Each pair has its own folder (``handover/r000012-<sha12>``) and
``handover/current.json`` names the current one. A pair is written complete into a hidden folder
(``.incoming-*``), fsynced, renamed to its name, and only then is the pointer replaced by an atomic rename
(:func:`publish`): a reader that follows the pointer sees the old pair or the new one, never a mix and
never a half-written file. Files are never rewritten in place, so an application holding an old
``model.onnx`` open keeps reading the bytes it opened. The last ``keep`` pairs stay (at least
:data:`MIN_KEEP`); the one the pointer names is never deleted. A reader that lost a race with the pruning (it
read the pointer, then two more pairs were handed over before it opened its files) reads the pointer again
(:func:`read_pair`).

This module needs neither torch nor onnxruntime: an application reads pairs with it (the inference side is
:mod:`edge_node.handover_model`), the node writes them with it (:mod:`edge_node.node.handover`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_node.errors import HandoverError, StorageError
from edge_node.storage import atomic_write_text, describe_failure, fsync_path

_LOGGER = logging.getLogger(__name__)

HANDOVER_DIR = "handover"
POINTER_FILE = "current.json"
PAIR_ONNX = "model.onnx"
PAIR_INFO = "model.json"
FORMAT_VERSION = 1  # model.json's and current.json's "format"; a reader refuses a newer one
HANDOVER_MODES = ("best", "latest")
DEFAULT_KEEP = 3
MIN_KEEP = 2  # the current pair and the one before: a reader that has just read the pointer still finds its pair
READ_ATTEMPTS = 20  # a reader re-reads the pointer this often when its folder was pruned under it
_FOLDER = re.compile(r"^r\d{6,}-[0-9a-f]{12}(-\d+)?$")
_INCOMING = ".incoming-"


@dataclass(frozen=True)
class Pair:
    """One handed-over pair as read through the pointer: its folder, ``model.json`` and the ONNX bytes."""

    folder: Path
    info: dict[str, Any]
    onnx: bytes


def handover_dir(state_dir: Path) -> Path:
    return Path(state_dir) / HANDOVER_DIR


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def incoming(state_dir: Path) -> Iterator[Path]:
    """A new hidden folder under ``handover/`` to write a pair into; removed on exit unless :func:`publish`
    moved it. Folders a killed writer left behind are removed first (one node writes a state dir: its lock).

    Raises:
        StorageError: the folder cannot be made.
    """
    root = handover_dir(state_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(_INCOMING + "*"):
            shutil.rmtree(stale, ignore_errors=True)
        path = Path(tempfile.mkdtemp(prefix=_INCOMING, dir=root))
    except OSError as exc:
        raise StorageError(describe_failure(root, exc)) from exc
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)  # gone already once published


def _folder_name(root: Path, round_done: int, sha: str) -> str:
    name = f"r{round_done:06d}-{sha[:12]}"
    candidate, n = name, 1
    while (root / candidate).exists():  # the same round and bytes again (a round re-run after a restart)
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def publish(pending: Path, info: Mapping[str, Any], *, round_done: int, keep: int) -> str:
    """Hand over the pair in ``pending`` (an :func:`incoming` folder holding ``model.onnx``): write
    ``model.json`` (``info`` plus the ONNX file's SHA-256 and size), fsync, rename the folder to its name,
    replace the pointer, prune to ``keep`` pairs. Returns the folder's name.

    Raises:
        StorageError: a write failed; the pointer still names the previous pair, which is intact.
    """
    root = pending.parent
    onnx = pending / PAIR_ONNX
    try:
        sha = sha256_of(onnx)
        full = {**info, "onnx_sha256": sha, "onnx_bytes": onnx.stat().st_size}
        with open(pending / PAIR_INFO, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(full, indent=2) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        fsync_path(onnx)
        fsync_path(pending)
        name = _folder_name(root, round_done, sha)
        os.rename(pending, root / name)
        fsync_path(root)
    except OSError as exc:
        raise StorageError(describe_failure(pending, exc)) from exc
    pointer = {"format": FORMAT_VERSION, "folder": name, "round": round_done, "onnx_sha256": sha}
    atomic_write_text(root / POINTER_FILE, json.dumps(pointer) + "\n")  # StorageError: the old pointer stays
    prune(root, keep, name)
    return name


def pair_folders(root: Path) -> list[Path]:
    """The pair folders under ``root`` (``handover/``), oldest first (by their ``model.json``'s time)."""

    def written(path: Path) -> int:
        try:
            return (path / PAIR_INFO).stat().st_mtime_ns
        except OSError:
            return 0  # a folder without its model.json: not a whole pair, first to go

    found = [p for p in root.iterdir() if _FOLDER.match(p.name) and p.is_dir()] if root.is_dir() else []
    return sorted(found, key=lambda p: (written(p), p.name))


def prune(root: Path, keep: int, current: str) -> None:
    """Delete all but the newest ``keep`` pair folders, never ``current``; a folder that cannot be deleted stays
    (logged): an application may hold its files open, which on Linux does not stop the deletion."""
    folders = pair_folders(root)
    for old in folders[: max(0, len(folders) - max(keep, MIN_KEEP))]:
        if old.name == current:
            continue
        try:
            shutil.rmtree(old)
        except OSError as exc:
            _LOGGER.info("could not delete the old handed-over model %s: %s", old, exc)


def current_folder(state_dir: Path) -> str | None:
    """The folder name ``handover/current.json`` names; None when no model has been handed over.

    Raises:
        HandoverError: the pointer is not one this version wrote (corrupt, or a newer format).
    """
    path = handover_dir(state_dir) / POINTER_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HandoverError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        pointer = json.loads(text)
        version, folder = pointer["format"], pointer["folder"]
    except (ValueError, KeyError, TypeError):
        raise HandoverError(f"{path} is not a handover pointer (expected JSON with format and folder)") from None
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise HandoverError(f"{path} has format {version!r}; this edge-node reads format {FORMAT_VERSION}: upgrade it")
    if not isinstance(folder, str) or not _FOLDER.match(folder):
        raise HandoverError(f"{path} names folder {folder!r}, not a handover folder (r000012-<sha>)")
    return folder


def read_pair(state_dir: Path) -> Pair | None:
    """The current pair, read through the pointer and checked (the ONNX bytes' SHA-256 is model.json's); None
    when no model has been handed over yet.

    Raises:
        HandoverError: the pair cannot be read or does not match itself, after :data:`READ_ATTEMPTS` reads of
            the pointer (a folder pruned between reading the pointer and its files is read again).
    """
    root = handover_dir(state_dir)
    problem = ""
    for _ in range(READ_ATTEMPTS):
        name = current_folder(state_dir)
        if name is None:
            return None
        folder = root / name
        try:
            info = json.loads((folder / PAIR_INFO).read_text(encoding="utf-8"))
            onnx = (folder / PAIR_ONNX).read_bytes()
        except FileNotFoundError:  # pruned after we read the pointer: the pointer names a newer pair now
            problem = f"{folder} disappeared while it was read"
            continue
        except (OSError, ValueError) as exc:
            raise HandoverError(f"cannot read the handed-over model in {folder}: {exc}") from None
        if not isinstance(info, dict) or not isinstance(info.get("format"), int):
            raise HandoverError(f"{folder / PAIR_INFO} is not a handed-over model's description")
        if info["format"] > FORMAT_VERSION:
            raise HandoverError(
                f"{folder / PAIR_INFO} has format {info['format']}; this edge-node reads format {FORMAT_VERSION}"
            )
        if hashlib.sha256(onnx).hexdigest() != info.get("onnx_sha256"):
            problem = f"{folder / PAIR_ONNX} does not match the SHA-256 in its model.json"
            continue
        return Pair(folder, info, onnx)
    raise HandoverError(f"cannot read the handed-over model: {problem}")
