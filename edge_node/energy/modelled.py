"""DA-DPFL-style modelled energy: FLOPs and bytes times per-device constants, labelled modelled.

DA-DPFL (Long, Wang, Anagnostopoulos, Bi, "Decentralized Personalized Federated Learning
based on a Conditional Sparse-to-Sparser Scheme", arXiv:2404.15943, IEEE TNNLS 2025) compares
methods by an energy cost computed from training FLOPs and transmitted model bytes rather than
by metering. This module computes that kind of figure so it can sit next to the measured one:

    joules = flops x j_per_flop + bytes_sent x j_per_byte_sent + bytes_received x j_per_byte_received

``flops`` are :mod:`edge_node.algorithm.flops`'s count (torch's ``FlopCounterMode``: matrix products
only, see there). Where that count is unknown (``None``, a model the counter cannot run), the compute
joules and the total are ``None`` too (unknown); the communication joules stay known.

It is a model, not a measurement: every result carries ``label="modelled"`` and is never added
to measured joules. The defaults describe a Jetson-Nano-class device on Wi-Fi and are
order-of-magnitude engineering assumptions, to be replaced with constants for your hardware:

* ``j_per_flop = 2e-10`` (0.2 nJ/FLOP): a Jetson Nano draws ~10 W in its 10 W mode (NVIDIA's
  power-mode table) while small-CNN training in PyTorch sustains roughly 50 GFLOP/s of its
  ~0.47 TFLOP/s FP16 / ~0.24 TFLOP/s FP32 peak: 10 W / 5e10 FLOP/s = 2e-10 J/FLOP.
* ``j_per_byte_sent = 2e-6`` and ``j_per_byte_received = 1e-6`` (about 250 and 125 nJ/bit):
  the order of the marginal Wi-Fi uplink/downlink power per Mbit/s that Huang et al. measured
  on smartphones ("A Close Examination of Performance and Power Characteristics of 4G LTE
  Networks", MobiSys 2012): a few hundred mW per Mbit/s up, roughly half of that down.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

MODELLED = "modelled"


def _check_non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name}={value!r} must be a finite number >= 0")


@dataclass(frozen=True)
class DeviceConstants:
    """Energy per unit of work for one kind of device; see the module docstring for defaults."""

    j_per_flop: float = 2e-10  # J per floating-point operation (Jetson Nano class, training)
    j_per_byte_sent: float = 2e-6  # J per byte transmitted (Wi-Fi uplink, ~250 nJ/bit)
    j_per_byte_received: float = 1e-6  # J per byte received (Wi-Fi downlink, ~125 nJ/bit)
    name: str = "jetson-nano-wifi (assumed)"

    def __post_init__(self) -> None:
        for key in ("j_per_flop", "j_per_byte_sent", "j_per_byte_received"):
            _check_non_negative(key, getattr(self, key))


@dataclass(frozen=True)
class ModelledEnergy:
    """A modelled (not measured) energy cost, split into compute, send and receive joules.

    ``flops`` and ``compute_j`` are ``None`` where the FLOPs are unknown; ``total_j`` is then ``None``.
    """

    flops: float | None
    bytes_sent: int
    bytes_received: int
    compute_j: float | None
    send_j: float
    receive_j: float
    constants: DeviceConstants = field(default_factory=DeviceConstants)
    label: str = MODELLED

    @property
    def communication_j(self) -> float:
        return self.send_j + self.receive_j

    @property
    def total_j(self) -> float | None:
        """Compute plus communication joules; ``None`` (unknown) when the FLOPs are."""
        return None if self.compute_j is None else self.compute_j + self.send_j + self.receive_j

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, e.g. ``acct.close_round(i, modelled=m.to_dict())``."""
        return {
            "label": self.label,
            "total_j": self.total_j,
            "compute_j": self.compute_j,
            "communication_j": self.communication_j,
            "send_j": self.send_j,
            "receive_j": self.receive_j,
            "flops": self.flops,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "constants": asdict(self.constants),
        }

    def __add__(self, other: ModelledEnergy) -> ModelledEnergy:
        """Sum two costs (e.g. over clients or rounds); the constants must be the same."""
        if not isinstance(other, ModelledEnergy):
            return NotImplemented
        if other.constants != self.constants:
            raise ValueError("cannot add modelled energies computed with different device constants")
        return ModelledEnergy(
            None if self.flops is None or other.flops is None else self.flops + other.flops,
            self.bytes_sent + other.bytes_sent,
            self.bytes_received + other.bytes_received,
            None if self.compute_j is None or other.compute_j is None else self.compute_j + other.compute_j,
            self.send_j + other.send_j,
            self.receive_j + other.receive_j,
            self.constants,
        )


DEFAULT_CONSTANTS = DeviceConstants()


def modelled_energy(
    flops: float | None, bytes_sent: int, bytes_received: int, constants: DeviceConstants = DEFAULT_CONSTANTS
) -> ModelledEnergy:
    """Modelled joules for ``flops`` of compute and the given bytes on the wire (label "modelled");
    ``flops=None`` (unknown) gives unknown compute and total joules."""
    if flops is not None:
        _check_non_negative("flops", flops)
    _check_non_negative("bytes_sent", bytes_sent)
    _check_non_negative("bytes_received", bytes_received)
    return ModelledEnergy(
        flops=None if flops is None else float(flops),
        bytes_sent=int(bytes_sent),
        bytes_received=int(bytes_received),
        compute_j=None if flops is None else flops * constants.j_per_flop,
        send_j=bytes_sent * constants.j_per_byte_sent,
        receive_j=bytes_received * constants.j_per_byte_received,
        constants=constants,
    )
