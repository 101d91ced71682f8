"""``cuda_graphs`` in the simulation: refused where a step cannot be captured, resumable, and plumbed to the
training of the methods that declare it. The plumbing runs on the CPU with the captured step's function run
uncaptured (tests/algorithm/steps.py); capture itself is bench/graphs_check.py's, on a GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import edge_node.sim.runner as runner
from edge_node.data import load_dataset
from edge_node.errors import ConfigError
from edge_node.sim.checkpoint import load_checkpoint
from edge_node.sim.config import LEGACY_DEFAULTS, SimConfig
from edge_node.sim.runner import run_simulation
from tests.algorithm.steps import RecordingStep
from tests.sim.tiny import TINY, read_records

CUDA = dict(device="cuda", micro_batch=0, cuda_graphs=True)


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        (dict(cuda_graphs=True, micro_batch=0), "cuda_graphs needs device cuda"),
        (dict(CUDA, micro_batch=16), "needs micro_batch 0, not 16"),
        (dict(CUDA, method="fedp3", privacy="ldp", epsilon=8.0), "privacy 'ldp'"),
    ],
)
def test_a_run_that_cannot_capture_its_step_is_refused(settings, needle):
    with pytest.raises(ConfigError, match=needle) as caught:
        SimConfig(**settings)
    assert "\n" not in str(caught.value)


def test_it_changes_how_not_what_a_run_computes():
    config = SimConfig(**CUDA)  # constructing a config asks nothing of the GPU
    assert config.differences({**config.to_json(), "cuda_graphs": False}) == []  # resumable either way
    assert LEGACY_DEFAULTS["cuda_graphs"] is False
    assert SimConfig().cuda_graphs is False
    warnings = SimConfig(**CUDA, method="ditto").ignored({"cuda_graphs"})
    assert warnings == ["cuda_graphs is ignored by method ditto (used by " + warnings[0].split("(used by ")[1]]
    assert "dispfl" in warnings[0] and "ditto" not in warnings[0].split("(used by ")[1]
    assert SimConfig(**CUDA).ignored({"cuda_graphs"}) == []


def _cpu_copy(config: SimConfig) -> SimConfig:
    """``config`` (checked as a CUDA run) on the CPU: how the plumbing is run without a GPU."""
    cpu = dataclasses.replace(config, cuda_graphs=False, device="cpu")
    object.__setattr__(cpu, "cuda_graphs", True)
    return cpu


@pytest.mark.parametrize("method", ["dispfl", "local"])
def test_the_runs_one_captured_step_trains_every_full_batch_of_every_client(tmp_path, monkeypatch, method):
    torch.set_num_threads(1)  # restored by conftest
    made: list[RecordingStep] = []

    def capture(model, shape, sgd):
        made.append(RecordingStep(model, shape, sgd))
        return made[-1]

    monkeypatch.setattr(runner, "GraphedStep", capture)
    data = load_dataset("demo")
    settings = dict(TINY, rounds=1, samples_per_client=40, method=method)  # 40 = 32 + an eager batch of 8
    graphed = _cpu_copy(SimConfig(**settings, **CUDA, output=tmp_path / "graphed"))
    eager = SimConfig(**settings, micro_batch=0, output=tmp_path / "eager")
    saved = {}
    for config in (graphed, eager):
        saved[config.cuda_graphs] = load_checkpoint(run_simulation(config, data) / "checkpoint.pt", torch.device("cpu"))
    assert len(made) == 1 and made[0].batch_shape == (32, 3, 32, 32)
    assert made[0].replayed == [32] * TINY["clients"]  # each client's full batch; its batch of 8 ran eagerly
    largest = max(
        (a[k] - b[k]).abs().max().item()
        for a, b in zip(saved[True]["weights"], saved[False]["weights"], strict=True)
        for k in a
    )
    assert largest <= 1e-5
    (g,), (e,) = read_records(graphed.run_dir), read_records(eager.run_dir)
    assert g["train_loss_mean"] == pytest.approx(e["train_loss_mean"], rel=1e-5)


def test_a_method_that_ignores_it_never_captures(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "GraphedStep", lambda *a: pytest.fail("captured for a method that ignores it"))
    config = _cpu_copy(SimConfig(**dict(TINY, rounds=1, method="ditto"), **CUDA, output=tmp_path / "ditto"))
    run_simulation(config, load_dataset("demo"))


def test_the_command_line_takes_whole_batches_with_cuda_graphs_unless_told_otherwise(tmp_path, capsys):
    """``--cuda-graphs`` sets micro_batch 0 when it is not given (the flag, a TOML file): a first run and its resume
    need not repeat it; an explicit other value is still refused."""
    from edge_node.cli import main

    def cli(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(["simulate", "--device", "cuda", *args, "--print-config"])
        captured = capsys.readouterr()
        return int(exc.value.code or 0), captured.out, captured.err

    code, out, _ = cli("--cuda-graphs")
    assert code == 0 and "micro_batch = 0" in out.splitlines() and "cuda_graphs = true" in out.splitlines()
    toml = tmp_path / "run.toml"
    toml.write_text("cuda_graphs = true\n")
    code, out, _ = cli("--config", str(toml))
    assert code == 0 and "micro_batch = 0" in out.splitlines()
    code, _, err = cli("--cuda-graphs", "--micro-batch", "16")
    assert code != 0 and "needs micro_batch 0, not 16" in err
    code, out, _ = cli()
    assert code == 0 and f"micro_batch = {SimConfig().micro_batch}" in out.splitlines()
