"""The measuring logic of ``bench/energy_nvml.py`` (the H100 check of issue 5) on stand-ins, so its
first real run on a GPU is not also its first run: an NVML counter advancing at a set power, a fake
``nvidia-smi`` printing power readings, a sleep as the training step."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pynvml
import pytest

from edge_node.energy import NvmlMeter

BENCH = Path(__file__).resolve().parents[1] / "bench" / "energy_nvml.py"
_spec = importlib.util.spec_from_file_location("energy_nvml", BENCH)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["energy_nvml"] = bench
_spec.loader.exec_module(bench)


class PowerNvml:
    """pynvml stand-in: one GPU whose total-energy counter (mJ) grows at ``watts`` of real time."""

    NVMLError = pynvml.NVMLError

    def __init__(self, watts: float) -> None:
        self.watts = watts
        self.t0 = time.monotonic()

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "Stand-in GPU"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return int(1000 * self.watts * (time.monotonic() - self.t0))


def fake_smi(tmp_path: Path, watts: float) -> str:
    """An executable printing ``watts`` (and an [N/A] now and then) every --loop-ms, like nvidia-smi."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys, time\n"
        "ms = int([a for a in sys.argv if a.startswith('--loop-ms=')][0].split('=')[1])\n"
        "i = 0\n"
        "while True:\n"
        f"    print('[N/A]' if i % 7 == 3 else '{watts:.2f}', flush=True)\n"
        "    i += 1\n"
        "    time.sleep(ms / 1000)\n"
    )
    script.chmod(0o755)
    return str(script)


def _measure(tmp_path: Path, nvml_watts: float, smi_watts: float) -> dict:
    meter = NvmlMeter(0, nvml=PowerNvml(nvml_watts))
    smi = bench.SmiPower(0, 50, executable=fake_smi(tmp_path, smi_watts))
    try:
        return bench.measure(
            meter, smi, lambda: time.sleep(0.005), lambda: None, seconds=1.5, warmup_s=0.2, settle_s=0.2
        )
    finally:
        smi.stop()


def test_agreeing_meters_pass_and_the_record_says_measured_nvml(tmp_path: Path):
    result = _measure(tmp_path, nvml_watts=300.0, smi_watts=300.0)
    assert result["ok"] and result["within_20pct"]
    assert result["ratio_nvml_over_smi"] == pytest.approx(1.0, abs=0.1)
    assert result["nvml_j"] == pytest.approx(300.0 * result["window_s"], rel=0.05)
    assert result["nvidia_smi_readings"] >= 10  # the [N/A] lines were skipped, numbers kept
    record = result["record"]
    assert record["measured"] is True and record["source"] == "nvml" and record["label"] == "measured"
    assert record["steps"] == result["steps"] > 0


def test_meters_that_disagree_by_more_than_20_percent_fail(tmp_path: Path):
    result = _measure(tmp_path, nvml_watts=300.0, smi_watts=150.0)
    assert not result["ok"] and not result["within_20pct"]
    assert result["ratio_nvml_over_smi"] == pytest.approx(2.0, rel=0.1)


def test_too_few_smi_readings_is_an_error_not_a_figure():
    smi = bench.SmiPower.__new__(bench.SmiPower)
    smi.samples = [(1.0, 300.0)]
    with pytest.raises(RuntimeError, match="only 1 nvidia-smi readings"):
        smi.energy_j(0.0, 2.0)
