"""One ``edge-node start`` process of a loopback fleet: start it, follow its records, stop it by its pid.

The daemon runs in a session of its own, so that a Ctrl-C in the terminal reaches only the fleet's
supervisor, which then stops each daemon with SIGTERM (its clean stop); and with a parent-death signal
(SIGTERM), so that a supervisor killed with SIGKILL does not leave daemons behind on 127.0.0.1. Its
stdout and stderr go to ``OUTPUT/<node>.log``. Processes are only ever signalled by their own pid.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from edge_node.records import ROUNDS_LOG, upgrade_record

STOP_GRACE_S = 20.0  # SIGTERM, then this long for a clean stop, then SIGKILL
KILL_WAIT_S = 10.0
_PR_SET_PDEATHSIG = 1  # <sys/prctl.h>
_libc: Any = None


def _parent_death_signal() -> None:
    """In the child between fork and exec: receive SIGTERM when the supervisor dies (Linux)."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _load_libc() -> None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        _libc = ctypes.CDLL(None, use_errno=True)  # resolved before fork: the child only calls it


@dataclass
class DaemonProcess:
    """A daemon of the fleet; ``argv`` is the full command (``ip netns exec NS ...`` included)."""

    node_id: str
    state_dir: Path
    argv: list[str]
    log_path: Path
    namespace: str | None = None
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    records: list[dict[str, Any]] = field(default_factory=list)
    starts: int = 0
    _offset: int = 0
    _partial: bytes = b""
    _file_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the rounds log read so far
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        """Start (or restart) the daemon; call from the thread that lives as long as the fleet (the main one)."""
        if self.running:
            raise RuntimeError(f"{self.node_id} is already running (pid {self.pid})")
        _load_libc()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._close_log()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 -- closed when the daemon is reaped
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            preexec_fn=_parent_death_signal,  # noqa: PLW1509 -- only a pre-resolved prctl call
        )
        self.starts += 1

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to this daemon's pid (nothing when it has exited)."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signum)

    def wait(self, timeout_s: float) -> int | None:
        """Its exit status, or None when still running after ``timeout_s``."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL; returns the exit status (None if never started)."""
        if self.proc is None:
            return None
        if self.running:
            self.signal(signal.SIGTERM)
            if self.wait(grace_s) is None:
                self.kill()
        code = self.wait(KILL_WAIT_S)
        self._close_log()
        return code

    def kill(self) -> None:
        """SIGKILL by pid and reap."""
        if self.running:
            self.signal(signal.SIGKILL)
        self.wait(KILL_WAIT_S)

    def reaped(self) -> None:
        """Release the log handle once the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def read_new_records(self) -> list[dict[str, Any]]:
        """Records appended to its rounds.jsonl since the last call (complete lines only).

        A restarted daemon drops the records its checkpoint does not hold by replacing the log (an atomic
        rename: a new inode), and may have appended new rounds before the next call, so the file can be
        longer than before. A log that is another file than the one read so far (or shorter than what was
        read) is therefore read again from its start.
        """
        path = self.state_dir / ROUNDS_LOG
        try:
            f = open(path, "rb")  # noqa: SIM115 -- closed below; fstat of this handle, not of a later path lookup
        except FileNotFoundError:
            return []
        with f:
            st = os.fstat(f.fileno())
            file_id = (st.st_dev, st.st_ino)
            if file_id != self._file_id or st.st_size < self._offset:  # replaced or truncated: a resume
                self._offset, self._partial, self._file_id = 0, b"", file_id
                self.records = []
            if st.st_size == self._offset:
                return []
            f.seek(self._offset)
            chunk = f.read(st.st_size - self._offset)
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        new = []
        for line in lines:
            if line.strip():
                try:
                    new.append(upgrade_record(json.loads(line)))
                except ValueError:
                    continue  # never written by the daemon (it appends whole lines); ignore rather than crash
        if self.records and new and new[0].get("round", 0) <= self.records[-1].get("round", -1):
            # re-run rounds after a resume replace the ones the checkpoint did not hold
            first = new[0].get("round", 0)
            self.records = [r for r in self.records if r.get("round", 0) < first]
        self.records.extend(new)
        return new

    @property
    def completed(self) -> list[dict[str, Any]]:
        return [r for r in self.records if not r.get("diverged")]

    def log_tail(self, lines: int = 12) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def exit_description(code: int, *, short: bool = False) -> str:
    """How a process ended, in words, from its status (negative: the signal that killed it).

    ``exited with code 2`` or ``killed by signal 9 (SIGKILL)``; short (a table cell): ``exit 2`` or
    ``SIGKILL``. Every message of the fleet about an exit uses this, so they agree.
    """
    if code >= 0:
        return f"exit {code}" if short else f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}" if short else f"killed by signal {-code}"
    return name if short else f"killed by signal {-code} ({name})"


def python_command(module: str = "edge_node") -> list[str]:
    """How to run ``edge-node`` (or another of the package's entry ``module``) with this interpreter (no PATH)."""
    return [sys.executable, "-m", module]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_our_daemon(pid: int, state_dir: Path) -> bool:
    """Whether ``pid`` is an ``edge-node start`` on ``state_dir`` (so a recycled pid is never signalled)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    words = [a.decode(errors="replace") for a in argv]
    return "start" in words and "edge_node" in " ".join(words) and str(state_dir) in words


def end_leftover(pid: int, state_dir: Path, grace_s: float = STOP_GRACE_S) -> bool:
    """Stop a daemon a killed supervisor left (SIGTERM, bounded wait, SIGKILL); True when one was ended."""
    if not is_our_daemon(pid, state_dir):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and is_our_daemon(pid, state_dir):
        time.sleep(0.1)
    if is_our_daemon(pid, state_dir):
        os.kill(pid, signal.SIGKILL)
    return True
