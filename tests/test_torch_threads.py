"""The thread policy: torch's threads follow the cores other programs leave free; a fixed count stays fixed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from edge_node.torch_threads import CpuSample, ThreadGovernor, apply_threads, explicit_threads, threads_for


def test_threads_are_the_free_cores_rounded_at_least_one_at_most_the_cap() -> None:
    assert threads_for(2, 0.0, 2) == 2
    assert threads_for(2, 0.4, 2) == 2  # a light load beside us: both cores still pay
    assert threads_for(2, 0.6, 2) == 1  # most of a core taken
    assert threads_for(2, 1.0, 2) == 1
    assert threads_for(2, 2.0, 2) == 1  # never none
    assert threads_for(8, 0.0, 4) == 4  # never above torch's own count
    assert threads_for(2, 0.0, 2, quota=0.25) == 1  # a cgroup quota of a quarter core: one thread
    assert threads_for(4, 0.0, 4, quota=2.0) == 2 and threads_for(4, 3.0, 4, quota=2.0) == 1


def test_a_cgroup_quota_set_while_running_caps_the_threads() -> None:
    cpu, quota = FakeCpu(), [None]
    governor = ThreadGovernor(2, cores=(0, 1), every_s=0.0, sample=cpu.sample, apply=cpu.applied.append,
                              quota=lambda: quota[0])  # fmt: skip
    quota[0] = 0.5
    for _ in range(2):
        cpu.step(others=0.0, own=0.5)
        governor.tick()
    assert governor.threads == 1 and cpu.applied == [2, 1]
    quota[0] = None
    for _ in range(2):
        cpu.step(others=0.0, own=1.0)
        governor.tick()
    assert governor.threads == 2 and cpu.applied == [2, 1, 2]


class FakeCpu:
    """CPU counters advanced by hand: each ``step`` adds a second in which others and we used what is given."""

    def __init__(self) -> None:
        self.at = self.busy = self.own = 0.0
        self.applied: list[int] = []

    def step(self, others: float, own: float) -> None:
        self.at += 1.0
        self.busy += others + own
        self.own += own

    def sample(self, _cores: object) -> CpuSample:
        return CpuSample(self.at, self.busy, self.own)


def _governor(cpu: FakeCpu) -> ThreadGovernor:
    return ThreadGovernor(2, cores=(0, 1), every_s=0.0, sample=cpu.sample, apply=cpu.applied.append)


def test_a_core_taken_for_a_sustained_time_costs_one_thread_and_it_comes_back() -> None:
    cpu = FakeCpu()
    governor = _governor(cpu)
    assert cpu.applied == [2]
    cpu.step(others=1.0, own=1.0)
    assert governor.tick() == 2  # one second of load is noise
    cpu.step(others=1.0, own=1.0)
    assert governor.tick() == 1 and cpu.applied == [2, 1]
    for _ in range(3):
        cpu.step(others=1.0, own=1.0)
        assert governor.tick() == 1
    cpu.step(others=0.0, own=1.0)
    assert governor.tick() == 1
    cpu.step(others=0.0, own=1.0)
    assert governor.tick() == 2 and cpu.applied == [2, 1, 2] and governor.changes == 2


def test_our_own_threads_spinning_are_not_taken_for_another_program() -> None:
    cpu = FakeCpu()
    governor = _governor(cpu)
    for _ in range(5):
        cpu.step(others=0.0, own=2.0)  # both cores busy, all of it ours
        assert governor.tick() == 2
    assert cpu.applied == [2]


def test_a_load_that_comes_and_goes_every_second_moves_nothing() -> None:
    cpu = FakeCpu()
    governor = _governor(cpu)
    for k in range(8):
        cpu.step(others=1.0 if k % 2 else 0.0, own=1.0)
        assert governor.tick() == 2


def test_a_fixed_count_is_the_flag_else_omp_num_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert explicit_threads(None) is None and explicit_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert explicit_threads(None) == 1 and explicit_threads(2) == 2
    assert apply_threads(None) is None  # fixed: no policy to tick
    monkeypatch.setenv("OMP_NUM_THREADS", "auto")  # not a count: the policy decides
    assert explicit_threads(None) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_program_spinning_on_one_of_two_cores_takes_a_thread_away() -> None:
    cores = sorted(os.sched_getaffinity(0))[:2]
    spin = f"import os; os.sched_setaffinity(0, {{{cores[0]}}})\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        applied: list[int] = []
        governor = ThreadGovernor(2, cores=cores, every_s=0.3, apply=applied.append)
        end = time.monotonic() + 10.0
        while governor.threads == 2 and time.monotonic() < end:
            time.sleep(0.05)
            governor.tick()
        assert governor.threads == 1 and applied == [2, 1]
    finally:
        spinner.kill()
        spinner.wait()


class CountingGovernor:
    """Stands in for the thread policy: counts the ticks a run makes."""

    def __init__(self) -> None:
        self.ticks = 0

    def tick(self) -> int:
        self.ticks += 1
        return 1


@pytest.mark.parametrize("method", ["dispfl", "fedavg"])
def test_a_simulation_without_a_fixed_count_ticks_the_policy_before_every_training_batch(
    method: str, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from edge_node.data import load_dataset
    from edge_node.sim import runner
    from edge_node.sim.config import SimConfig

    governor = CountingGovernor()
    monkeypatch.setattr(runner, "apply_threads", lambda threads: governor)
    config = SimConfig(method=method, clients=2, neighbours=1, fedavg_clients=2, rounds=1, epochs=1,
                       samples_per_client=40, batch_size=20, progress=False, energy_backend="estimate",
                       output=tmp_path / method)  # fmt: skip
    runner.run_simulation(config, load_dataset("demo"))
    assert governor.ticks >= 2 * 2  # 2 clients x (at least) 2 batches of 20 of their training samples
