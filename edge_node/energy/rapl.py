"""Linux powercap RAPL: CPU package and DRAM energy counters from sysfs.

Layout (kernel ``Documentation/power/powercap/powercap.rst``)::

    /sys/class/powercap/intel-rapl:0/name                  "package-0"
    /sys/class/powercap/intel-rapl:0/energy_uj             counter, microjoules
    /sys/class/powercap/intel-rapl:0/max_energy_range_uj   the counter wraps to 0 after this
    /sys/class/powercap/intel-rapl:0:0/name                "core"   (part of the package: skipped)
    /sys/class/powercap/intel-rapl:0:2/name                "dram"   (outside the package: counted)
    /sys/class/powercap/intel-rapl:1/name                  "psys"   (whole SoC on laptops: skipped,
                                                                     it double-counts the package)

AMD Zen CPUs expose their package counter under the same ``intel-rapl`` names. The
``intel-rapl-mmio:*`` zones duplicate the MSR ones and are ignored. Since Linux 5.10
(CVE-2020-8694) ``energy_uj`` is readable by root only, hence the permission hint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from edge_node.energy.base import Clock, CounterMeter
from edge_node.errors import MeterUnavailable

POWERCAP_DIR = Path("sys/class/powercap")
DEFAULT_POLL_INTERVAL_S = 10.0  # a 262 kJ counter at 400 W wraps in ~11 min: poll well inside that


@dataclass(frozen=True)
class RaplZone:
    """One counted RAPL domain: its sysfs directory, name and wrap point."""

    path: Path
    name: str
    max_energy_range_uj: int

    @property
    def energy_file(self) -> Path:
        return self.path / "energy_uj"


def _permission_hint(path: Path) -> str:
    return (
        f"permission denied on {path}; run as root or `chmod a+r {path}` "
        "(resets at boot), or add a udev rule such as "
        '`SUBSYSTEM=="powercap", ACTION=="add", RUN+="/bin/chmod a+r /sys%p/energy_uj"`'
    )


def _read_int(path: Path) -> int:
    """Read one integer sysfs file; permission problems and garbage become MeterUnavailable."""
    try:
        text = path.read_text()
    except PermissionError as exc:
        raise MeterUnavailable(_permission_hint(path)) from exc
    except OSError as exc:
        raise MeterUnavailable(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return int(text.strip())
    except ValueError as exc:
        raise MeterUnavailable(f"{path} does not hold an integer: {text.strip()[:40]!r}") from exc


def find_rapl_zones(sysfs_root: Path = Path("/")) -> list[RaplZone]:
    """The package-* and dram zones under ``<sysfs_root>/sys/class/powercap``.

    Raises:
        MeterUnavailable: no powercap directory, no such zone, or a zone's files are unreadable.
    """
    base = sysfs_root / POWERCAP_DIR
    if not base.is_dir():
        raise MeterUnavailable(
            f"{base} does not exist (not Linux with the intel_rapl driver, or a container without /sys); "
            "try `modprobe intel_rapl_msr`"
        )
    zones = []
    for path in sorted(base.glob("intel-rapl:*")):
        try:
            name = (path / "name").read_text().strip()
        except OSError:
            continue
        if not (name.startswith("package") or name == "dram"):
            continue
        zones.append(RaplZone(path, name, _read_int(path / "max_energy_range_uj")))
    if not zones:
        raise MeterUnavailable(f"no RAPL package or dram zone under {base}")
    return zones


class RaplMeter(CounterMeter):
    """Sum of RAPL package and DRAM counters, with wrap handling at ``max_energy_range_uj``.

    A counter that reads lower than last time has wrapped once: the delta is
    ``now + max_energy_range_uj - last``. That is only right when reads come more often than one
    wrap, so a daemon thread reads the counters every ``poll_interval_s`` between phase boundaries.
    """

    source = "rapl"

    def __init__(
        self,
        sysfs_root: Path = Path("/"),
        *,
        clock: Clock = time.monotonic,
        poll_interval_s: float | None = DEFAULT_POLL_INTERVAL_S,
    ) -> None:
        self.zones = find_rapl_zones(sysfs_root)
        self.detail = "RAPL " + " + ".join(f"{z.name} ({z.path.name})" for z in self.zones) + " (CPU and DRAM only)"
        self._last_uj: dict[Path, int] = {}
        self._total_uj = 0
        super().__init__(clock=clock, poll_interval_s=poll_interval_s)

    def _read_counter_j(self) -> float:
        for zone in self.zones:
            now_uj = _read_int(zone.energy_file)
            last_uj = self._last_uj.get(zone.path)
            if last_uj is not None:
                delta_uj = now_uj - last_uj
                if delta_uj < 0:  # wrapped past max_energy_range_uj
                    delta_uj += zone.max_energy_range_uj
                self._total_uj += delta_uj
            self._last_uj[zone.path] = now_uj
        return self._total_uj / 1e6
