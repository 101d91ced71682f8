"""``edge-node status``: what the running daemon says about itself, live, or its last file when it is gone.

The daemon answers on a Unix socket in its state directory (``status.sock``, mode 0600): a client
connects and reads one JSON document. It also writes ``status.json`` atomically after every round, so
that a stopped or crashed node still shows its last state; a reader of that file is told it is not live
(``"source": "file"`` and its age).

Round numbers for people count from 1 (docs/ALGORITHM.md, "Terms"): records keep the 0-based index in
``"round"``, and every line a person reads says ``round N`` (= index N-1) or ``N rounds done``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_node.errors import ConfigError
from edge_node.storage import atomic_write_text

_LOGGER = logging.getLogger(__name__)

STATUS_SOCKET = "status.sock"
STATUS_FILE = "status.json"
MAX_STATUS_BYTES = 1 << 20
_ACCEPT_POLL_S = 0.2
_SEND_TIMEOUT_S = 2.0
_UNIX_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL


def round_label(index: int, total: int | None = None) -> str:
    """``round 3`` or ``round 3/8`` for the round with 0-based ``index`` 2 (``total``: rounds asked for, 0: none)."""
    return f"round {index + 1}" + (f"/{total}" if total else "")


def rounds_done_text(count: int, planned: int | None = None) -> str:
    """``1 round done``, ``3 rounds done``, ``3 of 5 rounds done`` (``planned``: rounds asked for, 0: none)."""
    if planned:
        return f"{count} of {planned} round{'' if planned == 1 else 's'} done"
    return f"{count} round{'' if count == 1 else 's'} done"


class StatusServer:
    """Serves ``snapshot()`` as JSON to each local client of ``<state_dir>/status.sock``."""

    def __init__(self, state_dir: Path, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.path = state_dir / STATUS_SOCKET
        if len(os.fsencode(self.path)) > _UNIX_PATH_MAX:
            raise ConfigError(f"state dir path is too long for its status socket {self.path} (max {_UNIX_PATH_MAX} B)")
        self._snapshot = snapshot
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.path.unlink(missing_ok=True)  # a stale socket of a killed daemon (the state dir lock is ours)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old_umask)
        sock.listen(8)
        sock.settimeout(_ACCEPT_POLL_S)
        self._sock = sock
        self._thread = threading.Thread(target=self._run, name="edge-node-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close()
        self.path.unlink(missing_ok=True)

    def _run(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(_SEND_TIMEOUT_S)
                    conn.sendall(json.dumps(self._snapshot(), default=str).encode())
                except Exception:  # a client that went away, or a snapshot bug: never stop serving
                    _LOGGER.debug("status request failed", exc_info=True)


def query(state_dir: Path, timeout_s: float = 3.0) -> dict[str, Any] | None:
    """The running daemon's status, or None when no daemon answers on ``state_dir``'s socket."""
    path = Path(state_dir) / STATUS_SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            chunks = []
            total = 0
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                total += len(chunk)
                if total > MAX_STATUS_BYTES:
                    return None
    except OSError:
        return None
    try:
        status = json.loads(b"".join(chunks))
    except ValueError:
        return None
    return status if isinstance(status, dict) else None


def write_status_file(state_dir: Path, status: dict[str, Any]) -> None:
    """The last status, for readers when the daemon is gone (StorageError when it cannot be written)."""
    atomic_write_text(Path(state_dir) / STATUS_FILE, json.dumps(status, default=str, indent=1) + "\n")


def read_status_file(state_dir: Path) -> dict[str, Any] | None:
    """The status file with its age added (``"source": "file"``), or None when absent or unreadable."""
    path = Path(state_dir) / STATUS_FILE
    try:
        status = json.loads(path.read_text())
        age = time.time() - path.stat().st_mtime
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict):
        return None
    return {**status, "source": "file", "file": str(path), "file_age_s": round(age, 1), "healthy": False}
