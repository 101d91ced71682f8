"""Non-IID client partitions of a labelled training set, and per-client test sets (docs/ALGORITHM.md, "Data
partitions"). All randomness comes from the ``numpy.random.Generator`` passed in.

Two families, named in the partition spec (``--partition``), and recorded in every run:

========================  ===========  ==============================================================
spec                      variant      procedure
========================  ===========  ==============================================================
``dir:ALPHA``             reference    the reference code's ``dir``: exhausted class -> draw again
``dir-reuse:ALPHA``       reuse        ``dir`` priors, exhausted class -> reset its count (reuse)
``dir-balanced:ALPHA``    balanced     no reuse, quota slots in a random order (edge-node <= 0.x)
``path:K``                reference    the reference code's ``n_cls``: exhausted class -> reset (reuse)
``path-balanced:K``       balanced     classes dealt evenly, equal shares, no reuse
========================  ===========  ==============================================================

**Reference** (:func:`partition_reference`; DisPFL's public code, ``fedml_api/data_preprocessing/
cifar10/data_loader.py:partition_data``, which produced the paper's tables). Every client has a class
prior and a quota (training size // N). While any quota is unfilled, a uniformly drawn client that is not
yet full takes one sample: a class drawn from its prior, then the next sample of that class's pool (pools
are served from their end). When the drawn class's pool is exhausted, the reference code does one of two
things and then draws a class from the prior again:

* ``path`` (its ``n_cls`` branch): it resets that class's remaining count to a uniform integer in
  ``[0, pool size)``, so samples of popular classes are given to several clients and every client's data
  follows its prior's classes exactly (classes have unequal numbers of holders: k classes are chosen
  independently per client);
* ``dir``: nothing is reset (the reset line is commented out in the code's CIFAR-100 loader and absent
  in the CIFAR-10 one): an exhausted class stays exhausted and the client draws again, so no sample is
  given twice and, once popular classes run out, late clients get classes their prior rarely picks.
  docs/ALGORITHM.md describes the reset for ``dir`` too; ``dir-reuse`` is that reading.

Where a client's prior has no mass left on any available class (only possible without reuse, for
priors with exact zeros), it draws uniformly among the available classes instead of looping forever.
Pools are shuffled by the seeded generator (the reference serves them in file order; CIFAR's file order
is random anyway).

**Balanced** (:func:`partition_dir`, :func:`partition_path`: what edge-node used before the reference
procedure, kept as an option). ``dir-balanced``: clients take turns in a random order of the quota slots
(a random permutation, not a uniform client draw), drawing again while a class is exhausted; no sample is
given twice. ``path-balanced``: every client holds exactly ``k`` distinct classes and the same number of
samples of each; classes are dealt so that each is held by floor or ceil of N*k/C clients and every
(client, class) pair gets the smallest ``count(class) // holders(class)``: CIFAR-10, N=100, k=2 gives 20
holders x 250 samples, every sample used once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edge_node.errors import ConfigError
from edge_node.seeding import Stream, numpy_generator

_CHUNK_SLOTS = 4096  # draws made at once by partition_dir; any value gives the same distribution


def _check_labels(labels: np.ndarray) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0 or not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(f"labels must be a non-empty 1-D integer array, got {y.dtype} {y.shape}")
    if y.min() < 0:
        raise ConfigError(f"labels must be >= 0, got {int(y.min())}")
    return y.astype(np.int64, copy=False)


def _check_clients(num_clients: int, n: int) -> None:
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ConfigError(f"num_clients={num_clients!r} must be a positive integer")
    if num_clients > n:
        raise ConfigError(f"num_clients={num_clients} exceeds the {n} training samples")


def _class_pools(y: np.ndarray, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """For each class, its sample indices in a random order."""
    order = rng.permutation(len(y))
    order = order[np.argsort(y[order], kind="stable")]
    bounds = np.searchsorted(y[order], np.arange(num_classes + 1))
    return [order[bounds[c] : bounds[c + 1]] for c in range(num_classes)]


def partition_dir(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    samples_per_client: int | None = None,
) -> list[np.ndarray]:
    """``dir-balanced``: Dirichlet non-IID partition; per-client sorted int64 index arrays, disjoint, of the quota size.

    The quota is ``len(labels) // num_clients`` unless ``samples_per_client`` is given.
    """
    y = _check_labels(labels)
    n = len(y)
    _check_clients(num_clients, n)
    if not (isinstance(alpha, (int, float, np.floating)) and math.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"alpha={alpha!r} must be a positive finite number")
    quota = n // num_clients if samples_per_client is None else samples_per_client
    if not isinstance(quota, (int, np.integer)) or quota < 1 or quota * num_clients > n:
        raise ConfigError(
            f"samples_per_client={samples_per_client!r} must be an integer in 1..{n // num_clients} "
            f"for {num_clients} clients and {n} samples"
        )
    num_classes = int(y.max()) + 1
    priors = rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)  # [N, C]
    pools = _class_pools(y, num_classes, rng)
    remaining = np.array([len(p) for p in pools], dtype=np.int64)
    slots = rng.permutation(np.repeat(np.arange(num_clients), quota))  # whose turn each draw is
    drawn = np.empty(len(slots), dtype=np.int64)  # class drawn at each turn
    pos = 0
    while pos < len(slots):
        avail = np.flatnonzero(remaining > 0)
        p = priors[:, avail]
        mass = p.sum(axis=1, keepdims=True)
        # A prior with no mass left on available classes (possible for tiny alpha): uniform over them.
        p = np.where(mass > 0, p / np.where(mass > 0, mass, 1.0), 1.0 / len(avail))
        cdf = np.cumsum(p, axis=1)
        cdf[:, -1] = 1.0
        chunk = slots[pos : pos + _CHUNK_SLOTS]
        u = rng.random(len(chunk))
        cls = avail[(u[:, None] >= cdf[chunk]).sum(axis=1)]
        # The k-th draw of class c is valid while k <= remaining[c]; the first invalid one is where the
        # sequential process would have found c exhausted and redrawn, so accept only the draws before it.
        order = np.argsort(cls, kind="stable")
        sorted_cls = cls[order]
        starts = np.searchsorted(sorted_cls, sorted_cls, side="left")
        rank = np.empty(len(cls), dtype=np.int64)
        rank[order] = np.arange(len(cls)) - starts
        bad = np.flatnonzero(rank >= remaining[cls])
        take = int(bad[0]) if bad.size else len(chunk)
        drawn[pos : pos + take] = cls[:take]
        remaining -= np.bincount(cls[:take], minlength=num_classes)
        pos += take
    # Hand out samples: the j-th draw of class c gets the j-th index of c's shuffled pool.
    order = np.argsort(drawn, kind="stable")
    bounds = np.searchsorted(drawn[order], np.arange(num_classes + 1))
    sample = np.empty(len(drawn), dtype=np.int64)
    for c in range(num_classes):
        sample[order[bounds[c] : bounds[c + 1]]] = pools[c][: bounds[c + 1] - bounds[c]]
    by_client = np.argsort(slots, kind="stable")
    return [np.sort(sample[by_client[i * quota : (i + 1) * quota]]) for i in range(num_clients)]


def _deal_classes(num_clients: int, k: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """[N, k] distinct classes per client, each class held by floor or ceil of N*k/C clients."""
    capacity = np.full(num_classes, num_clients * k // num_classes, dtype=np.int64)
    capacity[rng.permutation(num_classes)[: num_clients * k % num_classes]] += 1
    out = np.empty((num_clients, k), dtype=np.int64)
    for i, client in enumerate(rng.permutation(num_clients)):
        left = num_clients - i  # clients still to serve, this one included
        # A class with as many slots left as clients left must be taken now, or it could not be filled.
        forced = np.flatnonzero(capacity == left)
        others = np.flatnonzero((capacity > 0) & (capacity < left))
        extra = k - len(forced)
        picked = forced
        if extra > 0:
            w = capacity[others].astype(np.float64)
            picked = np.concatenate([forced, rng.choice(others, size=extra, replace=False, p=w / w.sum())])
        capacity[picked] -= 1
        out[client] = np.sort(picked)
    return out


def partition_path(
    labels: np.ndarray, num_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """``path-balanced``: each client gets exactly ``classes_per_client`` classes, equal share of each.

    See the module docstring for how classes are dealt and why shares are fixed.
    """
    y = _check_labels(labels)
    _check_clients(num_clients, len(y))
    num_classes = int(y.max()) + 1
    k = classes_per_client
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= num_classes:
        raise ConfigError(f"classes_per_client={k!r} must be an integer in 1..{num_classes}")
    pools = _class_pools(y, num_classes, rng)
    classes = _deal_classes(num_clients, int(k), num_classes, rng)  # [N, k]
    holders = np.bincount(classes.ravel(), minlength=num_classes)
    used = np.flatnonzero(holders)
    share = int(min(len(pools[c]) // holders[c] for c in used))
    if share < 1:
        raise ConfigError(
            f"classes_per_client={k} with {num_clients} clients leaves some class with fewer samples than holders"
        )
    taken = np.zeros(num_classes, dtype=np.int64)
    parts = []
    for i in range(num_clients):
        idx = []
        for c in classes[i]:
            idx.append(pools[c][taken[c] : taken[c] + share])
            taken[c] += share
        parts.append(np.sort(np.concatenate(idx)))
    return parts


def client_test_indices(
    client_train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    rng: np.random.Generator,
    per_client: int = 100,
) -> np.ndarray:
    """Indices into the global test set matching a client's label mix: ceil(p_label * per_client) of each.

    ``p_label`` is the label's share of the client's training labels; ceil is computed in integers
    (a share of 1/4 gives exactly 25, never 26 from float round-off). Within a client no test sample
    repeats; a label with fewer test samples than asked for contributes all it has. Sorted by label.
    """
    train = _check_labels(client_train_labels)
    test = np.asarray(test_labels)
    if test.ndim != 1 or not np.issubdtype(test.dtype, np.integer):
        raise ConfigError(f"test_labels must be a 1-D integer array, got {test.dtype} {test.shape}")
    if not isinstance(per_client, (int, np.integer)) or per_client < 1:
        raise ConfigError(f"per_client={per_client!r} must be a positive integer")
    if int(train.max()) >= num_classes:
        raise ConfigError(f"num_classes={num_classes} but the client has label {int(train.max())}")
    counts = np.bincount(train, minlength=num_classes)
    total = int(counts.sum())
    out = []
    for label in np.flatnonzero(counts):
        want = -(-int(counts[label]) * per_client // total)  # ceil(count / total * per_client)
        pool = np.flatnonzero(test == label)
        out.append(rng.choice(pool, size=min(want, len(pool)), replace=False) if len(pool) else pool)
    return np.concatenate(out).astype(np.int64, copy=False)


def dir_priors(num_clients: int, num_classes: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """[N, C] class priors drawn from Dir(alpha), one row per client (the reference's ``dir``)."""
    if not (isinstance(alpha, (int, float, np.floating)) and math.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"alpha={alpha!r} must be a positive finite number")
    return rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)


def path_priors(num_clients: int, num_classes: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """[N, C] priors uniform over ``k`` classes chosen independently per client (the reference's ``n_cls``)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= num_classes:
        raise ConfigError(f"classes_per_client={k!r} must be an integer in 1..{num_classes}")
    priors = np.zeros((num_clients, num_classes))
    for i in range(num_clients):
        priors[i, rng.choice(num_classes, size=int(k), replace=False)] = 1.0 / k
    return priors


def partition_reference(
    labels: np.ndarray,
    priors: np.ndarray,
    rng: np.random.Generator,
    *,
    samples_per_client: int | None = None,
    reuse: bool,
) -> list[np.ndarray]:
    """The reference code's one-sample-at-a-time partition (module docstring): sorted int64 indices per client.

    Args:
        labels: the training labels.
        priors: [N, C] class prior of each client (:func:`dir_priors`, :func:`path_priors`).
        samples_per_client: the quota; default ``len(labels) // N`` (the reference's).
        reuse: on drawing an exhausted class, reset its remaining count to a uniform integer in
            ``[0, pool size)`` (the reference's ``path``), else leave it exhausted (its ``dir``); either
            way a class is then drawn from the prior again. With reuse a client's indices may repeat.
    """
    y = _check_labels(labels)
    n = len(y)
    priors = np.asarray(priors, dtype=np.float64)
    num_clients = priors.shape[0] if priors.ndim == 2 else 0
    _check_clients(num_clients, n)
    num_classes = max(int(y.max()) + 1, priors.shape[1])
    quota = n // num_clients if samples_per_client is None else samples_per_client
    if isinstance(quota, bool) or not isinstance(quota, (int, np.integer)) or quota < 1 or quota * num_clients > n:
        raise ConfigError(
            f"samples_per_client={samples_per_client!r} must be an integer in 1..{n // num_clients} "
            f"for {num_clients} clients and {n} samples"
        )
    pools = _class_pools(y, num_classes, rng)
    sizes = np.array([len(pool) for pool in pools], dtype=np.int64)
    prior = np.zeros((num_clients, num_classes))
    prior[:, : priors.shape[1]] = priors
    prior[:, sizes == 0] = 0.0  # a class absent from the data set can never be served
    mass = prior.sum(axis=1)
    if (mass <= 0).any():
        bad = int(np.flatnonzero(mass <= 0)[0])
        raise ConfigError(f"client {bad}'s class prior has no mass on any class present in the data set")
    cdf = np.cumsum(prior / mass[:, None], axis=1)
    cdf[:, -1] = 1.0
    remaining = sizes.copy()
    left = np.full(num_clients, int(quota), dtype=np.int64)
    open_clients = list(range(num_clients))  # not yet full; drawing among them = the reference's redraw loop
    out: list[list[int]] = [[] for _ in range(num_clients)]
    while open_clients:
        slot = int(rng.integers(len(open_clients)))
        client = open_clients[slot]
        left[client] -= 1
        if left[client] == 0:
            open_clients[slot] = open_clients[-1]
            open_clients.pop()
        while True:  # the reference's inner loop
            cls = int(np.searchsorted(cdf[client], rng.random(), side="right"))
            if remaining[cls] > 0:
                break
            if reuse:
                remaining[cls] = int(rng.integers(sizes[cls]))
                continue
            # Drawing again until an available class comes up is drawing from the prior renormalised over
            # the available classes: do that in one draw (a prior can put 1e-10 on the last class left).
            avail = np.flatnonzero(remaining > 0)
            weights = prior[client, avail]
            total = weights.sum()
            cls = int(avail[rng.choice(len(avail), p=weights / total)] if total > 0 else rng.choice(avail))
            break
        remaining[cls] -= 1
        out[client].append(int(pools[cls][remaining[cls]]))
    return [np.sort(np.asarray(idx, dtype=np.int64)) for idx in out]


PARTITION_KINDS = ("dir", "path")
PARTITION_VARIANTS = ("reference", "reuse", "balanced")
_SPEC_NAMES = {  # spec prefix -> (kind, variant)
    "dir": ("dir", "reference"),
    "dir-reuse": ("dir", "reuse"),
    "dir-balanced": ("dir", "balanced"),
    "path": ("path", "reference"),
    "path-balanced": ("path", "balanced"),
}
PARTITION_NAMES = tuple(_SPEC_NAMES)


@dataclass(frozen=True)
class PartitionSpec:
    """A parsed ``--partition``: kind (``dir``/``path``), its argument (alpha or k) and the procedure variant."""

    kind: str
    value: float | int
    variant: str

    @property
    def name(self) -> str:
        """The canonical spec string (``dir:0.3``, ``path-balanced:2``)."""
        prefix = next(p for p, kv in _SPEC_NAMES.items() if kv == (self.kind, self.variant))
        return f"{prefix}:{self.value:g}" if self.kind == "dir" else f"{prefix}:{self.value}"

    @property
    def takes_quota(self) -> bool:
        """Whether ``samples_per_client`` applies (not to ``path-balanced``, whose shares are fixed)."""
        return not (self.kind == "path" and self.variant == "balanced")


def parse_partition_spec(spec: str) -> PartitionSpec:
    """``"dir:0.3"``, ``"dir-reuse:0.3"``, ``"dir-balanced:0.3"``, ``"path:2"``, ``"path-balanced:2"`` -> a spec.

    Raises:
        ConfigError: anything else, the spec quoted.
    """
    prefix, sep, value = str(spec).strip().partition(":")
    prefix = prefix.strip().lower()
    if not sep or prefix not in _SPEC_NAMES:
        forms = ", ".join(p + (":<alpha>" if p.startswith("dir") else ":<k>") for p in _SPEC_NAMES)
        raise ConfigError(f"partition {spec!r} must be one of {forms} (e.g. dir:0.3, path:2)")
    kind, variant = _SPEC_NAMES[prefix]
    if kind == "dir":
        try:
            alpha = float(value)
        except ValueError:
            raise ConfigError(f"partition {spec!r}: alpha {value!r} is not a number") from None
        if not (math.isfinite(alpha) and alpha > 0):
            raise ConfigError(f"partition {spec!r}: alpha must be a positive finite number")
        return PartitionSpec("dir", alpha, variant)
    try:
        k = int(value.strip())
    except ValueError:
        raise ConfigError(f"partition {spec!r}: k {value!r} is not an integer") from None
    if k < 1:
        raise ConfigError(f"partition {spec!r}: k must be >= 1")
    return PartitionSpec("path", k, variant)


def parse_partition(spec: str) -> tuple[str, float]:
    """``"dir:0.3"`` -> ``("dir", 0.3)``; ``"path-balanced:2"`` -> ``("path", 2)`` (an int). ConfigError otherwise.

    The kind and its argument only; :func:`parse_partition_spec` also gives the variant.
    """
    parsed = parse_partition_spec(spec)
    return parsed.kind, parsed.value


def partition_clients(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    partition: str,
    num_clients: int,
    seed: int,
    samples_per_client: int | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Training and test index arrays of every client of a benchmark partition (docs/ALGORITHM.md "Data partitions").

    A function of (labels, partition, number of clients, seed) alone: a device computes it and keeps
    its own client's slice, and gets the slice the simulation gives that client. ``partition`` is a spec
    of :func:`parse_partition_spec`; the reference procedure is the default of ``dir`` and ``path``.
    """
    spec = parse_partition_spec(partition)
    rng = numpy_generator(seed, Stream.PARTITION)
    if samples_per_client is not None:
        if not spec.takes_quota:
            raise ConfigError("samples_per_client does not apply to path-balanced partitions (fixed shares)")
        if samples_per_client * num_clients > len(train_labels):
            raise ConfigError(
                f"samples_per_client={samples_per_client} x clients={num_clients} exceeds the "
                f"{len(train_labels)} training samples"
            )
    if spec.variant == "balanced":
        if spec.kind == "dir":
            train = partition_dir(train_labels, num_clients, float(spec.value), rng, samples_per_client)
        else:
            train = partition_path(train_labels, num_clients, int(spec.value), rng)
    else:
        y = _check_labels(train_labels)
        _check_clients(num_clients, len(y))
        classes = max(int(y.max()) + 1, num_classes)
        if spec.kind == "dir":
            priors = dir_priors(num_clients, classes, float(spec.value), rng)
        else:
            priors = path_priors(num_clients, classes, int(spec.value), rng)
        train = partition_reference(
            y, priors, rng, samples_per_client=samples_per_client, reuse=spec.kind == "path" or spec.variant == "reuse"
        )
    test_rng = numpy_generator(seed, Stream.TEST_SPLIT)
    test = [client_test_indices(train_labels[idx], test_labels, num_classes, test_rng) for idx in train]
    return train, test


def client_slice(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    partition: str,
    num_clients: int,
    client_index: int,
    seed: int,
    samples_per_client: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Client ``client_index``'s (training, test) indices of the partition :func:`partition_clients` makes."""
    if isinstance(client_index, bool) or not isinstance(client_index, (int, np.integer)):
        raise ConfigError(f"client_index={client_index!r} must be an integer")
    if not 0 <= client_index < num_clients:
        raise ConfigError(f"client_index={client_index} must be in 0..{num_clients - 1} for {num_clients} clients")
    train, test = partition_clients(
        train_labels, test_labels, num_classes, partition, num_clients, seed, samples_per_client
    )
    return train[client_index], test[client_index]
