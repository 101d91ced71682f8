"""Getting the trained model out: ``edge-node export`` for a node's state dir (any model kind, nothing but
``--state-dir``) and a simulation's client (``--run --client``), ``load_trained``, the ONNX check before a
command that exports writes anything, and a daemon whose per-round export fails (it goes on training)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from edge_node.api import load_trained, run_simulation
from edge_node.cli import main
from edge_node.errors import CheckpointError, ModelError
from edge_node.node.config import NodeConfig
from edge_node.node.daemon import Node
from edge_node.node.export import ONNX_FILE, onnx_problem, with_weights
from edge_node.sim.config import SimConfig

P = "tests.plugin_factories"
X = "tests.export_factories"


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(args)
    return int(exc.value.code or 0)


def _node_config(state_dir: Path, model: str, *, export_onnx: bool = True) -> NodeConfig:
    return NodeConfig(
        node_id="n0", fleet="lab", num_clients=2, client_index=0, capacity="0.6", discovery="static",
        peers=("ghost@127.0.0.1:1",), listen="127.0.0.1:0", state_dir=state_dir, insecure=True, threads=1,
        epochs=1, batch_size=16, energy_backend="estimate", export_onnx=export_onnx, model=model,
        dataset=f"{P}:blobs",
    )  # fmt: skip


def _rounds(config: NodeConfig, rounds: int) -> Node:
    """``rounds`` rounds of a node with no peer, in this process."""
    node = Node(config)
    try:
        node.startup()
        for t in range(rounds):
            node.run_round(t)
    finally:
        node.shutdown()
    return node


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A node of a ``package.module:function`` model after one round (in this process, no peer)."""
    path = tmp_path_factory.mktemp("node") / "state"
    assert _rounds(_node_config(path, f"{P}:tiny_mlp"), 1).rounds_done == 1
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-client simulation of the same model, one round."""
    out = tmp_path_factory.mktemp("sim") / "run"
    config = SimConfig(model=f"{P}:tiny_mlp", dataset=f"{P}:blobs", clients=3, neighbours=1, rounds=1, epochs=1,
                       batch_size=8, output=out, progress=False, energy_backend="estimate")  # fmt: skip
    return run_simulation(config)


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("edge-node: error: "), err
    return err[0]


def test_export_needs_only_the_state_dir_for_a_factory_model(state_dir, tmp_path, monkeypatch, capsys):
    """The saved model name is a factory path; the checkpoint's arch id holds only its mangled form."""
    monkeypatch.chdir(tmp_path)
    assert run_cli(["export", "--state-dir", str(state_dir)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("wrote n0.onnx") and out[0].endswith("n0's model after round 1"), out
    assert "top-1 agreement 100.00%" in out[1], out
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "n0.onnx"), providers=["CPUExecutionProvider"])
    features = torch.randn(5, 12)
    logits = session.run(None, {"images": features.numpy()})[0]
    expected = load_trained(state_dir)(features).detach().numpy()
    assert abs(logits - expected).max() < 1e-4


def test_load_trained_gives_the_nodes_masked_weights_on_the_cpu_in_eval_mode(state_dir):
    saved = torch.load(state_dir / "checkpoint.pt", weights_only=True)
    model = load_trained(state_dir)
    assert isinstance(model, nn.Module) and not model.training
    for name, param in model.named_parameters():
        mask = saved["train_mask"][name]
        assert param.device.type == "cpu"
        assert torch.equal(param.detach()[mask], saved["values"][name]), name
        assert not param.detach()[~mask].any(), name  # zero where masked
    assert 0 < sum(int(m.sum()) for m in saved["train_mask"].values()) < sum(p.numel() for p in model.parameters())


def test_export_and_load_trained_of_a_simulations_client(run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["export", "--run", str(run_dir), "--client", "2"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("wrote client-2.onnx") and "client 2's model after round 1" in out[0], out
    assert (tmp_path / "client-2.onnx").stat().st_size > 0
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    models = [load_trained(run_dir, client=k) for k in range(3)]
    for k, model in enumerate(models):
        for name, param in model.named_parameters():
            assert torch.equal(param.detach()[saved["train_masks"][k][name]], saved["values"][k][name]), (k, name)
    assert not torch.equal(models[0].fc1.weight, models[1].fc1.weight)  # each client its own model


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--state-dir", "{tmp}/absent"], "no state dir"),
        (["--state-dir", "{tmp}/empty"], "no checkpoint in"),
        (["--run", "{run}", "--client", "3"], "client 3 is not in"),
        (["--run", "{run}"], "--run needs --client"),
        (["--run", "{tmp}/empty", "--client", "0"], "no checkpoint in"),
        (["--run", "{tmp}/absent", "--client", "0"], "no run dir"),
        (["--run", "{run}", "--client", "0", "--fleet", "x"], "--fleet is a node's flag"),
        (["--state-dir", "{state}", "--client", "0"], "--client goes with --run"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(state_dir, run_dir, tmp_path, monkeypatch, capsys, args,
                                                         expected):  # fmt: skip
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    filled = [a.format(tmp=tmp_path, run=run_dir, state=state_dir) for a in args]
    assert run_cli(["export", *filled, "--onnx", str(tmp_path / "out.onnx")]) == 2
    assert expected in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_load_trained_says_which_directory_needs_a_client(state_dir, run_dir, tmp_path):
    with pytest.raises(CheckpointError, match="run dir: name the client"):
        load_trained(run_dir)
    with pytest.raises(CheckpointError, match="holds one model: give no client"):
        load_trained(state_dir, client=0)
    with pytest.raises(CheckpointError, match="its clients are 0..2"):
        load_trained(run_dir, client=-1)
    with pytest.raises(CheckpointError, match="no directory"):
        load_trained(tmp_path / "absent")


def test_buffers_of_a_checkpoint_are_loaded_where_it_has_them():
    """BatchNorm statistics (``load_state_dict`` semantics): the checkpoint's replace the built ones."""
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    weights = {name: torch.full_like(p, 0.5) for name, p in model.named_parameters()}
    loaded = with_weights(model, weights, {"1.running_mean": torch.tensor([1.0, 2.0, 3.0])})
    assert torch.equal(loaded[1].running_mean, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(loaded[1].running_var, torch.ones(3))  # not in the checkpoint: the built value
    assert not loaded.training and torch.equal(loaded[0].weight, torch.full((3, 4), 0.5))
    with pytest.raises(ModelError, match="buffer 'nope' of the checkpoint is not one of the model's"):
        with_weights(model, weights, {"nope": torch.zeros(1)})


@pytest.mark.parametrize(
    ("model", "reason"),
    [(f"{X}:fft_mlp", "'aten::fft_rfft'"), (f"{X}:batchnorm_without_stats", "Expected more than 1 value per channel")],
)
def test_start_refuses_a_model_that_cannot_be_exported_before_its_state_dir_exists(tmp_path, capsys, model, reason):
    state = tmp_path / "state"
    args = ["start", "--model", model, "--dataset", f"{P}:blobs", "--state-dir", str(state), "--rounds", "1",
            "--listen", "127.0.0.1:0", "--discovery", "static", "--peers", "127.0.0.1:9", "--insecure",
            "--capacity", "0.6", "--fleet", "lab", "--node-id", "n0", "--client-index", "0"]  # fmt: skip
    assert run_cli(args) == 2
    line = _one_error_line(capsys)
    assert f"model {model} cannot be exported to ONNX (" in line and reason in line, line
    assert line.endswith("set export_onnx = false to run without the export"), line
    assert not state.exists()


def test_the_onnx_check_passes_the_built_in_and_plugin_models():
    from edge_node.models import build_model

    assert onnx_problem(build_model("cnn"), (3, 32, 32)) is None
    assert onnx_problem(build_model(f"{P}:tiny_mlp", 3, input_shape=(12,)), (12,)) is None


def test_a_daemon_whose_export_fails_warns_counts_and_goes_on(tmp_path, monkeypatch, caplog):
    """The up-front check bypassed, a model the exporter cannot take: each round trains, checkpoints, and
    logs one warning; ``edge_node_export_failures_total`` counts them; no model.onnx appears."""
    monkeypatch.setattr("edge_node.node.local_model.onnx_problem", lambda model, shape: None)
    config = _node_config(tmp_path / "state", f"{X}:fft_mlp")
    caplog.set_level(logging.WARNING, logger="edge_node.node.handover")
    node = _rounds(config, 2)
    assert node.rounds_done == 2
    warnings = [r.getMessage() for r in caplog.records if r.name == "edge_node.node.handover"]
    assert len(warnings) == 2 and "cannot be exported to ONNX" in warnings[0] and "\n" not in warnings[0], warnings
    assert node.metrics.registry.get_sample_value("edge_node_export_failures_total") == 2.0
    assert not (config.state_dir / ONNX_FILE).exists()
    assert not list(config.state_dir.glob("*.tmp"))
    assert not list((config.state_dir / "handover").iterdir())  # no pair, no pointer, no half-written folder


def test_without_export_onnx_a_model_that_cannot_be_exported_trains_with_one_warning(tmp_path, caplog):
    config = _node_config(tmp_path / "state", f"{X}:fft_mlp", export_onnx=False)
    caplog.set_level(logging.WARNING)
    node = _rounds(config, 1)
    assert node.rounds_done == 1
    warnings = [r.getMessage() for r in caplog.records if "ONNX" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "'aten::fft_rfft'" in warnings[0] and "export_onnx = false, so this node runs without" in warnings[0]
    assert not (config.state_dir / ONNX_FILE).exists()
    assert not (config.state_dir / "handover").exists()  # export_onnx = false: nothing written
