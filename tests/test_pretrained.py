"""A pretrained start (--init-weights) and frozen layers (--trainable): edge_node.pretrained, algorithm.frozen."""

from __future__ import annotations

import json
import logging
import pickle
import warnings

import pytest
import torch
from safetensors.torch import save_file

from edge_node.algorithm.dispfl import DisPFLParams, published, start
from edge_node.algorithm.masks import active_counts, erk_densities, init_masks
from edge_node.cli import main
from edge_node.data import load_dataset
from edge_node.errors import ConfigError
from edge_node.exit_codes import ExitCode
from edge_node.models import build_checked_model
from edge_node.pretrained import prepare_start, read_start_file, wire_spec
from edge_node.records import per_node
from edge_node.sim.checkpoint import load_checkpoint
from edge_node.sim.config import SimConfig
from edge_node.sim.runner import run_simulation
from edge_node.wire import ModelSpec, encode_model

MLP = "tests.plugin_factories:tiny_mlp"
WIDE = "tests.plugin_factories:wide_mlp"
BLOBS = "tests.plugin_factories:blobs"
SHAPE = (12,)


def _mlp(name: str = MLP, seed: int = 0) -> torch.nn.Module:
    return build_checked_model(name, 3, SHAPE, seed)


def _pretrained(seed: int = 42) -> dict[str, torch.Tensor]:
    """Another seed's weights without the head: a start whose head the fleet seed gives."""
    return {n: p.detach().clone() for n, p in _mlp(seed=seed).named_parameters() if not n.startswith("head.")}


@pytest.fixture
def start_file(tmp_path):
    path = tmp_path / "start.safetensors"
    save_file(_pretrained(), str(path))
    return path


def test_start_file_is_loaded_and_a_missing_head_comes_from_the_seed_and_is_logged(start_file, caplog):
    model, seeded = _mlp(), dict(_mlp().named_parameters())
    with caplog.at_level(logging.WARNING, logger="edge_node.pretrained"):
        started = prepare_start(model, start_file, (), model_name=MLP)
    for name, value in _pretrained().items():
        assert torch.equal(dict(model.named_parameters())[name], value)
    assert torch.equal(model.head.weight, seeded["head.weight"]) and torch.equal(model.head.bias, seeded["head.bias"])
    assert started.initialised == ("head.weight", "head.bias")
    assert "head.weight, head.bias" in caplog.text and "initialised from the fleet seed" in caplog.text


def test_a_weights_only_state_dict_gives_the_same_start_as_safetensors(start_file, tmp_path):
    pt = tmp_path / "start.pt"
    torch.save(_pretrained(), pt)
    a = prepare_start(_mlp(), start_file, (), model_name=MLP)
    b = prepare_start(_mlp(), pt, (), model_name=MLP)
    assert a.digest == b.digest and a.variant == b.variant


def test_a_pickle_is_refused_in_one_line(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(_mlp(), path)  # a whole module: weights_only refuses to unpickle its class
    with pytest.raises(ConfigError, match="not a safetensors file or a weights-only state_dict") as err:
        read_start_file(path)
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"fc1.weight": [1.0, 2.0]}, protocol=4))
    with warnings.catch_warnings(record=True) as shown:  # torch's pickle-protocol warning was a second line
        warnings.simplefilter("always")
        with pytest.raises(ConfigError, match="not a safetensors file or a weights-only state_dict"):
            read_start_file(plain)
    assert not shown, [str(w.message) for w in shown]
    assert "\n" not in str(err.value)


def test_a_parameter_of_another_shape_and_another_architecture_are_refused(tmp_path):
    wide = tmp_path / "wide.safetensors"
    save_file({n: p.detach().clone() for n, p in _mlp(WIDE).named_parameters()}, str(wide))
    with pytest.raises(ConfigError, match=r"parameter 'fc1.weight' is 24x12 there, 16x12 in model"):
        prepare_start(_mlp(), wide, (), model_name=MLP)
    other = tmp_path / "other.safetensors"
    save_file({"features.0.weight": torch.zeros(3)}, str(other))
    with pytest.raises(ConfigError, match="is not a start for model .* the model does not have"):
        prepare_start(_mlp(), other, (), model_name=MLP)


def test_a_glob_that_matches_nothing_is_refused():
    with pytest.raises(ConfigError, match="trainable glob 'layer4.\\*' matches no parameter"):
        prepare_start(_mlp(), None, ("head.*", "layer4.*"), model_name=MLP)


def test_frozen_parameters_do_not_require_grad_and_do_not_travel():
    model = _mlp()
    started = prepare_start(model, None, ("head.*",), model_name=MLP)
    assert started.frozen == ("fc1.weight", "fc1.bias", "norm.weight", "norm.bias")
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]
    spec = wire_spec("mlp", 3, model, started)
    assert spec.names == ("head.weight", "head.bias")


def test_the_arch_id_is_unchanged_without_a_start_and_differs_with_another_start_or_trainable_set(tmp_path):
    model = _mlp()
    plain = ModelSpec.from_tensors("mlp", 3, dict(model.named_parameters()))
    assert wire_spec("mlp", 3, model, prepare_start(model, None, (), model_name=MLP)).arch_id == plain.arch_id
    ids = set()
    for seed in (1, 2):
        path = tmp_path / f"s{seed}.safetensors"
        save_file(_pretrained(seed), str(path))
        for trainable in ((), ("head.*",), ("norm.*", "head.*")):
            m = _mlp()
            spec = wire_spec("mlp", 3, m, prepare_start(m, path, trainable, model_name=MLP))
            assert spec.arch_id.startswith("mlp/3/") and len(spec.arch_id.split("/")[2]) == 8
            ids.add(spec.arch_id)
    assert len(ids) == 6 and plain.arch_id not in ids


def test_magnitude_masks_keep_the_largest_weights_at_erk_densities():
    weights = {n: p.detach().clone() for n, p in _mlp(seed=3).named_parameters()}
    masks = init_masks(weights, 0.3, torch.Generator().manual_seed(0), "magnitude")
    shapes = {n: tuple(w.shape) for n, w in weights.items()}
    counts = active_counts(shapes, erk_densities(shapes, 0.3))
    for name, w in weights.items():
        assert int(masks[name].sum()) == counts[name]
        if counts[name] < w.numel():
            assert w[masks[name]].abs().min() >= w[~masks[name]].abs().max(), name
    again = init_masks(weights, 0.3, torch.Generator().manual_seed(99), "magnitude")  # draws nothing
    assert all(torch.equal(masks[n], again[n]) for n in masks)


def test_a_frozen_start_has_all_true_masks_outside_the_density_and_publishes_the_rest():
    model = _mlp()
    prepare_start(model, None, ("head.*",), model_name=MLP)
    params = DisPFLParams().fitted(model)
    assert params.frozen == {"fc1.weight", "fc1.bias", "norm.weight", "norm.bias"}
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = start(weights, 0.5, seed=0, client=0, frozen=params.frozen)
    assert all(bool(state.train_mask[n].all()) for n in params.frozen)
    assert abs(int(state.train_mask["head.weight"].sum()) / model.head.weight.numel() - 0.5) < 0.2
    sent_w, sent_m = published(state, params.frozen)
    assert list(sent_w) == list(sent_m) == ["head.weight", "head.bias"]


def _sim(tmp_path, name, **more):
    config = SimConfig(
        dataset=BLOBS, model=MLP, clients=3, neighbours=2, rounds=2, epochs=1, batch_size=16, progress=False,
        energy_backend="estimate", seed=5, density=0.5, output=tmp_path / name, **more,
    )  # fmt: skip
    out = run_simulation(config, load_dataset(BLOBS))
    records = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    return load_checkpoint(out / "checkpoint.pt", torch.device("cpu")), records


def test_a_simulated_round_leaves_frozen_parameters_as_started_and_sends_fewer_bytes(start_file, tmp_path):
    frozen, frozen_records = _sim(tmp_path, "frozen", init_weights=start_file, trainable=("head.*",))
    whole, whole_records = _sim(tmp_path, "whole", init_weights=start_file)
    pretrained = _pretrained()
    for client in frozen["weights"]:
        for name, value in pretrained.items():
            assert torch.equal(client[name], value), name  # dense, untouched by two rounds
        assert not torch.equal(client["head.weight"] * 0, client["head.weight"])  # the head trained
    for client in whole["weights"]:
        assert not torch.equal(client["fc1.weight"], pretrained["fc1.weight"])
    for a, b in zip(frozen_records, whole_records, strict=True):
        assert sum(per_node(a, "bytes_in")) < sum(per_node(b, "bytes_in")) / 2


def test_the_encoded_model_holds_only_the_trainable_tensors():
    model = _mlp()
    started = prepare_start(model, None, ("head.*",), model_name=MLP)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = DisPFLParams().fitted(model)
    state = start(weights, 1.0, seed=0, client=0, frozen=params.frozen)
    spec = wire_spec("mlp", 3, model, started)
    messages = encode_model(spec, *published(state, params.frozen), node_id="n", fleet_id="f", round=0, density=1.0)
    names = {t.name for m in messages[1:] for t in m.tensors}
    assert names == {"head.weight", "head.bias"}
    full = wire_spec("mlp", 3, _mlp())
    whole = encode_model(full, weights, {}, node_id="n", fleet_id="f", round=0, density=1.0)
    assert sum(m.ByteSize() for m in messages) < sum(m.ByteSize() for m in whole) / 4


@pytest.mark.parametrize("bad", ["glob", "pickle"])
def test_simulate_refuses_bad_input_in_one_line_with_exit_2_before_writing(bad, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["simulate", "--dataset", BLOBS, "--model", MLP, "--rounds", "1", "--output", str(out), "--no-progress"]
    if bad == "glob":
        args += ["--trainable", "layer4.*"]
    else:
        path = tmp_path / "evil.pt"
        torch.save(_mlp(), path)
        args += ["--init-weights", str(path)]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == ExitCode.BAD_INPUT
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and ("matches no parameter" in lines[0] or "weights-only state_dict" in lines[0]), lines
    assert not out.exists()


def test_a_start_files_batchnorm_statistics_are_every_clients_start(tmp_path):
    from edge_node.algorithm.norm_stats import load_buffers, read_buffers

    bn = "tests.plugin_factories:bn_conv"
    source = build_checked_model(bn, 3, (3, 32, 32), seed=7)
    with torch.no_grad():
        source.train()
        source(torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0)))  # statistics of its own
    saved = {**dict(source.named_parameters()), **dict(source.named_buffers())}
    path = tmp_path / "bn.safetensors"
    save_file({k: v.detach().contiguous() for k, v in saved.items()}, str(path))
    model = build_checked_model(bn, 3, (3, 32, 32), seed=0)
    begun = prepare_start(model, path, (), model_name=bn)
    without = prepare_start(build_checked_model(bn, 3, (3, 32, 32), seed=0), None, (), model_name=bn)
    assert begun.digest and begun.variant != without.variant
    expected = read_buffers(source)
    with torch.no_grad():
        model.train()
        model(torch.randn(4, 3, 32, 32))  # a client's training moves them
    load_buffers(model, {})  # a client that has not trained yet starts from the file's statistics
    assert all(torch.equal(read_buffers(model)[k], v) for k, v in expected.items())
    bad = {**{k: v.detach().contiguous() for k, v in saved.items()}}
    name = next(k for k in bad if k.endswith("running_var"))
    bad[name] = -bad[name]
    save_file(bad, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ConfigError, match="negative variances"):
        prepare_start(build_checked_model(bn, 3, (3, 32, 32)), tmp_path / "bad.safetensors", (), model_name=bn)
