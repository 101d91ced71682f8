"""Where a benchmark ran: the commit and the machine, written next to its figures."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The checkout's short commit hash, ``+changes`` when tracked files differ from it, or ``unknown`` when
    this copy is not a git checkout's root (a ``git archive`` copy inside another checkout, say)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()  # fmt: skip

    try:
        if Path(git("rev-parse", "--show-toplevel") or "/nonexistent").resolve() != REPO.resolve():
            return "unknown"
        changed = git("status", "--porcelain", "--untracked-files=no")
        return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+changes" if changed else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def machine() -> str:
    """Host name, CPUs, memory and the load average now (a busy machine slows every figure)."""
    return (f"{platform.node()}: {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
            f"load average at the end {os.getloadavg()[0]:.1f}")  # fmt: skip
