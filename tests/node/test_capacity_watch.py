"""capacity auto while the node runs (node/capacity_watch.py): a sustained change of free CPU moves the tier."""

from __future__ import annotations

import json
import threading
import time

import pytest

from edge_node.fleet import cgroups as _cgroups
from edge_node.fleet.fleet import free_ports
from edge_node.node.capacity import CapacityDecision, configured
from edge_node.node.capacity_watch import CapacityWatch, CpuWindow, FreeCpu, TierMove, changed
from edge_node.node.config import NodeConfig
from edge_node.node.daemon import Node
from edge_node.node.limits import Limits
from edge_node.records import read_records
from edge_node.torch_threads import CpuSample
from tests.daemons import QUICK, NodeProcesses


class _Readings:
    """A window whose reads return the given free CPU values, one per round."""

    def __init__(self, free: list[float]) -> None:
        self.free = list(free)

    def start(self) -> None:
        pass

    def read(self) -> FreeCpu:
        return FreeCpu(self.free.pop(0), 2, None, 0.0)


def _watch(free: list[float], tiers: dict[float, str]) -> tuple[CapacityWatch, list[float]]:
    asked: list[float] = []

    def rechoose(throughput: float) -> CapacityDecision:
        asked.append(throughput)
        return configured(float(tiers[throughput]))

    return CapacityWatch("1.0", rechoose, sustain=2, window=_Readings(free)), asked  # type: ignore[arg-type]


def test_a_change_is_acted_on_only_when_it_lasts_and_moves_only_to_another_tier():
    assert (changed(2.0, 1.5), changed(2.0, 1.6), changed(0.4, 2.0), changed(0.05, 0.12)) == (-1, 0, 1, 0)
    # round 0 is the reference; a one-round dip is noise; two rounds down: measured again on the last round.
    watch, asked = _watch([2.0, 0.3, 2.0, 0.3, 0.3, 0.3, 2.0, 2.0], {10.0: "0.2", 40.0: "1.0"})
    rounds = [(0, 40.0), (1, 10.0), (2, 40.0), (3, 10.0), (4, 10.0), (5, 10.0), (6, 40.0), (7, 40.0)]
    moves = [watch.round_ended(t, int(tp * 2), 2.0) for t, tp in rounds]
    assert [m is not None for m in moves] == [False, False, False, False, True, False, False, True]
    down, up = moves[4], moves[7]
    assert down is not None and up is not None and asked == [10.0, 40.0]
    assert (down.before, down.after, down.direction, down.after_round) == ("1.0", "0.2", "down", 4)
    assert "free CPU 2.00 CPUs free" in down.cause and "-> 0.30 CPUs free" in down.cause
    assert "40.0 -> 10.0 samples/s" in down.cause
    assert down.to_json()["decided_by"] == "--capacity 0.2" and (up.after, up.direction) == ("1.0", "up")
    # A lasting change that leaves the tier where it is: measured again, no move, and the new reading is the reference.
    watch, asked = _watch([2.0, 1.0, 1.0, 1.0, 1.0], {20.0: "1.0"})
    assert [watch.round_ended(t, 40, 2.0) for t in range(5)] == [None] * 5 and asked == [20.0]


def test_the_window_reads_the_quota_and_other_programs_less_this_process():
    samples = iter([CpuSample(0.0, 10.0, 1.0), CpuSample(2.0, 12.5, 2.0)])  # 2.5 s busy of which 1 s ours, in 2 s
    window = CpuWindow((0, 1), sample=lambda _cores: next(samples),
                       limits=lambda: Limits(0.5, "quota", None, None, ""))  # fmt: skip
    window.start()
    free = window.read()
    assert free is not None and (free.others, free.quota, free.cpus) == (0.75, 0.5, 0.5)
    assert "quota 0.5 CPUs" in free.text() and free.to_json()["cpus"] == 0.5


def test_a_node_moves_down_a_tier_when_its_cgroup_quota_drops_and_back_when_it_returns(require_root, tmp_path):
    """A real daemon in a cgroup whose CPU quota is changed beside it (as an operator changes a container's).

    First two rounds at a fixed tier time a round's training (T, the faster of the two: the first may run
    cold); the node then resumes with capacity auto and a round budget of 2 T. A quota of 0.25 CPUs makes
    training about 4 T: the move down (to 0.2: no tier's training fits) takes effect at the third round
    boundary after the change; with the quota gone training fits again and the node moves back, as fast.
    Bound stated in docs: a move at the (sustain + 1)th round
    boundary after a change that lasts.
    """
    hierarchy = _cgroups.system_hierarchy()
    if hierarchy is None:
        pytest.skip("no cgroup hierarchy with the cpu and memory controllers")
    (port,) = free_ports(1)
    args = [*QUICK, "--fleet", "test", "--num-clients", "12", "--client-index", "0", "--discovery", "static",
            "--peers", "127.0.0.1:1", "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    state = tmp_path / "s"
    with (
        _cgroups.device_group(hierarchy, "recheck", kind="test", cpu=None, memory_bytes=None) as group,
        NodeProcesses() as nodes,
    ):
        first = nodes.start("solo", state, [*args, "--capacity", "1.0", "--rounds", "2"], prefix=group.wrap([]))
        assert first.wait(120) == 0, first.log()
        budget = 2 * min(r["seconds"]["train"] for r in first.records)  # a warm round's: the first may run cold
        node = nodes.start("solo", state, [*args, "--capacity", "auto", "--round-budget-s", f"{budget:.3f}"],
                           prefix=group.wrap([]))  # fmt: skip
        node.wait_rounds(3, timeout_s=120)  # round 2 (after the first run's rounds 0 and 1) is the reference
        group.set_cpu(0.25)
        changed_at = len(node.completed())
        moved_down = _wait_for_move(node, "0.2", 180)
        group.set_cpu(None)
        restored_at = len(node.completed())
        moved_up = _wait_for_move(node, "1.0", 180)
        status = _status_after(state, lambda st: st["tier_moves"]["up"] >= 1, 60)
    down, up = moved_down["tier_move"], moved_up["tier_move"]
    assert (down["from"], down["to"], up["from"], up["to"]) == ("1.0", "0.2", "0.2", "1.0"), (down, up)
    assert "quota 0.25 CPUs" in down["cause"] and "no tier fits" in down["decided_by"], down
    assert "no quota" in up["cause"] and "every constraint fits" in up["decided_by"], up
    # The bound: the move takes effect within sustain (2) + 1 round boundaries of the change.
    assert moved_down["round"] - changed_at <= 3 and moved_up["round"] - restored_at <= 3, (changed_at, moved_down)
    assert moved_down["density"] == pytest.approx(0.2, abs=0.01) and moved_up["density"] == pytest.approx(1.0)
    assert status["tier_moves"] == {"down": 1, "up": 1} and status["capacity"]["source"] == "remeasured"
    log = node.log(200)
    assert "tier 1.0 -> 0.2 at the next round boundary" in log and "tier 0.2 -> 1.0" in log, log


def _status_after(state, ready, timeout_s: float) -> dict:
    """status.json once ``ready`` holds: a round's record is appended before the round's status file is written
    (checkpoint and publish come between), so the file read at once may still be the round before's."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = json.loads((state / "status.json").read_text())
        if ready(status) or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def _wait_for_move(node, to: str, timeout_s: float) -> dict:
    """The record of the round in which the node moved to tier ``to``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        moved = [r for r in node.completed() if r.get("tier_move", {}).get("to") == to]
        if moved:
            return moved[0]
        assert node.proc.poll() is None, node.log()
        time.sleep(0.2)
    raise AssertionError(f"no move to tier {to} after {timeout_s} s: {[r['tier'] for r in node.completed()]}\n"
                         f"{node.log(60)}")  # fmt: skip


class _MovesOnce:
    """A watch that decides one move, to ``to``, after round ``after``."""

    def __init__(self, after: int, to: float) -> None:
        self.after, self.to = after, to

    def round_began(self) -> None:
        pass

    def round_ended(self, round_index: int, samples: int, train_s: float) -> TierMove | None:
        if round_index != self.after:
            return None
        return TierMove(round_index, "0.6", f"{self.to:g}", "forced by the test", configured(self.to))


def test_under_lockstep_a_move_takes_effect_at_the_fleets_round_boundary_and_peers_take_the_new_density(tmp_path):
    """Two lock-step nodes in this process; node a moves 0.6 -> 0.2 after round 0. Its round 1 trains on the
    new tier, its snapshot of round 2 carries it, and b (which waits for a's snapshot of each round) takes it:
    the fleet goes on in step, nothing refused."""
    ports = free_ports(2)
    peers = (f"a@127.0.0.1:{ports[0]}", f"b@127.0.0.1:{ports[1]}")
    nodes = [
        Node(NodeConfig(
            node_id=name, fleet="test", num_clients=2, client_index=i, capacity="0.6", discovery="static",
            peers=peers, listen=f"127.0.0.1:{ports[i]}", state_dir=tmp_path / name, insecure=True, threads=1,
            epochs=1, energy_backend="estimate", export_onnx=False, lockstep=True, neighbours=1, rounds=3,
            round_budget_s=60,
        ))
        for i, name in enumerate(("a", "b"))
    ]  # fmt: skip
    errors: list[BaseException] = []

    def run(node: Node, watch: object | None) -> None:
        try:
            node.startup()
            if watch is not None:
                node.capacity_watch = watch  # type: ignore[assignment]
            node.main_loop()
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            errors.append(exc)
        finally:
            node.shutdown()

    threads = [threading.Thread(target=run, args=(nodes[0], _MovesOnce(0, 0.2))),
               threading.Thread(target=run, args=(nodes[1], None))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors and not any(t.is_alive() for t in threads), errors
    a, b = (read_records(tmp_path / name) for name in ("a", "b"))
    assert [r["tier"] for r in a] == ["0.6", "0.2", "0.2"] and "tier_move" not in a[0]
    assert a[1]["tier_move"]["to"] == "0.2" and a[1]["density"] == pytest.approx(0.2, abs=0.01)
    assert [r["round"] for r in a] == [r["round"] for r in b] == [0, 1, 2]
    assert all(r["peers_answered"] == ["a"] and not r["peers_refused"] for r in b), b  # every round, a's snapshot
    assert all(r["peers_answered"] == ["b"] for r in a), a
