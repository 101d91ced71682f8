import json

import pytest
import torch
from torch import nn

from edge_node.algorithm import (
    active_counts,
    dense_nnz,
    erk_densities,
    forward_flops,
    round_training_flops,
    weight_positions,
)
from edge_node.energy.modelled import modelled_energy
from edge_node.models import build_model
from edge_node.sim.report import format_summary, summarize
from edge_node.sim.table import build_table, read_run


def test_resnet18_training_flops_check_values():
    model = build_model("resnet18")
    positions = weight_positions(model, (3, 32, 32))
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    erk = active_counts(shapes, erk_densities(shapes, 0.5))
    assert 3 * forward_flops(positions, dense_nnz(model)) == pytest.approx(3.3325e9, rel=1e-4)
    assert 3 * forward_flops(positions, erk) == pytest.approx(2.6533e9, rel=1e-4)


def test_cnn_forward_flops_by_hand_and_round_formula():
    model = build_model("cnn")
    positions = weight_positions(model, (3, 32, 32))
    assert positions == {
        "conv1.weight": 28 * 28,
        "conv2.weight": 10 * 10,
        "fc1.weight": 1,
        "fc2.weight": 1,
        "fc3.weight": 1,
    }
    by_hand = 2 * (64 * 3 * 25 * 784 + 64 * 64 * 25 * 100 + 1600 * 384 + 384 * 192 + 192 * 10)
    dense = dense_nnz(model)
    f = forward_flops(positions, dense)
    assert f == by_hand
    got = round_training_flops(positions, dense, dense, epochs=5, samples=500, regrow_batch=128)
    assert got == 5 * 500 * 3 * f + 128 * 3 * f


# ----- torch's FlopCounterMode: other layer types, sparse scaling, unknown figures


class _Conv1dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 16, 5)  # length 32 -> 28
        self.head = nn.Linear(16 * 28, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


class _RecurrentNet(nn.Module):
    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.rnn = cell(8, 12, batch_first=True)
        self.head = nn.Linear(12, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


class _AttentionNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(1, -1, 3, 2, 8).permute(2, 0, 3, 1, 4)  # 2 heads of 8
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_conv1d_flops_by_hand():
    model = _Conv1dNet()
    positions = weight_positions(model, (3, 32))
    assert positions == {"conv.weight": 28, "head.weight": 1}
    # 2*Cin*Cout*k*Lout + the head; biases and the ReLU are not counted. (The hooks counted only the head: 8960.)
    assert forward_flops(positions, dense_nnz(model)) == 2 * 3 * 16 * 5 * 28 + 2 * 448 * 10 == 22_400


@pytest.mark.parametrize(("cell", "gates"), [(nn.GRU, 3), (nn.LSTM, 4), (nn.RNN, 1)])
def test_recurrent_flops_by_hand(cell, gates):
    model = _RecurrentNet(cell)
    positions = weight_positions(model, (20, 8))  # 20 time steps of 8 features
    assert positions == {"rnn.weight_ih_l0": 20, "rnn.weight_hh_l0": 20, "head.weight": 1}
    # Per step the gates' input and hidden matmuls, 2*gates*H*(I+H); gate elementwise ops and biases not counted.
    assert forward_flops(positions, dense_nnz(model)) == 20 * 2 * gates * 12 * (8 + 12) + 2 * 12 * 10


def test_sparse_figure_scales_each_weight_and_keeps_parameter_free_products_dense():
    model = _AttentionNet()
    positions = weight_positions(model, (6, 16))
    assert positions == {"qkv.weight": 6}
    assert positions.unattributed == 2 * (2 * 6 * 6 * 8) * 2  # q@k^T and attn@v, 2 heads: dense
    half = {name: n // 2 for name, n in dense_nnz(model).items()}
    assert forward_flops(positions, half) == 2 * 384 * 6 + positions.unattributed

    gru = _RecurrentNet(nn.GRU)
    shapes = {n: tuple(p.shape) for n, p in gru.named_parameters()}
    sparse = active_counts(shapes, erk_densities(shapes, 0.5))
    gru_positions = weight_positions(gru, (20, 8))
    assert gru_positions is not None
    assert forward_flops(gru_positions, sparse) == sum(2 * sparse[w] * p for w, p in gru_positions.items())
    assert forward_flops(gru_positions, sparse) < forward_flops(gru_positions, dense_nnz(gru))


@pytest.mark.parametrize(
    ("name", "classes", "shape", "expected"),
    [  # F(dense) as the Conv2d/Linear forward hooks counted them before FlopCounterMode
        ("cnn", 10, (3, 32, 32), 29_386_496),
        ("cnn", 100, (3, 32, 32), 29_421_056),
        ("resnet18", 10, (3, 32, 32), 1_110_845_440),
        ("resnet18", 100, (3, 32, 32), 1_110_937_600),
        ("resnet18", 100, (3, 64, 64), 4_443_443_200),
        ("resnet18", 200, (3, 64, 64), 4_443_545_600),
        ("vgg11", 10, (3, 32, 32), 305_539_072),
        ("vgg11", 100, (3, 32, 32), 305_631_232),
    ],
)
def test_builtin_models_figures_unchanged(name, classes, shape, expected):
    model = build_model(name, classes)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    positions = weight_positions(model, shape)
    assert positions is not None and positions.unattributed == 0
    assert set(positions) == {n for n, p in model.named_parameters() if p.dim() in (2, 4)}
    assert forward_flops(positions, dense_nnz(model)) == expected
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # counted on a copy


def test_unknown_when_the_forward_cannot_be_counted():
    assert weight_positions(nn.Linear(5, 10), (4,)) is None  # the forward fails on this input shape
    assert forward_flops(None, {}) is None
    assert round_training_flops(None, {}, {}, epochs=1, samples=10, regrow_batch=4) is None


@torch.library.custom_op("edge_node_test::fused_linear", mutates_args=())
def _fused_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.t()


def test_unknown_when_an_op_without_a_flop_formula_does_matrix_work():
    class Fused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(10, 5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _fused_linear(x, self.weight)

    assert Fused()(torch.ones(1, 5)).shape == (1, 10)
    assert weight_positions(Fused(), (5,)) is None


def test_unknown_flops_flow_into_records_reports_and_modelled_energy(tmp_path):
    unknown, known = modelled_energy(None, 100, 50), modelled_energy(1e9, 100, 50)
    assert unknown.compute_j is None and unknown.total_j is None and unknown.communication_j == known.communication_j
    assert (unknown + known).total_j is None and (known + known).total_j == 2 * known.total_j
    assert unknown.to_dict()["flops"] is None

    record = {
        "round": 0, "acc_mean": 0.5, "acc_before_mean": 0.5, "acc_after_mean": 0.5, "bytes_in_mean": 1e6,
        "busiest_node_bytes": 2e6, "paper_comm_mb_busiest": 1.0, "paper_comm_mb_mean": 1.0, "density_mean": 0.5,
        "flops_per_client_mean": None, "modelled_energy": {"total_j": None}, "wall_s": 1.0,
    }  # fmt: skip
    summary = summarize([record])
    assert summary["flops_per_client_round"] is None and summary["modelled_energy_j"] is None
    text = format_summary(summary)
    assert "FLOPs per client per round" in text and "unknown (modelled, not measured)" in text

    run = tmp_path / "run"
    run.mkdir()
    config = {"method": "dispfl", "partition": "dir:0.3", "dataset": "cifar10", "model": "user", "clients": 2}
    (run / "config.json").write_text(json.dumps(config))
    (run / "rounds.jsonl").write_text(json.dumps(record) + "\n")
    loaded = read_run(run)
    assert loaded.flops() is None
    assert "unknown" in build_table([loaded]).rows[0]
