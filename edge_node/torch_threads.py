"""``threads``: torch's intra-op thread count, set once, before training, by the daemon and the simulation alike.

``torch.set_num_threads`` sizes the pool that runs a tensor operation; it is set before the first
training step, so that every step of a run sums in the same order. What torch reads only as it loads
cannot be set here: the OpenMP wait policy (``OMP_WAIT_POLICY``, whether idle workers spin), the
inter-op pool and ``OMP_NUM_THREADS`` for the threads torch starts while it loads. Give those in the
environment of the command (``OMP_NUM_THREADS=1 edge-node simulate ...``; ``edge-node loopback`` sets
``OMP_NUM_THREADS`` of each daemon to its ``--threads``).
"""

from __future__ import annotations

# The help of the ``threads`` key of ``edge-node start`` and ``edge-node simulate``.
THREADS_HELP = (
    "Torch intra-op threads, set before training [default: torch's, the cores it may use]. OpenMP settings read as "
    "torch loads (OMP_WAIT_POLICY, OMP_NUM_THREADS) go in the environment instead."
)


def apply_threads(threads: int | None) -> None:
    """Run torch's tensor operations on ``threads`` threads (None: leave torch's default, the cores it may use)."""
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)
