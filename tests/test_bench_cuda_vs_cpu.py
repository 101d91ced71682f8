"""The CPU-vs-CUDA comparison of ``bench/cuda_vs_cpu.py``: it passes identical runs and catches real differences."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edge_node.records import node_entry

BENCH = Path(__file__).resolve().parents[1] / "bench" / "cuda_vs_cpu.py"
_spec = importlib.util.spec_from_file_location("cuda_vs_cpu", BENCH)
assert _spec is not None and _spec.loader is not None
cvc = importlib.util.module_from_spec(_spec)
sys.modules["cuda_vs_cpu"] = cvc  # dataclasses look their module up there
_spec.loader.exec_module(cvc)


def _run(label: str, weights: torch.Tensor, mask: torch.Tensor, acc: float = 0.5, received: int = 100):
    record = {
        "round": 0,
        "acc_before_mean": acc,
        "acc_after_mean": acc,
        "nodes": [node_entry("client-0", acc, acc, received, received, headline="after")],
        "paper_comm_mb_mean": 1.0,
        "flops_per_client_mean": 10.0,
        "density_mean": 0.5,
    }
    return cvc.RunResult(label, [record], [{"w": weights}], [{"w": mask}], 0.0)


@pytest.fixture()
def reference():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(10_000, generator=g) < 0.5
    return torch.randn(10_000, generator=g) * mask, mask


def test_identical_runs_have_zero_distance(reference):
    w, m = reference
    diff = cvc.compare(_run("a", w, m), _run("b", w.clone(), m.clone()))
    assert diff["weight_rel_diff_max"] == 0 and diff["mask_disagreement_max"] == 0
    assert cvc.failures(diff) == []


def test_rounding_noise_passes(reference):
    w, m = reference
    noisy = w * (1 + 1e-6 * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
    diff = cvc.compare(_run("a", w, m), _run("b", noisy, m, acc=0.505))
    assert 0 < diff["weight_rel_diff_max"] < 1e-5
    assert cvc.failures(diff) == []


def test_real_differences_fail(reference):
    w, m = reference
    moved = m.clone()
    moved[:100] = ~moved[:100]  # 1 % of positions flipped: a different mask, not noise
    assert any("mask positions" in f for f in cvc.failures(cvc.compare(_run("a", w, m), _run("b", w, moved))))
    assert any("weights differ" in f for f in cvc.failures(cvc.compare(_run("a", w, m), _run("b", 1.5 * w, m))))
    assert any("accuracy" in f for f in cvc.failures(cvc.compare(_run("a", w, m), _run("b", w, m, acc=0.6))))
    exact = cvc.failures(cvc.compare(_run("a", w, m), _run("b", w, m, received=101)))
    assert any("bytes_in" in f for f in exact)


def test_cpu_self_check_runs_end_to_end(tmp_path: Path):
    """Three real simulations (cpu, cpu on 1 thread, cpu again): the repeat is bit-identical."""
    out = tmp_path / "cvc.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--device-b", "cpu", "--clients", "3", "--neighbours", "1", "--rounds", "1",
         "--epochs", "1", "--samples-per-client", "100", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict test-cpu: exact values equal; same up to floating-point noise" in proc.stdout
    figures = json.loads(out.read_text())
    assert figures["difference"]["test-cpu"]["weight_rel_diff_max"] == 0.0  # same device, same threads: deterministic
    assert figures["failures"] == {"test-cpu": []}
