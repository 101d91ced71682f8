"""A data source seen as a tree of files, whether it is a folder or a ``.tar.gz``, so that each layout
(python batches, image folder, Tiny-ImageNet) is parsed by one function.

A tarball is read member by member into memory (never extracted, so member names such as ``../x``
cannot write anywhere); links, devices and other non-regular members are ignored. It is then read to its
very end, so that the gzip/bzip2/xz checksum is verified and a damaged header cannot silently end the
archive early: either is a :class:`DataError`, never silently corrupt pixels or missing files.
"""

from __future__ import annotations

import logging
import lzma
import os
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Protocol

from edge_node.errors import DataError

_LOG = logging.getLogger(__name__)

MAX_TAR_MEMBER_BYTES = 1 << 30  # one member larger than this is not part of any supported layout
_DRAIN_CHUNK_BYTES = 1 << 20


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (tarfile's and others' messages may span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


class Tree(Protocol):
    """What a layout parser needs from a source."""

    label: str

    def is_file(self, rel: str) -> bool: ...
    def is_dir(self, rel: str) -> bool: ...
    def subdirs(self, rel: str) -> list[str]: ...
    def files_under(self, rel: str) -> list[str]: ...
    def read(self, rel: str) -> bytes: ...


class DirTree:
    """Files of a folder, addressed by POSIX paths relative to it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.label = str(root)

    def is_file(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def is_dir(self, rel: str) -> bool:
        return (self.root / rel).is_dir()

    def subdirs(self, rel: str) -> list[str]:
        """Names of the visible sub-folders of ``rel``, sorted."""
        base = self.root / rel
        if not base.is_dir():
            return []
        return sorted(e.name for e in os.scandir(base) if e.is_dir() and not e.name.startswith("."))

    def files_under(self, rel: str) -> list[str]:
        """All regular files below ``rel`` (recursively), as sorted paths relative to the root."""
        base = self.root / rel
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if not name.startswith(".") and os.path.isfile(os.path.join(dirpath, name)):
                    out.append(name if rel_dir == "." else f"{rel_dir}/{name}")
        return sorted(out)

    def read(self, rel: str) -> bytes:
        try:
            return (self.root / rel).read_bytes()
        except OSError as exc:
            raise DataError(f"cannot read {self.root / rel}: {exc.strerror or exc}") from exc


class TarTree:
    """Regular files of a tar archive (any compression tarfile knows), read once into memory."""

    def __init__(self, path: Path) -> None:
        self.label = str(path)
        self._files: dict[str, bytes] = {}
        try:
            with tarfile.open(path, "r:*") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    rel = _clean_member_name(member.name)
                    if rel is None or any(p.startswith(".") for p in PurePosixPath(rel).parts):
                        continue
                    if member.size > MAX_TAR_MEMBER_BYTES:
                        raise DataError(f"{path}: member {rel} is {member.size} bytes, too large for a data set")
                    f = tar.extractfile(member)
                    if f is None:
                        continue
                    self._files[rel] = f.read()
                # Read the rest: only at its end does gzip compare its CRC-32 (bzip2 and xz likewise), which
                # catches corrupted members. What follows the end-of-archive marker must be zero padding;
                # anything else means tarfile stopped early at a damaged header and files would be missing.
                stream = tar.fileobj
                while stream is not None and (rest := stream.read(_DRAIN_CHUNK_BYTES)):
                    if rest.count(0) != len(rest):
                        raise DataError(f"{path}: data after the point where tar reading stopped (a damaged header?)")
        except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
            raise DataError(f"{path} is not a readable tar archive (corrupt or truncated): {one_line(exc)}") from exc
        self._dirs = {str(p) for rel in self._files for p in PurePosixPath(rel).parents if str(p) != "."}
        _LOG.info("read %d files from %s", len(self._files), path)

    def is_file(self, rel: str) -> bool:
        return rel in self._files

    def is_dir(self, rel: str) -> bool:
        return rel == "" or rel in self._dirs

    def subdirs(self, rel: str) -> list[str]:
        return sorted(PurePosixPath(d).name for d in self._dirs if str(PurePosixPath(d).parent) == (rel or "."))

    def files_under(self, rel: str) -> list[str]:
        prefix = f"{rel}/" if rel else ""
        return sorted(f for f in self._files if f.startswith(prefix))

    def read(self, rel: str) -> bytes:
        try:
            return self._files[rel]
        except KeyError:
            raise DataError(f"{self.label} has no member {rel}") from None


def _clean_member_name(name: str) -> str | None:
    """``./a/b`` -> ``a/b``; None for absolute names or names that climb out with ``..``."""
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if not parts or parts[0] == "/" or ".." in parts:
        return None
    return "/".join(parts)


def join(prefix: str, rel: str) -> str:
    """Join relative POSIX paths where ``prefix`` may be empty."""
    return f"{prefix}/{rel}" if prefix else rel
