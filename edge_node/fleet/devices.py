"""Device profiles of a loopback fleet: ``--devices 'pi4:3,pi5:3,orin-nano:2'`` or ``cpu=0.25,mem=1g,rate=20mbit``.

A profile is a CPU share (of one core of this machine), a memory limit and a link (rate, loss), which
the fleet enforces per node through cgroups (:mod:`edge_node.fleet.cgroups`) and the node's veth
(:mod:`edge_node.fleet.link`). Grammar of ``--devices`` (parsed once, every mistake one line):

* groups separated by ``;`` (the flag may also be repeated: each value is a group);
* a group of named profiles: ``NAME[:COUNT],NAME[:COUNT],...`` (count 1 when left out);
* a custom profile: ``key=value`` pairs, ``cpu=0.25`` (CPUs), ``mem=1g`` (k, m, g: KiB, MiB, GiB),
  ``rate=20mbit`` and ``loss=1%`` (as ``--link``), ``name=...`` and ``count=N``; any subset.

Nodes take the profiles in the order written (node0 the first). The counts must add up to ``--nodes``,
except that a single profile without a count stands for every node.

The named profiles scale the boards to this machine: CPU as one core's share in proportion to the
boards' published single-core throughput (anchored at Raspberry Pi 5 = half a core of this machine;
only the ratios come from the sources, README "Device profiles"), memory as the board's RAM, and a
link rate that is an assumption about a field deployment (all three boards have Gigabit Ethernet),
stated as such. Not modelled: caches and memory bandwidth, thermal throttling, accelerators (the
Orin's GPU), storage speed, and the OS's share of the memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from edge_node.errors import ConfigError
from edge_node.fleet.link import LinkSpec

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
_MEM_RE = re.compile(r"^(\d+(?:\.\d+)?)([kmg])$")
_MEM_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30}
_CUSTOM_KEYS = ("name", "count", "cpu", "mem", "rate", "loss")


@dataclass(frozen=True)
class DeviceProfile:
    """What one node may use; None = not limited."""

    name: str
    cpu: float | None = None  # CPUs (a share of this machine's cores)
    memory_bytes: int | None = None
    link: LinkSpec = LinkSpec()
    source: str = "custom"  # where the figures come from

    def describe(self) -> str:
        """``pi4 (cpu 0.2, mem 2g, rate 20mbit)``."""
        parts = []
        if self.cpu is not None:
            parts.append(f"cpu {self.cpu:g}")
        if self.memory_bytes is not None:
            parts.append(f"mem {format_memory(self.memory_bytes)}")
        parts += [f"{k} {v}" for k, v in self.link.describe().items()]
        return f"{self.name} ({', '.join(parts) or 'unlimited'})"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "cpu": self.cpu, "memory_bytes": self.memory_bytes,
                "link": self.link.describe(), "source": self.source, "describe": self.describe()}  # fmt: skip


# Sources (links in README "Device profiles"): Raspberry Pi 4 and 5 product briefs and the Pi 5 launch post
# ("2-3x the CPU performance of Raspberry Pi 4"); NVIDIA's Jetson Orin Nano series data sheet (6x
# Cortex-A78AE at 1.5 GHz); Arm's Cortex-A77 / A78 launch claims (about +20 % and +7 % per clock over the
# core before), so an A78AE at 1.5 GHz is about 0.8 of an A76 at 2.4 GHz per core: an estimate.
PROFILES: dict[str, DeviceProfile] = {
    "pi4": DeviceProfile("pi4", cpu=0.2, memory_bytes=2 * 2**30, link=LinkSpec(rate_bit_s=20_000_000),
                         source="Raspberry Pi 4 Model B 2 GB: 4x Cortex-A72 1.8 GHz; a Pi 5 core is 2-3x "
                                "faster (0.5 / 2.5 = 0.2); link: Wi-Fi far from the access point (assumed)"),
    "pi5": DeviceProfile("pi5", cpu=0.5, memory_bytes=4 * 2**30, link=LinkSpec(rate_bit_s=50_000_000),
                         source="Raspberry Pi 5 4 GB: 4x Cortex-A76 2.4 GHz (the anchor: half a core here); "
                                "link: Wi-Fi (assumed)"),
    "orin-nano": DeviceProfile("orin-nano", cpu=0.4, memory_bytes=4 * 2**30,
                               link=LinkSpec(rate_bit_s=100_000_000),
                               source="Jetson Orin Nano 4 GB: 6x Cortex-A78AE 1.5 GHz, about 0.8 of a Pi 5 "
                                      "core; its GPU is not modelled (CPU training); link: wired, shared "
                                      "(assumed)"),
}  # fmt: skip


def format_memory(nbytes: int) -> str:
    """``2g``, ``512m``: the largest unit that divides ``nbytes``."""
    for unit in ("g", "m", "k"):
        if nbytes % _MEM_UNITS[unit] == 0:
            return f"{nbytes // _MEM_UNITS[unit]}{unit}"
    return f"{nbytes}b"


def parse_memory(text: str) -> int:
    match = _MEM_RE.match(text.strip().lower())
    if match is None:
        raise ConfigError(f"--devices mem={text!r} must be a number with k, m or g (e.g. 512m, 1g)")
    return int(float(match.group(1)) * _MEM_UNITS[match.group(2)])


def _custom(group: str) -> tuple[DeviceProfile, int | None]:
    values: dict[str, str] = {}
    for part in group.split(","):
        key, sep, value = part.strip().partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or key not in _CUSTOM_KEYS:
            raise ConfigError(f"--devices {group!r}: {part.strip()!r} is not one of {', '.join(_CUSTOM_KEYS)} "
                              "(key=value)")  # fmt: skip
        if key in values:
            raise ConfigError(f"--devices {group!r}: {key} is given twice")
        values[key] = value
    name = values.get("name", "custom").lower()
    if not _NAME_RE.match(name):
        raise ConfigError(f"--devices name={name!r} must be lower-case letters, digits and '-' (at most 32)")
    cpu = None
    if "cpu" in values:
        try:
            cpu = float(values["cpu"])
        except ValueError:
            cpu = float("nan")
        if not 0.01 <= cpu <= 1024:
            raise ConfigError(f"--devices cpu={values['cpu']!r} must be a number of CPUs in [0.01, 1024]")
    memory = parse_memory(values["mem"]) if "mem" in values else None
    link_text = ",".join(f"{k}={values[k]}" for k in ("rate", "loss") if k in values)
    link = LinkSpec.parse(link_text) if link_text else LinkSpec()
    return DeviceProfile(name, cpu, memory, link), _count(values["count"], group) if "count" in values else None


def _count(text: str, where: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise ConfigError(f"--devices {where!r}: count {text!r} must be a whole number in 1..64")
    return int(text)


def parse_devices(text: str, nodes: int) -> list[DeviceProfile]:
    """One profile per node (node i takes element i); ConfigError (one line) for anything else."""
    entries: list[tuple[DeviceProfile, int | None]] = []
    for group in (g.strip() for g in text.split(";")):
        if not group:
            continue
        if "=" in group:
            entries.append(_custom(group))
            continue
        for item in (i.strip() for i in group.split(",")):
            name, sep, count = item.partition(":")
            name = name.strip().lower()
            if name not in PROFILES:
                raise ConfigError(f"--devices: unknown profile {name!r}; named profiles are "
                                  f"{', '.join(PROFILES)}, or give cpu=..,mem=..,rate=.. ")  # fmt: skip
            entries.append((PROFILES[name], _count(count.strip(), item) if sep else None))
    if not entries:
        raise ConfigError("--devices is empty: name profiles (pi4:2,pi5:1) or give cpu=..,mem=..,rate=..")
    if len(entries) == 1 and entries[0][1] is None:
        return [entries[0][0]] * nodes
    total = sum(1 if count is None else count for _, count in entries)
    if total != nodes:
        raise ConfigError(f"--devices {text!r} describes {total} nodes, but --nodes is {nodes}")
    return [profile for profile, count in entries for _ in range(1 if count is None else count)]


def node_link(profile: DeviceProfile, fleet_link: LinkSpec) -> LinkSpec:
    """The link of a node: ``--link`` for every node, the profile's own rate and loss where it sets them."""
    return replace(
        fleet_link,
        rate_bit_s=profile.link.rate_bit_s if profile.link.rate_bit_s is not None else fleet_link.rate_bit_s,
        loss_pct=profile.link.loss_pct if profile.link.loss_pct is not None else fleet_link.loss_pct,
    )
