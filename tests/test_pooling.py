"""max_pool2x2 against torch.max_pool2d: the same values, indices and gradients, bit for bit."""

from __future__ import annotations

import pytest
import torch

from edge_node.models import CNN, VGG11
from edge_node.pooling import MaxPool2x2, max_pool2x2


def _pool_and_grad(pool, x: torch.Tensor, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.clone().requires_grad_()
    out = pool(leaf)
    out.backward(grad_out)
    return out.detach(), leaf.grad


def _reference(x: torch.Tensor) -> torch.Tensor:
    return torch.max_pool2d(x, 2)


@pytest.mark.parametrize(
    "shape", [(4, 8, 12, 12), (1, 3, 7, 7), (2, 64, 28, 28), (3, 5, 9, 6)], ids=["even", "odd", "cnn", "mixed"]
)
def test_values_and_gradients_equal_max_pool2d(shape: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator)
    out_shape = (*shape[:2], shape[2] // 2, shape[3] // 2)
    grad_out = torch.randn(out_shape, generator=generator)
    want, want_grad = _pool_and_grad(_reference, x, grad_out)
    got, got_grad = _pool_and_grad(max_pool2x2, x, grad_out)
    assert got.is_contiguous() and got_grad.is_contiguous()
    assert torch.equal(got, want)
    assert torch.equal(got_grad, want_grad)


def test_ties_nan_and_inf_route_the_gradient_as_max_pool2d_does() -> None:
    """Windows of equal values (ReLU's zeros, whole numbers), NaN and infinities: the gradient goes to the
    same position of each window as the NCHW kernel sends it."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(-2, 3, (6, 16, 10, 10), generator=generator).float()
    x[0, 0, 0, 0] = x[0, 0, 0, 1] = float("nan")
    x[1, 2, 4, 5] = float("nan")
    x[2, 3, 6, 6] = float("inf")
    x[2, 3, 6, 7] = float("inf")
    x[3, 4, 0:2, 0:2] = float("-inf")
    grad_out = torch.randn(6, 16, 5, 5, generator=generator)
    want, want_grad = _pool_and_grad(_reference, x, grad_out)
    got, got_grad = _pool_and_grad(max_pool2x2, x, grad_out)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert torch.equal(got_grad, want_grad)


def test_the_channels_last_path_is_taken_on_a_cpu() -> None:
    """The speed is the point: a float map that needs a gradient goes through the channels-last function,
    one that does not through the channels-last kernel; other inputs through torch.max_pool2d."""
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    assert type(max_pool2x2(x).grad_fn).__name__ == "_ChannelsLastMaxPoolBackward"
    with torch.no_grad():
        assert torch.equal(max_pool2x2(x), torch.max_pool2d(x, 2))
    doubles = torch.randn(2, 4, 8, 8, dtype=torch.float64, requires_grad=True)
    assert "MaxPool2DWithIndices" in type(max_pool2x2(doubles).grad_fn).__name__
    strided = torch.randn(2, 4, 8, 16)[..., ::2]
    assert torch.equal(max_pool2x2(strided), torch.max_pool2d(strided, 2))


def test_relu_after_the_pool_equals_relu_before_it() -> None:
    """The models pool before their ReLU: values and gradients as the paper's order (ReLU, then pool) gives
    them, on ties, zeros, NaN and infinities."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randint(-2, 3, (6, 16, 10, 10), generator=generator).float()
    x[0, 0, 0, 0] = float("nan")
    x[0, 0, 0, 1] = 2.0
    x[1, 2, 4, 5] = float("nan")
    x[2, 3, 6, 6] = float("inf")
    x[3, 4, 0:2, 0:2] = float("-inf")
    grad_out = torch.randn(6, 16, 5, 5, generator=generator)
    want, want_grad = _pool_and_grad(lambda t: torch.max_pool2d(torch.relu(t), 2), x, grad_out)
    got, got_grad = _pool_and_grad(lambda t: torch.relu(max_pool2x2(t)), x, grad_out)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert torch.equal(got_grad, want_grad)


def _paper_order_cnn(model: CNN, x: torch.Tensor) -> torch.Tensor:
    x = torch.max_pool2d(torch.relu(model.conv1(x)), 2)
    x = torch.max_pool2d(torch.relu(model.conv2(x)), 2)
    x = torch.relu(model.fc1(torch.flatten(x, 1)))
    return model.fc3(torch.relu(model.fc2(x)))


def _paper_order_vgg11(model: VGG11, x: torch.Tensor) -> torch.Tensor:
    layers = list(model.features)
    for i, layer in enumerate(layers):
        if isinstance(layer, MaxPool2x2):  # pool, ReLU -> ReLU, torch's pool
            assert isinstance(layers[i + 1], torch.nn.ReLU)
            layers[i], layers[i + 1] = torch.nn.ReLU(), torch.nn.MaxPool2d(2)
    for layer in layers:
        x = layer(x)
    return model.classifier(torch.flatten(x, 1))


@pytest.mark.parametrize(
    ("factory", "paper_order"), [(CNN, _paper_order_cnn), (VGG11, _paper_order_vgg11)], ids=["cnn", "vgg11"]
)
def test_models_train_as_in_the_papers_layer_order(factory, paper_order) -> None:
    """A model's loss and every parameter's gradient are the same bits as ReLU then torch.max_pool2d give."""
    torch.manual_seed(0)
    model = factory(10)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(8, 3, 32, 32, generator=generator)
    y = torch.randint(0, 10, (8,), generator=generator)
    params = list(model.parameters())

    def loss_and_grads(forward) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        loss = torch.nn.functional.cross_entropy(forward(x), y)
        return loss, torch.autograd.grad(loss, params)

    loss, grads = loss_and_grads(model)
    want_loss, want_grads = loss_and_grads(lambda x: paper_order(model, x))
    assert torch.equal(loss, want_loss)
    assert all(torch.equal(g, w) for g, w in zip(grads, want_grads, strict=True))
