"""Bounded parallel calls that the daemon can walk away from when it is told to stop.

Hellos to static peers and the lock-step barrier's polls each take up to their own timeout; one after
another they would add up (2 s each) and hold a stopping daemon. Here at most ``workers`` run at once,
in daemon threads, and the caller stops waiting as soon as ``stop`` is set: the calls still running end
on their own timeouts without holding the process (daemon threads are not joined at exit).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

_LOGGER = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
POLL_S = 0.05


class Stopped(Exception):
    """The daemon was told to stop: raised inside start-up or a round, which is then dropped."""


class Abandoned(Exception):
    """``stop`` was set before every call finished; the results so far are in ``results``."""

    def __init__(self, results: list[object]) -> None:
        super().__init__("stopped while calls were running")
        self.results = results


def run_parallel(
    call: Callable[[T], R], items: Sequence[T], *, workers: int, stop: threading.Event, name: str = "call"
) -> list[R | None]:
    """``[call(item) for item in items]`` with at most ``workers`` at once; an item whose call raised gives None.

    Raises:
        Abandoned: ``stop`` was set before all calls ended (checked every ``POLL_S``).
    """
    results: list[R | None] = [None] * len(items)
    slots = threading.Semaphore(max(1, workers))
    finished = threading.Semaphore(0)

    def one(index: int, item: T) -> None:
        try:
            results[index] = call(item)
        except Exception:  # one bad peer must not take the others' answers down
            _LOGGER.debug("%s %r failed", name, item, exc_info=True)
        finally:
            slots.release()
            finished.release()

    for index, item in enumerate(items):
        while not slots.acquire(timeout=POLL_S):
            if stop.is_set():
                raise Abandoned(list(results))
        if stop.is_set():
            slots.release()
            raise Abandoned(list(results))
        threading.Thread(target=one, args=(index, item), name=f"edge-node-{name}", daemon=True).start()
    for _ in items:
        while not finished.acquire(timeout=POLL_S):
            if stop.is_set():
                raise Abandoned(list(results))
    return results
