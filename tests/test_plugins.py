"""Users' own models: found by path or entry point, held to the contract once, refused in one line (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edge_node.cli import main
from edge_node.errors import ModelError
from edge_node.models import arch_name, build_checked_model, build_model, check_model_name, model_factory
from edge_node.wire import ModelSpec

P = "tests.plugin_factories"
SHAPE = (12,)


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(args)
    return int(exc.value.code or 0)


def test_a_factory_path_builds_a_checked_model_with_the_fleets_seeded_weights():
    a = build_checked_model(f"{P}:tiny_mlp", 3, SHAPE, seed=5)
    b = build_checked_model(f"{P}:tiny_mlp", 3, SHAPE, seed=5)
    c = build_checked_model(f"{P}:tiny_mlp", 3, SHAPE, seed=6)
    assert a(torch.zeros(4, *SHAPE)).shape == (4, 3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.fc1.weight, c.fc1.weight)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"{P}:buffer_mlp", "layer '(root)' (RegisteredBuffer) keeps buffer 'scale': only BatchNorm's running"),
        (f"{P}:double_mlp", "parameter 'fc1.weight' is torch.float64"),
        (f"{P}:raises", "raised RuntimeError: the factory's own bug"),
        (f"{P}:not_a_module", "factory returned a dict, not a torch.nn.Module"),
        (f"{P}:wrong_output", "gives outputs of shape (2, 4) for a batch of 2 inputs of shape (12,); (2, 3)"),
        (f"{P}:unseeded", "two builds with seed 0 differ"),
        (f"{P}:NOT_CALLABLE", "is a int, not a function"),
        (f"{P}:missing", "has no attribute 'missing'"),
        ("no_such_package.models:net", "no module 'no_such_package'"),
        ("tests.plugin_factories", "unknown model 'tests.plugin_factories'"),
        ("a b:c", "must be package.module:function"),
    ],
)
def test_a_model_that_breaks_the_contract_is_one_line_naming_it(name, expected):
    with pytest.raises(ModelError) as exc:
        build_checked_model(name, 3, SHAPE)
    message = str(exc.value)
    assert expected in message and "\n" not in message, message


def test_a_batchnorm_model_is_accepted_with_its_new_statistics():
    model = build_checked_model(f"{P}:batchnorm_mlp", 3, SHAPE)  # the check's forward did not move them
    assert model.training
    assert torch.equal(model[2].running_mean, torch.zeros(16)) and int(model[2].num_batches_tracked) == 0


def test_the_built_in_models_keep_their_names_and_architecture_ids():
    """A built-in's arch id is unchanged (name/classes/hash of names and shapes): old peers still match."""
    for name in ("cnn", "resnet18", "vgg11"):
        assert arch_name(name) == name
        check_model_name(name)
    cnn = build_model("cnn", 10)
    spec = ModelSpec.from_tensors(arch_name("cnn"), 10, dict(cnn.named_parameters()))
    assert spec.arch_id == "cnn/10/" + spec.arch_id.rsplit("/", 1)[1]
    assert ModelSpec.from_tensors("cnn", 10, dict(cnn.named_parameters())).arch_id == spec.arch_id


def test_a_plugins_architecture_id_is_short_and_hashes_its_shapes():
    tiny = build_checked_model(f"{P}:tiny_mlp", 3, SHAPE)
    wide = build_checked_model(f"{P}:wide_mlp", 3, SHAPE)
    name = arch_name(f"{P}:tiny_mlp")
    assert name == "tests.plugin_factories.tiny_mlp"
    a = ModelSpec.from_tensors(name, 3, dict(tiny.named_parameters()))
    b = ModelSpec.from_tensors(name, 3, dict(wide.named_parameters()))  # same name, other shapes
    assert a.arch_id != b.arch_id and len(a.arch_id) <= 64 + 1 + 9 + 1 + 8
    long_path = "a" * 80 + ".b:" + "c" * 80
    assert len(arch_name(long_path)) == 64


def test_an_entry_point_names_a_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An installed package's ``edge_node.models`` entry point (a dist-info on sys.path) is found by name."""
    dist = tmp_path / "demo_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[edge_node.models]\ntiny = {P}:tiny_mlp\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_model_name("tiny")
    assert build_checked_model("tiny", 3, SHAPE)(torch.zeros(1, *SHAPE)).shape == (1, 3)
    assert arch_name("tiny") == "tiny"
    with pytest.raises(ModelError, match=r"unknown model 'tinyy'; choose one of cnn, resnet18, vgg11, tiny"):
        model_factory("tinyy")


SIM = ["simulate", "--clients", "2", "--neighbours", "1", "--rounds", "1", "--epochs", "1", "--batch-size", "8",
       "--no-progress", "--energy-backend", "estimate", "--dataset", f"{P}:blobs"]  # fmt: skip


@pytest.mark.parametrize("model", [f"{P}:buffer_mlp", "no_such_package.models:net", f"{P}:missing"])
def test_simulate_refuses_a_bad_model_in_one_line_and_writes_nothing(tmp_path: Path, capsys, model):
    out = tmp_path / "run"
    assert run_cli([*SIM, "--model", model, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("edge-node: error: "), err
    assert not out.exists()


BAD_MODELS = [(f"{P}:buffer_mlp", "(RegisteredBuffer) keeps buffer"), ("no_such_package.models:net", "no module")]


@pytest.mark.parametrize(("model", "expected"), BAD_MODELS)
def test_start_refuses_a_bad_model_before_its_state_dir_exists(tmp_path: Path, capsys, model, expected):
    state = tmp_path / "state"
    args = ["start", "--model", model, "--dataset", f"{P}:blobs", "--state-dir", str(state), "--rounds", "1",
            "--listen", "127.0.0.1:0", "--discovery", "static", "--peers", "127.0.0.1:9", "--insecure",
            "--capacity", "0.6", "--fleet", "lab", "--node-id", "n0", "--client-index", "0"]  # fmt: skip
    assert run_cli(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not state.exists()


@pytest.mark.parametrize(("model", "expected"), BAD_MODELS)
def test_loopback_refuses_a_bad_model_before_the_fleet_directory_exists(tmp_path: Path, capsys, model, expected):
    out = tmp_path / "fleet"
    args = ["loopback", "--nodes", "3", "--rounds", "1", "--model", model, "--dataset", f"{P}:blobs",
            "--output", str(out), "--no-progress"]  # fmt: skip
    assert run_cli(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not out.exists()


def test_a_plugin_model_exports_to_onnx_with_its_own_input_shape(tmp_path: Path):
    """The daemon's model.onnx and `edge-node export` for a model on feature rows: input (batch, 12)."""
    from edge_node.data import load_dataset
    from edge_node.data.batches import ClientData, ImagePool
    from edge_node.node.export import check_onnx, write_onnx

    data = load_dataset(f"{P}:blobs")
    model = build_checked_model(f"{P}:tiny_mlp", data.num_classes, data.input_shape)
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    weights["fc1.weight"][:, ::2] = 0.0  # masked positions travel as zeros
    path = tmp_path / "model.onnx"
    assert write_onnx(path, model, weights, data.input_shape) > 0
    client = ClientData.from_indices(ImagePool.from_dataset(data), [0], list(range(60)))
    check = check_onnx(path, model, weights, client.eval_batches(16))
    assert check.samples == 60 and check.max_abs_diff < 1e-4 and check.argmax_agreement == 1.0
