"""Daemon threads kept for the next job: the decoder's builders and the client's pulls.

A pool made per ``pull_models`` call cost a loopback ResNet18 pull (about 16 ms) 0.2-0.3 ms to start its
thread and 0.5-0.65 ms to join it; kept threads took 0.13 and 0.35-0.40 ms. They wait for the next job.

They are daemon threads, so an idle one never delays an exit. A job's end may drop the last reference
to a tensor, and torch's tensor destructor takes the GIL, which a daemon thread may no longer take once
the interpreter finalizes: it then unwinds through C++ and the process aborts ("terminate called without
an active exception", seen in about 1 exit in 4 right after a decode). So the pool counts each job until
its thread has let go of it, and at exit the interpreter waits for them (``EXIT_WAIT_S`` at most).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

EXIT_WAIT_S = 5.0  # the longest an exit waits for the jobs in flight


class KeptThreads:
    """Daemon threads, started as jobs need them, that run jobs in the order they come.

    Args:
        name: the threads' name prefix.
        max_threads: the most at once; further jobs wait for a free thread (None: a thread for each
            job at once).
        idle_s: a thread idle this long ends (None: it waits for ever; idle, it holds nothing).
    """

    def __init__(self, name: str, *, max_threads: int | None = None, idle_s: float | None = None) -> None:
        if max_threads is not None and max_threads < 1:
            raise ValueError(f"max_threads={max_threads} must be at least 1")
        self.name = name
        self.max_threads = max_threads
        self._idle_s = idle_s
        self._reset()
        if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's threads: start afresh
            os.register_at_fork(after_in_child=self._reset)
        atexit.register(self.wait_done, EXIT_WAIT_S)  # returns at once when nothing is in flight

    def _reset(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._all_done = threading.Condition(self._lock)
        self._threads = 0  # alive
        self._free = 0  # idle threads less queued jobs (below 0: jobs wait for a thread)
        self._unfinished = 0  # jobs submitted whose thread has not yet let go of them
        self._started = 0  # threads ever started, for their names

    @property
    def threads(self) -> int:
        """Threads alive now."""
        return self._threads

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on an idle thread, a new one, or (at ``max_threads``) the next to be free.

        It must not raise: a job keeps its outcome itself (``call`` keeps it in a future)."""
        with self._lock:
            self._unfinished += 1
            self._free -= 1
            start = self._free < 0 and (self.max_threads is None or self._threads < self.max_threads)
            if start:
                self._threads += 1
                self._free += 1  # the new thread is this job's
                self._started += 1
                name = f"{self.name}-{self._started}"
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._work, name=name, daemon=True).start()

    def call(self, function: Callable[[], T]) -> Future[T]:
        """``submit`` ``function``; the future holds what it returns or raises (skipped if cancelled first)."""
        future: Future[T] = Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(function())
            except BaseException as exc:  # the caller reads it from the future
                future.set_exception(exc)

        self.submit(job)
        return future

    def wait_done(self, timeout_s: float) -> bool:
        """Wait until every job submitted has ended and been let go of; False if ``timeout_s`` passed first."""
        with self._all_done:
            return self._all_done.wait_for(lambda: self._unfinished == 0, timeout_s)

    def _work(self) -> None:
        timeout_s: float | None = None  # started for a job that is queued: it is there
        while True:
            try:
                job = self._jobs.get(timeout=timeout_s)
            except queue.Empty:
                with self._lock:
                    if self._free > 0:  # more idle threads than queued jobs: this one ends
                        self._free -= 1
                        self._threads -= 1
                        return
                job = self._jobs.get()  # a job was queued as it timed out: it is there
            job()
            del job  # let go of it (and what it held) before counting it done
            with self._all_done:
                self._free += 1
                self._unfinished -= 1
                if not self._unfinished:
                    self._all_done.notify_all()
            timeout_s = self._idle_s
