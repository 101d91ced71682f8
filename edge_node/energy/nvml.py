"""NVIDIA NVML total-energy counter (desktop and data-centre GPUs, Volta and newer).

``nvmlDeviceGetTotalEnergyConsumption`` returns the millijoules the board has used since the
driver was loaded, a 64-bit counter that does not wrap in practice. It counts the GPU board only,
not the host CPU. Jetson modules have no NVML; they use :mod:`edge_node.energy.jetson`.
The bindings are the ``nvidia-ml-py`` package (import name ``pynvml``), which loads
``libnvidia-ml.so`` at ``nvmlInit`` and raises ``NVMLError`` when no driver is present.
"""

from __future__ import annotations

import contextlib
import time
from types import ModuleType
from typing import Any

from edge_node.energy.base import Clock, CounterMeter
from edge_node.errors import MeterUnavailable


def _load_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise MeterUnavailable("the nvidia-ml-py package is not installed (`pip install nvidia-ml-py`)") from exc
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlMeter(CounterMeter):
    """Sum of NVML total-energy counters of one GPU (``gpu_index``) or all GPUs (None).

    Args:
        gpu_index: NVML's index (PCI bus order; CUDA's order differs unless
            ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), or None for every GPU NVML sees.
        nvml: the bindings module; tests pass a stand-in with the same functions.
    """

    source = "nvml"
    # nvmlDeviceGetTotalEnergyConsumption took 3.7-3.8 ms a call on an H100 and an H200 (404 reads, 1.5 s of an
    # 11 s simulated round): boundaries within 5 ms of the last read share it.
    read_cost_s = 0.005

    def __init__(self, gpu_index: int | None = None, *, nvml: Any | None = None, clock: Clock = time.monotonic) -> None:
        if gpu_index is not None and (isinstance(gpu_index, bool) or not isinstance(gpu_index, int) or gpu_index < 0):
            raise ValueError(f"gpu_index={gpu_index!r} must be a non-negative integer or None")
        self._nvml = nvml if nvml is not None else _load_pynvml()
        error = self._nvml.NVMLError
        try:
            self._nvml.nvmlInit()
        except error as exc:
            raise MeterUnavailable(f"NVML cannot start: {exc} (no NVIDIA driver or GPU here?)") from exc
        self._initialised = True
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
            if count == 0:
                raise MeterUnavailable("NVML sees no GPU")
            if gpu_index is not None and gpu_index >= count:
                raise MeterUnavailable(f"gpu_index={gpu_index} but NVML sees {count} GPU(s) (0..{count - 1})")
            indices = [gpu_index] if gpu_index is not None else list(range(count))
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
            names = [_text(self._nvml.nvmlDeviceGetName(h)) for h in self._handles]
            for index, handle, name in zip(indices, self._handles, names, strict=True):
                try:
                    self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
                except error as exc:
                    raise MeterUnavailable(
                        f"GPU {index} ({name}) has no total-energy counter: {exc} (needs Volta or newer)"
                    ) from exc
        except error as exc:
            self._shutdown()
            raise MeterUnavailable(f"NVML query failed: {exc}") from exc
        except MeterUnavailable:
            self._shutdown()
            raise
        self.gpu_indices = indices
        self.detail = (
            "NVML total energy of "
            + ", ".join(f"GPU {i} {n}" for i, n in zip(indices, names, strict=True))
            + " (GPU board only)"
        )
        super().__init__(clock=clock)

    def _read_counter_j(self) -> float:
        try:
            total_mj = sum(int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self._handles)
        except self._nvml.NVMLError as exc:
            raise MeterUnavailable(f"NVML energy read failed: {exc}") from exc
        return total_mj / 1000.0

    def _shutdown(self) -> None:
        if getattr(self, "_initialised", False):
            self._initialised = False
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def _close_backend(self) -> None:
        self._shutdown()
