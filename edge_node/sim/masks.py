"""Do clients with similar data end up with similar masks? (DisPFL, Dai et al., ICML 2022, Sec. 4.4.)

For a finished run: the matrix of pairwise Hamming distances between the clients' final masks (the masks
they trained with in the last round, from ``checkpoint.pt``), next to the matrix of cosine similarities of
their training label distributions (``clients.json``), and the correlation of the two over all pairs. The
distance is *aligned*: position by position over the same parameter layout (every client's model has the
same tensors), as the fraction of all parameters where exactly one of the two masks is active. A negative
correlation means clients with similar data keep similar sub-networks.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge_node.errors import CheckpointError
from edge_node.sim.checkpoint import CHECKPOINT_NAME, load_checkpoint
from edge_node.storage import atomic_write_text

MASKS_PLOT = "masks.png"
MASKS_CSV = "masks.csv"  # one row per pair of clients: both measures side by side
HAMMING_CSV = "masks_hamming.csv"  # the clients x clients matrix of aligned Hamming distances
COSINE_CSV = "masks_label_cosine.csv"  # the clients x clients matrix of label-distribution cosine similarities
CLIENTS_FILE = "clients.json"
_CHUNK = 1 << 20  # mask positions per matrix product


def hamming_matrix(masks: list[dict[str, torch.Tensor]]) -> np.ndarray:
    """[N, N] fraction of positions where two clients' masks differ, computed tensor by tensor.

    ``|a xor b| = |a| + |b| - 2 a.b``, with the inner products of a tensor's masks as one matrix product.
    """
    n = len(masks)
    if n == 0:
        return np.zeros((0, 0))
    inner = torch.zeros((n, n), dtype=torch.float64)
    active = torch.zeros(n, dtype=torch.float64)
    total = 0
    for name in masks[0]:
        numel = masks[0][name].numel()
        for lo in range(0, numel, _CHUNK):  # [N, chunk] at a time: 100 ResNet18 masks never sit in memory as floats
            chunk = torch.stack([m[name].reshape(-1)[lo : lo + _CHUNK] for m in masks]).to(torch.float32)
            inner += (chunk @ chunk.T).double()  # exact: a chunk's counts stay below 2**24
            active += chunk.sum(dim=1, dtype=torch.float64)
        total += numel
    distance = (active[:, None] + active[None, :] - 2 * inner) / total
    return distance.clamp_min(0).numpy()


def cosine_matrix(counts: np.ndarray) -> np.ndarray:
    """[N, N] cosine similarity of the rows of ``counts`` (per-client class counts)."""
    x = np.asarray(counts, dtype=np.float64)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    unit = x / np.where(norm > 0, norm, 1.0)
    return unit @ unit.T


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    for value in np.unique(x):  # average ranks of ties
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


@dataclass(frozen=True)
class MaskReport:
    hamming: np.ndarray
    cosine: np.ndarray
    pearson: float
    spearman: float
    order: np.ndarray  # clients sorted by dominant class (the heat-maps' order)
    method: str

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["client_i", "client_j", "hamming_distance", "label_cosine_similarity"])
        n = len(self.hamming)
        for i in range(n):
            for j in range(i + 1, n):
                writer.writerow([i, j, f"{self.hamming[i, j]:.6f}", f"{self.cosine[i, j]:.6f}"])
        return buf.getvalue()

    def matrix_csv(self, matrix: np.ndarray) -> str:
        """``matrix`` (one of the two [N, N]) as CSV: a header of client indices, then one row per client,
        in client order (the heat-maps sort by dominant class; ``order`` has that permutation)."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        n = len(matrix)
        writer.writerow(["client", *range(n)])
        for i in range(n):
            writer.writerow([i, *(f"{v:.6f}" for v in matrix[i])])
        return buf.getvalue()

    def summary(self) -> str:
        n = len(self.hamming)
        upper = np.triu_indices(n, 1)
        return (
            f"{n} clients ({self.method}), {len(upper[0])} pairs: aligned Hamming distance of final masks "
            f"{self.hamming[upper].mean():.4f} mean (min {self.hamming[upper].min():.4f}, max "
            f"{self.hamming[upper].max():.4f}); correlation with label cosine similarity: Pearson "
            f"{self.pearson:+.3f}, Spearman {self.spearman:+.3f} (negative: similar data, similar masks)"
        )


def mask_report(run_dir: Path) -> MaskReport:
    """The mask-distance / label-similarity analysis of a finished run (see the module docstring)."""
    ckpt, clients_path = run_dir / CHECKPOINT_NAME, run_dir / CLIENTS_FILE
    for path in (ckpt, clients_path):
        if not path.is_file():
            raise CheckpointError(f"{path} not found: report --masks needs a run's checkpoint and {CLIENTS_FILE}")
    saved = load_checkpoint(ckpt, torch.device("cpu"))
    method = str(saved["config"].get("method", "dispfl"))
    masks = saved["train_masks"]
    info: dict[str, Any] = json.loads(clients_path.read_text())
    counts = np.array([c["train_class_counts"] for c in info["clients"]], dtype=np.float64)
    if len(masks) != len(counts):
        raise CheckpointError(f"{run_dir}: {len(masks)} masks in the checkpoint but {len(counts)} clients; "
                              f"method {method} keeps no per-client masks")  # fmt: skip
    if len(masks) < 3:
        raise CheckpointError(f"{run_dir}: {len(masks)} clients; a correlation needs at least 3")
    hamming = hamming_matrix(masks)
    if not hamming.any():
        raise CheckpointError(f"{run_dir}: every client has the same mask (method {method} trains dense models)")
    cosine = cosine_matrix(counts)
    upper = np.triu_indices(len(masks), 1)
    h, c = hamming[upper], cosine[upper]
    pearson = float(np.corrcoef(h, c)[0, 1]) if h.std() > 0 and c.std() > 0 else float("nan")
    rh, rc = _ranks(h), _ranks(c)
    spearman = float(np.corrcoef(rh, rc)[0, 1]) if rh.std() > 0 and rc.std() > 0 else float("nan")
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    order = np.lexsort((-shares.max(axis=1), shares.argmax(axis=1)))
    return MaskReport(hamming, cosine, pearson, spearman, order, method)


def write_mask_report(report: MaskReport, out_dir: Path) -> list[Path]:
    """masks.csv (one row per pair), masks_hamming.csv and masks_label_cosine.csv (the two clients x clients
    matrices) and masks.png (the two heat-maps, clients by dominant class)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / MASKS_CSV, report.csv())
    atomic_write_text(out_dir / HAMMING_CSV, report.matrix_csv(report.hamming))
    atomic_write_text(out_dir / COSINE_CSV, report.matrix_csv(report.cosine))
    idx = np.ix_(report.order, report.order)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for ax, matrix, title, cmap in (
        (axes[0], report.hamming[idx], "aligned Hamming distance of final masks", "viridis_r"),
        (axes[1], report.cosine[idx], "cosine similarity of label distributions", "viridis"),
    ):
        image = ax.imshow(matrix, cmap=cmap, interpolation="nearest")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("client (sorted by dominant class)")
        ax.set_ylabel("client")
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(f"{report.method}: Pearson r = {report.pearson:+.3f}, Spearman = {report.spearman:+.3f}")
    fig.tight_layout()
    fig.savefig(out_dir / MASKS_PLOT, dpi=110)
    plt.close(fig)
    return [out_dir / MASKS_CSV, out_dir / HAMMING_CSV, out_dir / COSINE_CSV, out_dir / MASKS_PLOT]
