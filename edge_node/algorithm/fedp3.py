"""FedP3 (Yi et al., "FedP3: Federated Personalized and Privacy-friendly Network Pruning under Model
Heterogeneity", ICLR 2024, Algorithms 1-3) as pure functions, following the authors' code where the paper is
silent (docs/FEDP3.md lists each such place).

A *layer* is the parameters of one module (``conv1.weight`` and ``conv1.bias``), in the model's order; the
last one is the *final layer* (the classifier), every other one a *hidden layer*. Each round client ``i``
owns a few hidden layers (:func:`owned_layers`, the code's schedules LowerB, OPU2, OPU3, OPR2), receives
them dense and the other hidden layers pruned to a keep ratio (:func:`server_to_client`), trains, and
uploads its owned layers plus the final layer; the server averages each layer over the clients that
uploaded it (:func:`layer_average`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from edge_node.errors import ConfigError
from edge_node.seeding import Stream, numpy_generator

TensorDict = Mapping[str, torch.Tensor]
# lowerb: one hidden layer per client; opu2/opu3: 2/3 consecutive ones (cyclic); opr2: 2 random ones a round.
SCHEDULES = ("lowerb", "opu2", "opu3", "opr2")
AGGREGATIONS = ("mean", "weighted")  # Algorithm 3's simple and weighted averaging


def layer_groups(names: Sequence[str]) -> list[list[str]]:
    """Parameter names grouped by owning module, in order: ``[[conv1.weight, conv1.bias], [conv2...], ...]``."""
    groups: list[list[str]] = []
    prefix: str | None = None
    for name in names:
        owner = name.rsplit(".", 1)[0]
        if owner != prefix:
            groups.append([])
            prefix = owner
        groups[-1].append(name)
    if len(groups) < 2:
        raise ConfigError(f"fedp3 needs a model of at least 2 layers (hidden + final); this one has {len(groups)}")
    return groups


def owned_layers(
    schedule: str, client: int, num_clients: int, num_hidden: int, *, seed: int, round_index: int
) -> list[int]:
    """The hidden layers (indices into ``layer_groups(...)[:-1]``) client ``client`` trains and uploads.

    The authors' code, for 100 clients and 4 hidden layers: LowerB gives client ``i`` layer ``i // 25``,
    OPU2 adds the next layer cyclically, OPU3 the next two; OPR2 draws 2 distinct layers every round.
    Generalised: the first layer is ``i * num_hidden // num_clients`` (equal blocks of clients per layer).
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"fedp3 layer schedule {schedule!r} must be one of {', '.join(SCHEDULES)}")
    if not 0 <= client < num_clients or num_hidden < 1:
        raise ConfigError(f"client {client} of {num_clients} with {num_hidden} hidden layers")
    if schedule == "opr2":
        rng = numpy_generator(seed, Stream.FEDP3_LAYERS, client, round_index)
        return sorted(int(k) for k in rng.choice(num_hidden, size=min(2, num_hidden), replace=False))
    first = client * num_hidden // num_clients
    count = {"lowerb": 1, "opu2": 2, "opu3": 3}[schedule]
    return sorted({(first + k) % num_hidden for k in range(min(count, num_hidden))})


def keep_mask(weight: torch.Tensor, keep: float) -> torch.Tensor:
    """Bool mask of the ``int(numel * keep)`` largest-magnitude entries of a weight tensor (the code's
    server-to-client pruning, per tensor); 1-D tensors (biases, norm scales) are kept whole."""
    if not 0 < keep <= 1:
        raise ConfigError(f"fedp3 keep ratio {keep!r} must be in (0, 1]")
    if weight.dim() <= 1 or keep == 1:
        return torch.ones_like(weight, dtype=torch.bool)
    flat = weight.reshape(-1)
    k = int(flat.numel() * keep)
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=weight.device)
    if k > 0:
        mask[torch.topk(flat.abs(), k, largest=True).indices] = True
    return mask.reshape(weight.shape)


def server_to_client(
    server: TensorDict, personal: TensorDict, groups: Sequence[Sequence[str]], owned: Sequence[int], keep: float
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Client's model for the round (Algorithm 1 lines 5-8) and its training mask.

    Owned hidden layers: the server's, dense. Other hidden layers: the server's, pruned to ``keep``. Final
    layer: the client's own (the authors' code never sends it down, so it stays personal).
    """
    weights: dict[str, torch.Tensor] = {}
    masks: dict[str, torch.Tensor] = {}
    owned_set = set(owned)
    for index, group in enumerate(groups):
        final = index == len(groups) - 1
        for name in group:
            if final:
                weights[name] = personal[name].clone()
                masks[name] = torch.ones_like(personal[name], dtype=torch.bool)
            else:
                mask = keep_mask(server[name], 1.0 if index in owned_set else keep)
                weights[name] = server[name] * mask
                masks[name] = mask
    return weights, masks


def uploaded_names(groups: Sequence[Sequence[str]], owned: Sequence[int]) -> list[str]:
    """The parameter names a client uploads: its owned hidden layers and the final layer (Algorithm 1 line 12)."""
    chosen = sorted(set(owned)) + [len(groups) - 1]
    return [name for index in chosen for name in groups[index]]


def layer_average(
    server: TensorDict, uploads: Sequence[TensorDict], layers_owned: Sequence[int], aggregation: str = "mean"
) -> dict[str, torch.Tensor]:
    """Algorithm 3: each tensor becomes the average of the uploads that hold it; one nobody uploaded keeps the
    server's value. ``mean``: plain average; ``weighted``: client ``i`` weighs ``|L_i| / sum_j |L_j|`` over the
    tensor's uploaders (``layers_owned[i]`` = how many layers it uploaded, the paper's importance weighting)."""
    if aggregation not in AGGREGATIONS:
        raise ConfigError(f"fedp3 aggregation {aggregation!r} must be one of {', '.join(AGGREGATIONS)}")
    if len(uploads) != len(layers_owned) or any(n < 1 for n in layers_owned):
        raise ConfigError(f"{len(uploads)} uploads and layer counts {list(layers_owned)}: need as many, each >= 1")
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, current in server.items():
            holders = [(up[name], n) for up, n in zip(uploads, layers_owned, strict=True) if name in up]
            if not holders:
                out[name] = current.clone()
                continue
            total = float(sum(n for _, n in holders)) if aggregation == "weighted" else float(len(holders))
            acc = torch.zeros_like(current)
            for tensor, n in holders:
                acc.add_(tensor, alpha=(n if aggregation == "weighted" else 1) / total)
            out[name] = acc
    return out
