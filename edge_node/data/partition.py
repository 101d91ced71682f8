"""Non-IID client partitions of a labelled training set, and per-client test sets (ALGORITHM.md, "Data
partitions"). All randomness comes from the ``numpy.random.Generator`` passed in.

``dir`` (Dirichlet, as in DisPFL's reference implementation): each client draws a class prior from
Dir(alpha); clients then take turns, in a random order, drawing one sample at a time: a class from their
prior, redrawing when that class is exhausted (equivalently: from the prior renormalised over the classes
that still have samples), and the next unused sample of that class. The turns interleave all clients (a
random permutation of the quota slots), so that running out of a class hits every client alike. (The
reference implementation instead gives each next sample to a uniformly drawn client that is not yet full;
both fill every quota the way ALGORITHM.md says, but when classes run out the two orders give slightly
different mixes, so partitions are not sample-for-sample those of the reference code.)

``path`` (pathological): every client holds exactly ``k`` distinct classes and the SAME number of samples
of each. Classes are dealt at random but balanced, so that each class is held by floor or ceil of
N*k/C clients; every (client, class) pair then gets a fixed share, the smallest of
``count(class) // holders(class)`` over the classes in use. Why this and not "split each class among its
holders": with independent random picks a class can end up with 30 holders and another with 10, which
makes clients' sizes and class proportions unequal; the balanced deal reproduces the paper's 500
samples per client exactly (CIFAR-10, N=100, k=2: 20 holders x 250; CIFAR-100, k=10: 10 x 50), with every
sample used and none given twice.
"""

from __future__ import annotations

import math

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
    """Dirichlet non-IID partition: per-client sorted int64 index arrays, disjoint, each of the quota size.

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
    """Pathological partition: each client gets exactly ``classes_per_client`` classes, equal share of each.

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


def parse_partition(spec: str) -> tuple[str, float]:
    """``"dir:0.3"`` -> ``("dir", 0.3)``; ``"path:2"`` -> ``("path", 2)`` (an int). ConfigError otherwise."""
    kind, sep, value = str(spec).strip().partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in ("dir", "path"):
        raise ConfigError(f"partition {spec!r} must be 'dir:<alpha>' (e.g. dir:0.3) or 'path:<k>' (e.g. path:2)")
    if kind == "dir":
        try:
            alpha = float(value)
        except ValueError:
            raise ConfigError(f"partition {spec!r}: alpha {value!r} is not a number") from None
        if not (math.isfinite(alpha) and alpha > 0):
            raise ConfigError(f"partition {spec!r}: alpha must be a positive finite number")
        return "dir", alpha
    try:
        k = int(value.strip())
    except ValueError:
        raise ConfigError(f"partition {spec!r}: k {value!r} is not an integer") from None
    if k < 1:
        raise ConfigError(f"partition {spec!r}: k must be >= 1")
    return "path", k


def partition_clients(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    partition: str,
    num_clients: int,
    seed: int,
    samples_per_client: int | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Training and test index arrays of every client of a benchmark partition (ALGORITHM.md "Data partitions").

    A function of (labels, partition, number of clients, seed) alone: a device computes it and keeps
    its own client's slice, and gets the slice the simulation gives that client.
    """
    kind, arg = parse_partition(partition)
    rng = numpy_generator(seed, Stream.PARTITION)
    if kind == "dir":
        if samples_per_client is not None and samples_per_client * num_clients > len(train_labels):
            raise ConfigError(
                f"samples_per_client={samples_per_client} x clients={num_clients} exceeds the "
                f"{len(train_labels)} training samples"
            )
        train = partition_dir(train_labels, num_clients, float(arg), rng, samples_per_client)
    else:
        if samples_per_client is not None:
            raise ConfigError("samples_per_client applies to dir partitions only (path splits classes evenly)")
        train = partition_path(train_labels, num_clients, int(arg), rng)
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
