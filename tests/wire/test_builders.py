"""The builder threads let go of every finished build before the interpreter finalizes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import weakref
from pathlib import Path

from edge_node.wire import _build

_EXIT_WITH_JOBS_QUEUED = """
import numpy as np
import torch

from edge_node.wire import _build


class Job:
    \"\"\"Holds the only reference to a tensor view, as a finished build does, until its worker lets go of it.\"\"\"

    def __init__(self) -> None:
        self.built = (torch.from_numpy(np.zeros(4, np.float32)).reshape(2, 2),)

    def __call__(self) -> None:
        pass


for _ in range(1000):
    _build.BUILDERS.submit(Job())
"""


def test_a_process_exits_cleanly_while_builders_still_hold_tensors() -> None:
    """Exiting with builds in flight: a worker that drops a tensor once the interpreter finalizes aborts the
    process ("terminate called without an active exception", rc 134: 9 exits in 10 without the wait at exit,
    and about 1 in 4 right after a decode). With the wait, every exit is clean."""
    root = Path(__file__).resolve().parents[2]
    runs = [
        subprocess.Popen([sys.executable, "-c", _EXIT_WITH_JOBS_QUEUED], cwd=root, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=120)
        assert run.returncode == 0, stderr


def test_wait_done_returns_once_the_jobs_and_what_they_held_are_let_go() -> None:
    release = threading.Event()

    class Holder:
        def __call__(self) -> None:
            release.wait(10)

    holder = Holder()
    gone = weakref.ref(holder)
    _build.BUILDERS.submit(holder)
    del holder
    assert not _build.BUILDERS.wait_done(0.05)  # still running
    release.set()
    assert _build.BUILDERS.wait_done(10)
    assert gone() is None


def test_a_forked_child_starts_builders_of_its_own() -> None:
    """A child forked after the builders started has none of their threads: its builds still run."""
    _build.BUILDERS.submit(lambda: None)
    assert _build.BUILDERS.wait_done(10)
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        ran, ok = threading.Event(), False
        try:
            _build.BUILDERS.submit(ran.set)
            ok = ran.wait(10) and _build.BUILDERS.wait_done(10)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
