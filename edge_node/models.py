"""The model registry: CIFAR-sized ``cnn``, ``resnet18`` and ``vgg11``, all with GroupNorm, and users' own models.

``resnet18`` on Tiny-ImageNet (64x64) is the DisPFL paper's ``tiny_resnet18``: the same network (3x3
stride-1 stem, no max-pool) whose final average pool is global (adaptive to 1x1), so a 64x64 input ends in
an 8x8 map instead of 4x4; its parameters are the CIFAR count with a 200-class head (11,271,432) and every
convolution costs 4x the FLOPs. ``cnn`` takes 32x32 images only (its fc1 is sized for a 5x5 map).

The built-in models use GroupNorm (DisPFL's reference models). A user's model may use BatchNorm: its affine
weights are parameters like any other, its running statistics stay on each client (FedBN,
edge_node.algorithm.norm_stats); any other buffer is refused. Parameter counts for 10 classes are
pinned by docs/ALGORITHM.md and by tests: cnn 797,962; resnet18 11,173,962; vgg11 9,231,114.

A user's model is a factory ``factory(num_classes, input_shape) -> nn.Module``, named as
``package.module:function`` or registered by an installed package under the entry-point group
``edge_node.models``. :func:`build_checked_model` holds it to the contract the rest relies on
(docs/PLUGINS.md): no buffers but BatchNorm's running statistics, float32 parameters, the same weights for
the same seed, and
``(B, *input_shape)`` in, ``(B, num_classes)`` logits out.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from edge_node.algorithm.norm_stats import other_buffer
from edge_node.algorithm.width import WidthChoice, choose_width, prefix_problem
from edge_node.errors import ModelError
from edge_node.plugins import entry_point_names, is_factory_path, load_entry_point, load_factory, one_line
from edge_node.pooling import MaxPool2x2, max_pool2x2
from edge_node.protocol import TIER_DENSITIES, tier_name

GN_GROUPS = 32  # GroupNorm(32, C), as in DisPFL's reference models


def width_channels(channels: int, width: float, groups: int | None = None) -> int:
    """A hidden layer's channels at ``width`` (HeteroFL's nested sub-networks): ``ceil(width * channels)``, rounded
    up to whole GroupNorm groups where the layer has ``groups`` of them (the channels per group stay fixed, so
    the narrow layer's groups are the full layer's first groups). At least one channel (one group)."""
    kept = max(1, math.ceil(width * channels - 1e-9))
    if groups is None:
        return min(channels, kept)
    per_group = channels // groups
    return min(channels, math.ceil(kept / per_group) * per_group)


def _norm(channels: int, full_channels: int) -> nn.GroupNorm:
    """GroupNorm over ``channels`` of a layer that has ``full_channels`` at full width: GN_GROUPS groups at full
    width, the same channels per group at any width."""
    return nn.GroupNorm(channels // (full_channels // GN_GROUPS), channels)


class CNN(nn.Module):
    """The 2-conv CNN of FedAvg/DisPFL (the default for small devices and tests)."""

    def __init__(self, num_classes: int = 10, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, h1, h2 = (width_channels(c, width) for c in (64, 64, 384, 192))  # 64, 64, 384, 192 at width 1
        self.conv1 = nn.Conv2d(3, c1, 5)  # 32 -> 28, pool -> 14
        self.conv2 = nn.Conv2d(c1, c2, 5)  # 14 -> 10, pool -> 5
        self.fc1 = nn.Linear(c2 * 5 * 5, h1)  # channel-major flatten: c2's prefix is a prefix of the 1600 inputs
        self.fc2 = nn.Linear(h1, h2)
        self.fc3 = nn.Linear(h2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # ReLU after the pool, not before: the same values and gradients bit for bit (pooling.py says why)
        # on a quarter of the elements
        x = torch.relu(max_pool2x2(self.conv1(x)))
        x = torch.relu(max_pool2x2(self.conv2(x)))
        x = torch.flatten(x, 1)  # (b, 1600)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int, full_planes: int | None = None) -> None:
        super().__init__()
        full = planes if full_planes is None else full_planes  # the block's planes at full width
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(planes, full)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.norm2 = _norm(planes, full)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            projection = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)
            self.shortcut = nn.Sequential(projection, _norm(planes, full))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR ResNet-18: 3x3 stem, no max-pool, BasicBlocks [2,2,2,2], GroupNorm."""

    def __init__(self, num_classes: int = 10, width: float = 1.0) -> None:
        super().__init__()
        stem = width_channels(64, width, GN_GROUPS)
        self.conv1 = nn.Conv2d(3, stem, 3, stride=1, padding=1, bias=False)
        self.norm1 = _norm(stem, 64)
        layers: list[nn.Sequential] = []
        in_planes = stem
        for full, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            planes = width_channels(full, width, GN_GROUPS)
            blocks = BasicBlock(in_planes, planes, stride, full), BasicBlock(planes, planes, 1, full)
            layers.append(nn.Sequential(*blocks))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.linear = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))  # (b, 512, 4, 4) for 32x32 input
        out = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)  # avg-pool 4 on 32x32 input
        return self.linear(out)


VGG11_CFG: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG11(nn.Module):
    """VGG-11 for 32x32 input: conv3x3(bias) -> GN(32) -> ReLU blocks, one Linear(512, classes).

    Where a block is pooled, the pool comes before its ReLU (the same values and gradients, on a quarter of
    the elements; the parameter-holding modules keep their indices, so state-dict names are unchanged)."""

    def __init__(self, num_classes: int = 10, width: float = 1.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in VGG11_CFG:
            if item == "M":
                layers.insert(-1, MaxPool2x2())  # before the block's ReLU
            else:
                assert isinstance(item, int)
                narrow = width_channels(item, width, GN_GROUPS)
                layers += [nn.Conv2d(channels, narrow, 3, padding=1), _norm(narrow, item), nn.ReLU()]
                channels = narrow
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))  # (b, 512, 1, 1) -> (b, 512)


MODELS: dict[str, Callable[..., nn.Module]] = {"cnn": CNN, "resnet18": ResNet18, "vgg11": VGG11}  # (classes, width=)
MODEL_NAMES = tuple(MODELS)
ENTRY_POINT_GROUP = "edge_node.models"  # installed packages register model factories under this group
DEFAULT_INPUT_SHAPE = (3, 32, 32)  # the built-in models' CIFAR images
_ARCH_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_ARCH_NAME_MAX = 64  # ModelSpec's limit: an arch id stays short for TXT records and stream headers

# factory(num_classes, input_shape[, width=]) -> nn.Module (docs/PLUGINS.md says what it must promise)
ModelFactory = Callable[..., nn.Module]


def model_factory(name: str) -> ModelFactory:
    """The factory ``name`` stands for: a built-in model, ``package.module:function``, or an entry point.

    Raises:
        ModelError: one line naming ``name`` and what is wrong (unknown, no module, no attribute, ...).
    """
    if name in MODELS:
        builtin = MODELS[name]

        def factory(num_classes: int, _input_shape: tuple[int, ...], width: float = 1.0) -> nn.Module:
            return builtin(num_classes, width=width)

        return factory
    if is_factory_path(name):
        return load_factory(name, "model factory", ModelError)
    found = load_entry_point(ENTRY_POINT_GROUP, name, "model", ModelError)
    if found is None:
        known = ", ".join([*MODEL_NAMES, *entry_point_names(ENTRY_POINT_GROUP)])
        raise ModelError(f"unknown model {name!r}; choose one of {known}, or a factory package.module:function")
    return found


def check_model_name(name: str) -> None:
    """Refuse a model name that cannot name a factory, without importing it (configs check this early)."""
    if not isinstance(name, str) or not name:
        raise ModelError(f"model={name!r} must be a model name or a factory package.module:function")
    if name in MODELS or is_factory_path(name):
        return
    if name not in entry_point_names(ENTRY_POINT_GROUP):
        known = ", ".join([*MODEL_NAMES, *entry_point_names(ENTRY_POINT_GROUP)])
        raise ModelError(f"model={name!r} must be one of {known}, or a factory package.module:function")


def arch_name(name: str) -> str:
    """The name part of the architecture id (``ModelSpec.arch_name``) for the model ``name``.

    A built-in or entry-point name is kept; a factory path's characters outside ``[A-Za-z0-9_.-]`` become
    dots and its last 64 characters are kept (the function's end). The id also hashes every parameter's
    name and shape, so two different models never share an id even when their names do.
    """
    return _ARCH_CHARS.sub(".", name)[-_ARCH_NAME_MAX:] or "model"


def accepts_width(factory: Callable[..., object]) -> bool:
    """Whether ``factory`` opts in to width tiers: it takes a ``width`` keyword (or any keyword)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: it cannot say
        return False
    return any(p.name == "width" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def build_model(
    name: str,
    num_classes: int = 10,
    *,
    seed: int | None = None,
    input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE,
    width: float = 1.0,
) -> nn.Module:
    """Build a model by name; with ``seed`` its initial weights are reproducible.

    The seed is applied inside ``torch.random.fork_rng`` so library code never changes the caller's
    global RNG state (every client of a fleet must start from the same weights). A user's factory gets
    ``(num_classes, input_shape)``, and ``width=`` below 1 (a width tier's narrow model, which only a factory
    that accepts ``width`` can build); what it raises or returns instead of a module is a ModelError.
    """
    factory = model_factory(name)
    if num_classes < 1:  # a classifier's labels were checked for 2 classes; a regression may have one output
        raise ModelError(f"num_classes={num_classes} must be at least 1 (the model's outputs)")
    if not (isinstance(width, (int, float)) and 0.0 < width <= 1.0):
        raise ModelError(f"width={width!r} must be in (0, 1]")
    narrow = width < 1.0
    if narrow and not accepts_width(factory):
        raise ModelError(f"model {name} does not accept a width argument: width tiers need factory(num_classes, "
                         "input_shape, width=...) building nested narrower models (docs/PLUGINS.md)")  # fmt: skip
    shape = tuple(int(d) for d in input_shape)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        try:
            built = factory(num_classes, shape, width=width) if narrow else factory(num_classes, shape)
        except Exception as exc:  # the user's factory failed: one line, not its traceback
            at = f", width={width:g}" if narrow else ""
            raise ModelError(f"model {name}: factory({num_classes}, {shape}{at}) raised {one_line(exc)}") from None
    if not isinstance(built, nn.Module):
        raise ModelError(f"model {name}: factory returned a {type(built).__name__}, not a torch.nn.Module")
    return built


def model_problem(model: nn.Module) -> str | None:
    """Why ``model`` cannot be masked and averaged by DisPFL (buffers other than BatchNorm's running statistics,
    non-float32 parameters), or None."""
    other = other_buffer(model)  # BatchNorm's running statistics are a client's own (norm_stats); any other is not
    if other is not None:
        buffer_name, layer = other
        layer_name = buffer_name.rpartition(".")[0]
        return (
            f"layer {layer_name or '(root)'!r} ({type(layer).__name__}) keeps buffer {buffer_name!r}: only "
            "BatchNorm's running statistics may be kept (per client); make it a parameter or drop it"
        )
    parameters = list(model.named_parameters())
    if not parameters:
        return "it has no parameters to train"
    for param_name, param in parameters:
        if param.dtype != torch.float32:
            return f"parameter {param_name!r} is {param.dtype}; models train and travel as float32 (no .half())"
        if len(param_name.encode()) > 255:
            return f"parameter name {param_name[:40]!r}... is longer than 255 bytes (the wire's limit)"
    return None


def _shape_text(input_shape: tuple[int, ...]) -> str:
    """``64x64 images`` for a (C, H, W) shape, else ``inputs of shape (64,)``."""
    if len(input_shape) == 3:
        return f"{input_shape[1]}x{input_shape[2]} images"
    return f"inputs of shape {input_shape}"


def build_checked_model(name: str, num_classes: int, input_shape: Sequence[int], seed: int = 0) -> nn.Module:
    """The model ``name`` for ``num_classes`` classes, held to the contract before anything is written.

    Refused with one ModelError line: a model with buffers other than BatchNorm's running statistics or with
    non-float32 parameters, one
    that cannot take a batch of ``(2, *input_shape)`` or does not return ``(2, num_classes)`` logits, and a
    user's factory whose weights differ between two builds with the same seed (it would draw from an RNG
    other than torch's, and a fleet's nodes would not start from the same weights).
    """
    shape = tuple(int(d) for d in input_shape)
    if name == "cnn" and len(shape) == 3 and shape[1:] != (32, 32):
        raise ModelError(f"model cnn takes 32x32 images; this data set's are {shape[1]}x{shape[2]}: use resnet18")
    built = build_model(name, num_classes, seed=seed, input_shape=shape)
    problem = model_problem(built)
    if problem is not None:
        raise ModelError(f"model {name} cannot be masked and averaged: {problem}")
    try:
        with torch.no_grad():  # in eval mode: a BatchNorm layer's running statistics are not moved
            logits = built.eval()(torch.zeros(2, *shape))
        built.train()
    except Exception as exc:  # a shape mismatch is a RuntimeError; a user's forward may raise anything
        fits = "use resnet18" if name in ("cnn", "vgg11") else "fix the factory or use another --model"
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelError(f"model {name} cannot take this data set's {_shape_text(shape)} ({reason}): {fits}") from None
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (2, num_classes):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ModelError(f"model {name} gives outputs of shape {got} for a batch of 2 {_shape_text(shape)}; "
                         f"(2, {num_classes}) outputs (class scores or a task's targets) were expected")  # fmt: skip
    if name not in MODELS:
        again = build_model(name, num_classes, seed=seed, input_shape=shape)
        ours, theirs = list(built.parameters()), list(again.parameters())
        if len(ours) != len(theirs) or not all(
            a.shape == b.shape and torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)
        ):
            raise ModelError(f"model {name}: two builds with seed {seed} differ; draw initial weights from torch's "
                             "RNG only (every node must start from the same weights)")  # fmt: skip
    return built


def parameter_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Each parameter's shape, by name, in the model's order."""
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build_width_model(
    name: str, num_classes: int, input_shape: Sequence[int], width: float, seed: int = 0
) -> nn.Module:
    """``name``'s narrow model at ``width``, held to the width contract: every parameter's shape is a prefix of the
    full model's (the same names, each dimension at most the full one), so its coordinates are the full model's
    first ones (edge_node.algorithm.width). Refused with one ModelError line otherwise.
    """
    full = build_model(name, num_classes, seed=seed, input_shape=input_shape)
    narrow = full if width >= 1.0 else build_model(name, num_classes, seed=seed, input_shape=input_shape, width=width)
    problem = prefix_problem(parameter_shapes(full), parameter_shapes(narrow))
    if problem is not None:
        raise ModelError(f"model {name} at width {width:g} is not a nested sub-network: {problem}")
    return narrow


@dataclass(frozen=True)
class TierWidth:
    """A capacity tier's narrow model under width tiers: its width, the dense FLOPs share it really has, and its
    parameters' shapes (prefixes of the full model's)."""

    density: float  # the tier (edge_node.protocol.TIER_DENSITIES): the share of the full model's dense FLOPs
    width: float
    flop_share: float
    shapes: Mapping[str, tuple[int, ...]]


def tier_widths(
    name: str, num_classes: int, input_shape: Sequence[int], positions: Mapping[str, float]
) -> dict[str, TierWidth]:
    """Every capacity tier's narrow model, by tier name ("0.2" .. "1.0"): what a node of the tier trains, and what
    a receiver checks a stream of that tier against (protocol 1.5). Built on the meta device (shapes only); a
    width that breaks the prefix contract is refused with one ModelError line (a plug-in's narrow model)."""
    with torch.device("meta"):
        full = parameter_shapes(build_model(name, num_classes, input_shape=input_shape))
    table = {}
    for density in TIER_DENSITIES:
        choice = width_of_share(name, num_classes, input_shape, positions, density)
        with torch.device("meta"):
            shapes = full if choice.width >= 1.0 else parameter_shapes(
                build_model(name, num_classes, input_shape=input_shape, width=choice.width)
            )  # fmt: skip
        problem = prefix_problem(full, shapes)
        if problem is not None:
            raise ModelError(f"model {name} at width {choice.width:g} is not a nested sub-network: {problem}")
        table[tier_name(density)] = TierWidth(density, choice.width, choice.flop_share, shapes)
    return table


def width_of_share(
    name: str, num_classes: int, input_shape: Sequence[int], positions: Mapping[str, float], share: float
) -> WidthChoice:
    """The width of ``name``'s narrow model whose dense FLOPs are at most ``share`` of the full model's (a tier's
    width, edge_node.algorithm.width.choose_width); candidate widths are built on the meta device (shapes only).

    ``positions``: the full model's weight positions (edge_node.algorithm.flops.weight_positions).
    """

    def shapes_at(width: float) -> dict[str, tuple[int, ...]]:
        with torch.device("meta"):
            return parameter_shapes(build_model(name, num_classes, input_shape=input_shape, width=width))

    return choose_width(shapes_at, positions, share)
