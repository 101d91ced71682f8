"""Kept daemon threads: jobs start at once (or wait at the cap), idle threads end, outcomes reach futures."""

from __future__ import annotations

import threading
import time

import pytest

from edge_node.threads import KeptThreads


def _wait_until(condition, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_a_thread_is_kept_for_the_next_job_and_ends_when_idle() -> None:
    pool = KeptThreads("test-kept", idle_s=0.3)
    names = [pool.call(lambda: threading.current_thread().name).result(10) for _ in range(5)]
    assert len(set(names)) == 1 and pool.threads == 1  # one after the other: the same thread each time
    assert _wait_until(lambda: pool.threads == 0)
    assert not any(t.name == names[0] for t in threading.enumerate())


def test_jobs_submitted_together_each_get_a_thread_at_once() -> None:
    pool = KeptThreads("test-together", idle_s=5)
    barrier = threading.Barrier(6, timeout=10)
    futures = [pool.call(barrier.wait) for _ in range(5)]
    barrier.wait()  # would time out unless all five ran at the same time
    assert len({f.result(10) for f in futures}) == 5  # each party of the barrier once
    assert pool.wait_done(10) and pool.threads == 5


def test_at_the_cap_jobs_wait_for_a_free_thread() -> None:
    pool = KeptThreads("test-cap", max_threads=2)
    release = threading.Event()
    order: list[int] = []
    held = [pool.call(release.wait) for _ in range(2)]
    queued = [pool.call(lambda i=i: order.append(i)) for i in range(4)]
    time.sleep(0.1)
    assert order == [] and pool.threads == 2
    release.set()
    for future in held + queued:
        future.result(10)
    assert sorted(order) == [0, 1, 2, 3]  # two threads take them: in queue order, maybe finishing out of it
    assert pool.threads == 2


def test_an_exception_reaches_the_future_and_the_thread_lives_on() -> None:
    pool = KeptThreads("test-raise", idle_s=5)

    def boom() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        pool.call(boom).result(10)
    assert pool.call(lambda: 7).result(10) == 7 and pool.threads == 1


def test_jobs_racing_an_idle_timeout_all_run() -> None:
    """Jobs that arrive just as idle threads time out are each run once (no job lost, none run twice)."""
    pool = KeptThreads("test-race", idle_s=0.001)
    counter = iter(range(10**6))
    results = []
    for _ in range(300):
        results.extend(pool.call(lambda: next(counter)) for _ in range(3))
        time.sleep(0.001)
    assert sorted(f.result(10) for f in results) == list(range(900))
    assert pool.wait_done(10)


def test_max_threads_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_threads=0"):
        KeptThreads("test-bad", max_threads=0)
