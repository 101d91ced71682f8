"""The daemon's round in this process: where it beats the watchdog heartbeat and checks for a stop,
and the bounded parallel calls it makes Hellos with."""

from __future__ import annotations

import json
import threading
import time

import pytest

from edge_node.node.config import NodeConfig
from edge_node.node.daemon import Node, Stopped
from edge_node.node.parallel import Abandoned, run_parallel
from edge_node.records import DAEMON_KEYS, DAEMON_OPTIONAL_KEYS, read_records


def _node(tmp_path) -> Node:
    config = NodeConfig(
        node_id="solo", fleet="test", num_clients=6, client_index=0, capacity="0.4", discovery="static",
        peers=("ghost@127.0.0.1:1",), listen="127.0.0.1:0", state_dir=tmp_path / "state", insecure=True,
        threads=1, epochs=1, energy_backend="estimate", export_onnx=True,
    )  # fmt: skip
    return Node(config)


def test_a_round_beats_in_every_phase_and_evaluation_checks_for_a_stop(tmp_path):
    node = _node(tmp_path)
    beats: list[tuple[str, bool]] = []
    evaluating = threading.local()
    beat, accuracy = node.beat, node._accuracy

    def recording_beat() -> None:
        beats.append((node.phase, getattr(evaluating, "on", False)))
        beat()

    def recording_accuracy(model) -> float:  # type: ignore[no-untyped-def]
        evaluating.on = True
        try:
            return accuracy(model)
        finally:
            evaluating.on = False

    node.beat = recording_beat  # type: ignore[method-assign]
    node._accuracy = recording_accuracy  # type: ignore[method-assign]
    try:
        node.startup()
        node.run_round(0)
        assert node.rounds_done == 1
        (record,) = read_records(tmp_path / "state")  # the schema's daemon record: every key, none outside it
        assert set(DAEMON_KEYS) <= set(record) <= {*DAEMON_KEYS, *DAEMON_OPTIONAL_KEYS}, set(record) ^ set(DAEMON_KEYS)
        phases = {phase for phase, _ in beats}
        assert {"communicate", "aggregate", "train", "idle"} <= phases, phases  # idle: checkpoint, status, ONNX
        assert any(in_eval for _, in_eval in beats)  # evaluation batches beat too
        node.should_exit.set()
        started = time.monotonic()
        with pytest.raises(Stopped):
            node._accuracy(node.trained_model)  # stops at its first batch
        assert time.monotonic() - started < 1.0
    finally:
        node.shutdown()


def test_parallel_calls_are_bounded_and_abandoned_at_once_on_stop():
    stop = threading.Event()
    running = 0
    most = 0
    lock = threading.Lock()

    def slow(seconds: float) -> float:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(seconds)
        with lock:
            running -= 1
        return seconds

    started = time.monotonic()
    assert run_parallel(slow, [0.3] * 12, workers=4, stop=stop) == [0.3] * 12
    assert most == 4 and 0.8 < time.monotonic() - started < 3.0  # 3 waves of 0.3 s, not 12 in a row
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Abandoned):
        run_parallel(slow, [2.0] * 20, workers=8, stop=stop)
    assert time.monotonic() - started < 0.6  # walked away from calls that would take 6 s


def test_a_parallel_call_that_raises_gives_none():
    def call(x: int) -> int:
        if x == 2:
            raise RuntimeError("one bad peer")
        return x

    assert run_parallel(call, [1, 2, 3], workers=2, stop=threading.Event()) == [1, None, 3]


def test_a_kill_between_a_rounds_record_and_its_checkpoint_runs_the_round_again(tmp_path, monkeypatch):
    """The record is appended before the checkpoint is saved (a kill between them must not lose a record);
    a node restarted after such a kill drops the record the checkpoint does not hold and runs the round again."""
    from edge_node.node import daemon

    def killed(*_args, **_kwargs) -> None:
        raise KeyboardInterrupt("killed between the record and the checkpoint")

    node = _node(tmp_path)
    monkeypatch.setattr(daemon, "save_checkpoint", killed)
    try:
        node.startup()
        with pytest.raises(KeyboardInterrupt):
            node.run_round(0)
    finally:
        node.shutdown()
    rounds_log = tmp_path / "state" / "rounds.jsonl"
    assert len(rounds_log.read_text().splitlines()) == 1  # the record was written
    assert not (tmp_path / "state" / "checkpoint.pt").exists()
    monkeypatch.undo()
    again = _node(tmp_path)
    try:
        again.startup()
        assert not again.resumed and again.rounds_done == 0
        assert rounds_log.read_text() == ""  # the record the checkpoint does not hold is gone
        again.run_round(0)
        records = [json.loads(line) for line in rounds_log.read_text().splitlines()]
        assert [r["round"] for r in records] == [0] and again.rounds_done == 1  # run again, once
    finally:
        again.shutdown()


@pytest.mark.parametrize(
    ("model", "refusal"),
    [
        ("tests.plugin_factories:tiny_mlp", "does not accept a width argument"),
        ("tests.plugin_factories:unnested_mlp", "is not a nested sub-network"),
        ("tests.plugin_factories:batchnorm_mlp", "tier_mode width cannot train model .*BatchNorm"),
    ],
)
def test_width_tiers_refuse_a_model_they_cannot_narrow_before_anything_is_written(tmp_path, model, refusal):
    from edge_node.errors import ConfigError, ModelError

    config = NodeConfig(
        node_id="solo", fleet="test", dataset="tests.plugin_factories:blobs", model=model, capacity="0.4",
        tier_mode="width", listen="127.0.0.1:0", state_dir=tmp_path / "state", insecure=True, threads=1,
        energy_backend="estimate",
    )  # fmt: skip
    node = Node(config)
    try:
        with pytest.raises((ConfigError, ModelError), match=refusal):
            node.startup()
    finally:
        node.shutdown()
    assert not (tmp_path / "state").exists()
