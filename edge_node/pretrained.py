"""A pretrained start and frozen layers: the model build's two inputs beyond the fleet seed.

``init_weights`` (a safetensors file, or a ``state_dict`` that ``torch.load(..., weights_only=True)`` reads; a
pickle is never loaded) is every node's start: it is read once, when the model is built, so every node and
every simulated client starts from the same weights. Parameters the file leaves out (a new head for the
fleet's classes) keep the values the fleet seed gave them, and are named in the log; a tensor the model does
not have, or a parameter of another shape, is refused. BatchNorm running statistics in the file are every
client's starting statistics (without them in the file, a new layer's: mean 0, variance 1); they join the
start's digest.

``trainable`` globs (fnmatch, over parameter names: ``layer4.*,linear.*``) train only the matching parameters
(edge_node.algorithm.frozen). The wire spec lists only those; the start's digest and the frozen parameters'
names and shapes are its ``variant``, hashed into the architecture id, so nodes with different starts or
trainable sets refuse each other. Neither given: the variant is empty and the id is the one it always was.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edge_node.algorithm.frozen import freeze
from edge_node.algorithm.norm_stats import remember_start_statistics
from edge_node.errors import ConfigError
from edge_node.wire import ModelSpec

__all__ = ["Start", "prepare_start", "read_start_file", "wire_spec"]

_LOGGER = logging.getLogger(__name__)
_NOT_WEIGHTS = "not a safetensors file or a weights-only state_dict"


@dataclass(frozen=True)
class Start:
    """How a model was started and what of it trains.

    Attributes:
        digest: SHA-256 of the parameters the start file set (names, shapes, float32 values); None: the fleet seed's.
        initialised: parameters the file left out, initialised from the fleet seed.
        frozen: parameters that do not train (``requires_grad`` False), in ``named_parameters`` order.
        variant: what the architecture id hashes beyond the travelling tensors' shapes ("" when neither is set).
    """

    digest: str | None = None
    initialised: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    variant: str = ""


def _is_safetensors(path: Path) -> bool:
    """True when ``path`` starts as a safetensors file does: an 8-byte little-endian header size, then ``{``."""
    with path.open("rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= path.stat().st_size


def read_start_file(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a start file, on the CPU, by name.

    Raises:
        ConfigError: one line: no such file, or not a safetensors file or a weights-only ``state_dict``
            (a pickle of anything but tensors is refused by ``weights_only``, never executed).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"init_weights {path}: no such file")
    loaded: object
    try:
        if _is_safetensors(path):
            from safetensors.torch import load_file

            loaded = load_file(str(path), device="cpu")
        else:
            with warnings.catch_warnings():  # torch warns of a pickle protocol it may not read: the refusal says it
                warnings.simplefilter("ignore")
                loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle weights_only refuses, a truncated file, a corrupt header
        raise ConfigError(
            f"init_weights {path}: {_NOT_WEIGHTS} ({type(exc).__name__}; a pickle is never loaded)"
        ) from None
    if not isinstance(loaded, Mapping) or not loaded:
        what = type(loaded).__name__
        raise ConfigError(f"init_weights {path}: {_NOT_WEIGHTS} (it holds a {what}, not tensors by name)")
    bad = next((k for k, v in loaded.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise ConfigError(f"init_weights {path}: {_NOT_WEIGHTS} (entry {bad!r} is a {type(loaded[bad]).__name__})")
    return {str(k): v for k, v in loaded.items()}


def _shape(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def apply_start(
    model: nn.Module, tensors: Mapping[str, torch.Tensor], *, source: str, model_name: str
) -> tuple[str, tuple[str, ...]]:
    """Copy ``tensors`` into ``model``'s parameters; returns the start's digest and the parameters left out.

    Raises:
        ConfigError: a tensor the model does not have (another architecture), a parameter of another shape or
            not floating point, or no parameter at all in the file (one line each).
    """
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    unknown = [name for name in tensors if name not in params and name not in buffers]
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
        raise ConfigError(f"init_weights {source} is not a start for model {model_name}: it holds {len(unknown)} "
                          f"tensor(s) the model does not have ({shown})")  # fmt: skip
    used = [name for name in params if name in tensors]
    if not used:
        raise ConfigError(f"init_weights {source} sets no parameter of model {model_name}")
    for name in used:
        value, param = tensors[name], params[name]
        if tuple(value.shape) != tuple(param.shape):
            raise ConfigError(f"init_weights {source}: parameter {name!r} is {_shape(value.shape)} there, "
                              f"{_shape(param.shape)} in model {model_name}")  # fmt: skip
        if not value.is_floating_point():
            raise ConfigError(f"init_weights {source}: parameter {name!r} is {value.dtype}, not floating point")
    digest = hashlib.sha256()
    with torch.no_grad():
        for name in sorted(used):
            param = params[name]
            param.copy_(tensors[name].to(param.dtype))
            digest.update(f"{name}:{_shape(param.shape)};".encode())
            digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    left_out = tuple(name for name in params if name not in tensors)
    if left_out:
        shown = ", ".join(left_out[:8]) + (f", ... ({len(left_out)} in all)" if len(left_out) > 8 else "")
        _LOGGER.warning("init_weights %s: %d of %d parameters not in the file, initialised from the fleet seed: %s",
                        source, len(left_out), len(params), shown)  # fmt: skip
    stats = [name for name in buffers if name in tensors]
    for name in stats:
        value, buffer = tensors[name], buffers[name]
        if tuple(value.shape) != tuple(buffer.shape):
            raise ConfigError(f"init_weights {source}: buffer {name!r} is {_shape(value.shape)} there, "
                              f"{_shape(buffer.shape)} in model {model_name}")  # fmt: skip
        if not bool(torch.isfinite(value.double()).all()) or (name.endswith("running_var") and bool((value < 0).any())):
            raise ConfigError(f"init_weights {source}: buffer {name!r} holds NaN, infinite or negative variances")
    if stats:
        with torch.no_grad():
            for name in sorted(stats):
                buffers[name].copy_(tensors[name].to(buffers[name].dtype))
                digest.update(f"{name}:{_shape(buffers[name].shape)};".encode())
                digest.update(buffers[name].detach().cpu().contiguous().numpy().tobytes())
        remember_start_statistics(model)  # every client's statistics start from the file's, not from fresh ones
        _LOGGER.info("init_weights %s: %d running statistics (BatchNorm buffers) are every client's start", source,
                     len(stats))  # fmt: skip
    return digest.hexdigest(), left_out


def prepare_start(model: nn.Module, init_weights: Path | None, trainable: Sequence[str], *, model_name: str) -> Start:
    """Start ``model`` (built from the fleet seed) from ``init_weights`` and freeze what ``trainable`` leaves out.

    Neither given: ``model`` is untouched and the start's variant is "". Raises ConfigError (one line) for a bad
    file or a glob that matches no parameter, before anything is written.
    """
    digest: str | None = None
    initialised: tuple[str, ...] = ()
    if init_weights is not None:
        digest, initialised = apply_start(
            model, read_start_file(Path(init_weights)), source=str(init_weights), model_name=model_name
        )
    frozen = freeze(model, tuple(trainable))
    variant = ""
    if digest is not None or frozen:
        shapes = dict(model.named_parameters())
        fixed = ",".join(f"{n}:{_shape(shapes[n].shape)}" for n in frozen)
        variant = f"start={digest or 'seed'};frozen={fixed}"
    return Start(digest, initialised, frozen, variant)


def wire_spec(arch_name: str, num_classes: int, model: nn.Module, start: Start = Start()) -> ModelSpec:
    """The spec of what ``model``'s messages carry: its parameters but the frozen ones, and the start's variant."""
    frozen = set(start.frozen)
    travelling = {name: p for name, p in model.named_parameters() if name not in frozen}
    return ModelSpec.from_tensors(arch_name, num_classes, travelling, start.variant)
