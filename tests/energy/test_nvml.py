"""NVML meter logic against a stand-in bindings module (no GPU here; the real check is bench/)."""

from __future__ import annotations

import pynvml
import pytest

from edge_node.energy import EnergyAccountant, NvmlMeter
from edge_node.errors import MeterUnavailable


class FakeNvml:
    """The pynvml functions NvmlMeter calls, over GPUs whose millijoule counters the test sets."""

    NVMLError = pynvml.NVMLError

    def __init__(self, names: list[str], *, init_error: int | None = None, unsupported: set[int] = frozenset()):
        self.names = names
        self.energy_mj = [10_000_000 * (i + 1) for i in range(len(names))]  # counters since driver load
        self.init_error = init_error
        self.unsupported = unsupported
        self.initialised = False
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        assert self.initialised
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.names[handle]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        if handle in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.energy_mj[handle]


def test_one_gpu_counter_in_joules(fake_clock) -> None:
    nvml = FakeNvml(["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
    with NvmlMeter(1, nvml=nvml, clock=fake_clock) as meter:
        assert meter.source == "nvml" and meter.measured
        assert meter.detail.startswith("NVML total energy of GPU 1 NVIDIA H100")
        nvml.energy_mj[1] += 350_000  # 350 J on GPU 1
        nvml.energy_mj[0] += 999_000  # GPU 0 is not asked for
        assert meter.read().energy_j == pytest.approx(350.0)
    assert nvml.shutdowns == 1 and not nvml.initialised


def test_all_gpus_are_summed_and_attributed_to_phases(fake_clock, tmp_path) -> None:
    nvml = FakeNvml(["GPU-A", "GPU-B"])
    meter = NvmlMeter(None, nvml=nvml, clock=fake_clock)
    with EnergyAccountant(meter, tmp_path / "energy.jsonl", clock=fake_clock) as acct:
        with acct.phase("train"):
            nvml.energy_mj[0] += 200_000
            nvml.energy_mj[1] += 100_000
            fake_clock.t_s = 1.0
        record = acct.close_round(0)
    assert record["joules"]["train"] == pytest.approx(300.0)
    assert record["source"] == "nvml" and record["measured"] is True and record["label"] == "measured"
    assert "GPU 0 GPU-A, GPU 1 GPU-B" in record["detail"]


def test_no_driver_is_unavailable() -> None:
    nvml = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(MeterUnavailable, match="NVML cannot start"):
        NvmlMeter(nvml=nvml)


def test_real_bindings_without_driver_fail_cleanly() -> None:
    """The installed nvidia-ml-py on this GPU-less machine: a clean MeterUnavailable, no crash."""
    with pytest.raises(MeterUnavailable, match="NVML"):
        NvmlMeter()


def test_gpu_index_out_of_range_names_the_count() -> None:
    nvml = FakeNvml(["GPU-A"])
    with pytest.raises(MeterUnavailable, match=r"gpu_index=3 but NVML sees 1 GPU"):
        NvmlMeter(3, nvml=nvml)
    assert nvml.shutdowns == 1  # released on the way out


def test_pre_volta_gpu_without_energy_counter() -> None:
    nvml = FakeNvml(["Tesla P100", "NVIDIA A100"], unsupported={0})
    with pytest.raises(MeterUnavailable, match=r"GPU 0 \(Tesla P100\) has no total-energy counter"):
        NvmlMeter(nvml=nvml)
    with NvmlMeter(1, nvml=nvml) as meter:  # the newer GPU alone works
        assert meter.gpu_indices == [1]


def test_bad_gpu_index_argument() -> None:
    with pytest.raises(ValueError, match="gpu_index=-1"):
        NvmlMeter(-1, nvml=FakeNvml(["GPU-A"]))
