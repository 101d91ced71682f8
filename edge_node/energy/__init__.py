"""Energy measured, not guessed: meters, per-phase accounting, the per-round JSONL log, reports.

Backends (``open_meter``): NVML GPU energy counter, Linux RAPL, Jetson INA3221, Raspberry Pi 5
PMIC, and an explicit CPU-time estimate that is labelled ``estimated`` wherever it appears.
``modelled_energy`` gives the DA-DPFL-style FLOPs-and-bytes cost, labelled ``modelled``.

Typical use (simulation or daemon)::

    meter = open_meter("auto")
    with EnergyAccountant(meter, run_dir / "energy.jsonl") as acct:
        for r in range(rounds):
            with acct.phase("train"):
                ...
            acct.close_round(r, modelled=modelled_energy(flops, sent, received).to_dict())
"""

from edge_node.energy.accounting import PHASES, EnergyAccountant
from edge_node.energy.base import CounterMeter, EnergySample, Meter, MeterReading, PowerMeter
from edge_node.energy.detect import AUTO_ORDER, BACKENDS, open_meter
from edge_node.energy.estimate import DEFAULT_WATTS_PER_CORE, EstimateMeter
from edge_node.energy.jetson import JetsonMeter, find_jetson_rails
from edge_node.energy.modelled import DEFAULT_CONSTANTS, DeviceConstants, ModelledEnergy, modelled_energy
from edge_node.energy.nvml import NvmlMeter
from edge_node.energy.rapl import RaplMeter, find_rapl_zones
from edge_node.energy.report import LOG_NAME, EnergyLog, format_summary, load_energy_log, plot_energy, summarize
from edge_node.energy.rpi import RpiPmicMeter, parse_pmic_read_adc

__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "DEFAULT_CONSTANTS",
    "DEFAULT_WATTS_PER_CORE",
    "LOG_NAME",
    "PHASES",
    "CounterMeter",
    "DeviceConstants",
    "EnergyAccountant",
    "EnergyLog",
    "EnergySample",
    "EstimateMeter",
    "JetsonMeter",
    "Meter",
    "MeterReading",
    "ModelledEnergy",
    "NvmlMeter",
    "PowerMeter",
    "RaplMeter",
    "RpiPmicMeter",
    "find_jetson_rails",
    "find_rapl_zones",
    "format_summary",
    "load_energy_log",
    "modelled_energy",
    "open_meter",
    "parse_pmic_read_adc",
    "plot_energy",
    "summarize",
]
