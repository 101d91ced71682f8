"""Durable writes of run state and logs; a failed write (disk full, read-only, no permission) becomes
one :class:`StorageError` that names the file and the cause, and leaves what was there intact.

* :func:`atomic_write`: whole files (checkpoints, configs, summaries) go to a temporary file that is
  fsynced and renamed over the target; on failure the temporary file is removed and the old file stays.
* :func:`append_line`: one JSON line appended and fsynced; on failure the file is cut back to its
  previous length, so no torn line is left for a reader (or a resumed run) to trip over.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from edge_node.errors import CheckpointError, StorageError

_LOGGER = logging.getLogger(__name__)


def describe_failure(path: Path, exc: BaseException) -> str:
    """``cannot write PATH: cause`` with the free space when the disk is (nearly) full."""
    cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).strip() or type(exc).__name__
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if free is not None and (full or free < 16 * 2**20):
        cause += f" (the file system is full or nearly: {free / 2**20:.1f} MiB free)"
    return f"cannot write {path}: {cause}"


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's data (a directory: the names renamed into it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Replace ``path`` with what ``write`` writes to a binary file, all or nothing.

    Raises:
        StorageError: the file could not be written; ``path`` is as it was before.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)
    except (OSError, RuntimeError) as exc:  # torch.save reports a short write as RuntimeError
        tmp.unlink(missing_ok=True)
        if _interrupted(exc):  # Ctrl-C inside torch.save surfaces as its zip writer's RuntimeError
            raise KeyboardInterrupt from exc
        raise StorageError(describe_failure(path, exc)) from exc
    except BaseException:  # an interrupt (or anything else) mid-write: no temp file stays behind
        tmp.unlink(missing_ok=True)
        raise


def _interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt caused ``exc`` (in its chain of causes and contexts)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write` of UTF-8 text."""
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def append_line(path: Path, line: str) -> None:
    """Append ``line`` + newline to ``path`` (created if absent) and fsync it.

    Raises:
        StorageError: nothing was appended (a partial write is cut off again).
    """
    path = Path(path)
    data = (line + "\n").encode("utf-8")
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = 0
    except OSError as exc:
        raise StorageError(describe_failure(path, exc)) from exc
    try:
        with open(path, "ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        with contextlib.suppress(OSError):  # best effort: shrinking needs no free space
            os.truncate(path, size)
        raise StorageError(describe_failure(path, exc)) from exc


def truncate_jsonl(path: Path, keep_before_round: int) -> None:
    """Drop the records of rounds >= ``keep_before_round`` from a per-round JSONL log, atomically.

    A resumed run or restarted node re-runs the rounds its checkpoint does not hold; their records (and
    a last line torn by a killed process) go. Raises CheckpointError for a damaged line that is not last.
    """
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            round_index = json.loads(line)["round"]
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):  # a line torn by a killed process: that round re-runs anyway
                _LOGGER.warning("dropping a torn last line of %s", path)
                break
            raise CheckpointError(f"{path} line {number} is not a round record: {exc}") from exc
        if round_index < keep_before_round:
            kept.append(line)
    if len(kept) != len(lines):
        atomic_write_text(path, "".join(line + "\n" for line in kept))
