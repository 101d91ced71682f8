"""Link conditions of a loopback fleet: ``--link rate=10mbit,delay=20ms,loss=1%`` on every device's cable.

Each device's link is the veth pair between its namespace (``eth0``) and its port on the bridge. The
properties hold per link and direction: a packet from one device to another crosses two links (the
sender's and the receiver's), so it sees twice the delay and loses with probability ``1 - (1 - p)^2``.

With ``sch_netem`` in the kernel, one netem qdisc on each end applies rate, delay and loss. Without it
(some container and cloud kernels), rate is shaped by ``tbf`` and loss by an iptables ``statistic``
rule inside the device's namespace; delay cannot be applied then, and :class:`LinkReport` says so
(the command prints it as a warning and writes it into the fleet summary) rather than pretending.
The programs this runs (``tc`` of iproute2, and ``iptables`` for loss without netem) are checked
before they are needed: a missing one is a NetnsError naming its package (exit 3).
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass, field

from edge_node.errors import ConfigError
from edge_node.fleet.netns import BridgeNet, NetnsError, ip, run_tool

_LOGGER = logging.getLogger(__name__)

_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}
_DELAY_RE = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_DELAY_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}
_LOSS_RE = re.compile(r"^(\d+(?:\.\d+)?)%$")
MIN_RATE_BIT_S = 64_000  # below this a model pull outlasts any sensible deadline
TBF_LATENCY_MS = 200  # queueing a tbf allows before it drops (TCP backs off)
IPTABLES_COMMENT = "edge-node-loopback"
TOOL_PACKAGES = {"tc": "iproute2", "iptables": "iptables"}  # the program shaping runs -> its Debian package


@dataclass(frozen=True)
class LinkSpec:
    """What ``--link`` asked for; None = not asked."""

    rate_bit_s: int | None = None
    delay_ms: float | None = None
    loss_pct: float | None = None

    @classmethod
    def parse(cls, text: str) -> LinkSpec:
        """``rate=10mbit,delay=20ms,loss=1%`` (any subset, any order); ConfigError naming a bad part."""
        values: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.strip().partition("=")
            key, value = key.strip().lower(), value.strip().lower()
            if not sep or key not in ("rate", "delay", "loss"):
                raise ConfigError(f"--link {text!r}: {part.strip()!r} is not rate=..., delay=... or loss=...")
            if key in values:
                raise ConfigError(f"--link {text!r}: {key} is given twice")
            values[key] = value
        rate = delay = loss = None
        if "rate" in values:
            match = _RATE_RE.match(values["rate"])
            if match is None:
                raise ConfigError(f"--link rate={values['rate']!r} must be a number with bit, kbit, mbit or gbit")
            rate = int(float(match.group(1)) * _RATE_UNITS[match.group(2)])
            if rate < MIN_RATE_BIT_S:
                raise ConfigError(f"--link rate={values['rate']} is below the smallest rate, {MIN_RATE_BIT_S} bit/s")
        if "delay" in values:
            match = _DELAY_RE.match(values["delay"])
            if match is None:
                raise ConfigError(f"--link delay={values['delay']!r} must be a number with us, ms or s")
            delay = float(match.group(1)) * _DELAY_UNITS_MS[match.group(2)]
            if delay > 10_000:
                raise ConfigError(f"--link delay={values['delay']} must be at most 10 s")
        if "loss" in values:
            match = _LOSS_RE.match(values["loss"])
            if match is None or not 0 <= float(match.group(1)) < 100:
                raise ConfigError(f"--link loss={values['loss']!r} must be a percentage in [0, 100), e.g. 1%")
            loss = float(match.group(1))
        return cls(rate, delay, loss)

    def describe(self) -> dict[str, str]:
        """Each asked property as tc writes it (``{"rate": "10mbit", "delay": "20ms", "loss": "1%"}``)."""
        out = {}
        if self.rate_bit_s is not None:
            unit = next(u for u in ("gbit", "mbit", "kbit", "bit") if self.rate_bit_s % _RATE_UNITS[u] == 0)
            out["rate"] = f"{self.rate_bit_s // _RATE_UNITS[unit]}{unit}"
        if self.delay_ms is not None:
            out["delay"] = f"{self.delay_ms:g}ms"
        if self.loss_pct is not None:
            out["loss"] = f"{self.loss_pct:g}%"
        return out


@dataclass
class LinkReport:
    """How each asked property was applied (``{"rate": "tbf"}``), and why the others were not."""

    asked: dict[str, str] = field(default_factory=dict)
    applied: dict[str, str] = field(default_factory=dict)
    not_applied: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, dict[str, str]]:
        return {"asked": dict(self.asked), "applied": dict(self.applied), "not_applied": dict(self.not_applied)}

    def warnings(self) -> list[str]:
        """One line per property that was asked for and not applied."""
        return [f"--link {name}={self.asked[name]} not applied: {why}" for name, why in self.not_applied.items()]


def require_tool(tool: str, needed_by: str) -> None:
    """NetnsError (exit 3) naming the package to install when ``tool`` is not on PATH.

    Checked before the first use, so that a missing program is one clear line rather than a half-shaped
    fleet or a "No such file" from deep inside ``ip netns exec``.
    """
    if shutil.which(tool) is None:
        package = TOOL_PACKAGES[tool]
        raise NetnsError(f"{needed_by} needs {tool}, which is not installed: install the package {package} "
                         f"(apt-get install {package})")  # fmt: skip


def check_link_tools(spec: LinkSpec) -> None:
    """The programs every shaping of ``spec`` runs (``tc``); iptables is checked once netem is known missing."""
    if spec.describe():
        require_tool("tc", f"--link {','.join(f'{k}={v}' for k, v in spec.describe().items())}")


def netem_available(ns: str) -> bool:
    """Whether the kernel has netem: try a netem qdisc on ``lo`` of namespace ``ns`` (ours), then remove it."""
    result = run_tool(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                      check=False)  # fmt: skip
    if result.returncode == 0:
        run_tool(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "lo", "root"], check=False)
        return True
    if "unknown" in result.stderr.lower() or "no such file" in result.stderr.lower():
        return False
    raise NetnsError(f"cannot probe for netem: {result.stderr.strip()}")


def shape_links(net: BridgeNet, spec: LinkSpec, hosts: list[int] | None = None) -> LinkReport:
    """Apply ``spec`` to hosts ``hosts`` (default: all) of ``net``; returns what was and was not applied."""
    report = LinkReport(asked=spec.describe())
    if not report.asked:
        return report
    check_link_tools(spec)
    use_netem = netem_available(net.bridge_ns)
    if not use_netem and spec.loss_pct:
        require_tool("iptables", f"--link loss={report.asked['loss']} on a kernel without netem (sch_netem)")
    for i in range(len(net.namespaces)) if hosts is None else hosts:
        _shape_one(net, i, spec, use_netem)
    if use_netem:
        report.applied = dict.fromkeys(report.asked, "netem")
    else:
        if spec.rate_bit_s is not None:
            report.applied["rate"] = "tbf"
        if spec.loss_pct is not None:
            report.applied["loss"] = "iptables statistic (random drop)"
        if spec.delay_ms is not None:
            report.not_applied["delay"] = "this kernel has no netem (sch_netem), and nothing else here delays packets"
    for line in report.warnings():
        _LOGGER.warning("%s", line)
    return report


def _shape_one(net: BridgeNet, i: int, spec: LinkSpec, use_netem: bool) -> None:
    """Both ends of host ``i``'s veth: ``eth0`` in its namespace (uplink) and its bridge port (downlink)."""
    ends = [(net.namespaces[i], net.interface), (net.bridge_ns, net.ports[i])]
    if use_netem:
        args = []
        if spec.delay_ms is not None:
            args += ["delay", f"{spec.delay_ms:g}ms"]
        if spec.rate_bit_s is not None:
            args += ["rate", f"{spec.rate_bit_s}bit"]
        if spec.loss_pct is not None:
            args += ["loss", f"{spec.loss_pct:g}%"]
        for ns, dev in ends:
            run_tool(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "netem", *args,
                      "limit", "100000"])  # fmt: skip
        return
    if spec.rate_bit_s is not None:
        rate_bytes = spec.rate_bit_s / 8
        burst = max(int(rate_bytes / 100), 16 * 1024)  # 10 ms at the rate, at least a few full frames
        for ns, dev in ends:
            run_tool(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                      f"{spec.rate_bit_s}bit", "burst", str(burst), "latency", f"{TBF_LATENCY_MS}ms"])  # fmt: skip
    if spec.loss_pct:
        ns, dev = net.namespaces[i], net.interface
        probability = f"{spec.loss_pct / 100:.6f}"
        for chain, direction in (("INPUT", "-i"), ("OUTPUT", "-o")):
            run_tool(["ip", "netns", "exec", ns, "iptables", "-w", "5", "-A", chain, direction, dev, "-m", "statistic",
                      "--mode", "random", "--probability", probability, "-m", "comment", "--comment",
                      IPTABLES_COMMENT, "-j", "DROP"])  # fmt: skip


def link_is_up(net: BridgeNet, i: int) -> bool:
    """Whether host ``i``'s bridge port is up (see :meth:`BridgeNet.set_link`)."""
    shown = ip("-n", net.bridge_ns, "-o", "link", "show", net.ports[i]).stdout
    return ",UP" in shown or "<UP" in shown
