"""Tiny runs of the benchmarks so they keep working (figures are printed, never asserted as timings)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_wire_bench_quick_prints_sizes_and_the_loopback_ratio(tmp_path: Path):
    out = tmp_path / "wire.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "wire.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "loopback pull of cnn" in proc.stdout and "x)" in proc.stdout
    assert json.loads(out.read_text())


def test_sim_memory_bench_measures_both_layouts(tmp_path: Path):
    out = tmp_path / "mem.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "sim_memory.py"), "--clients", "3", "--model", "cnn", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    assert figures["ours_peak_rss_gib"] > 0 and figures["naive_peak_rss_gib"] > 0


def test_hostile_bench_quick_measures_every_attack(tmp_path: Path):
    out = tmp_path / "hostile.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "hostile.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = {row["attack"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["honest"]["outcome"] == "accepted" and rows["3e38 values"]["outcome"] == "screen: refused"
    assert all(row["outcome"] != "accepted" for name, row in rows.items() if name not in ("honest", "never-ending"))
    assert "slow-loris" in proc.stdout and "peak RSS" in proc.stdout
