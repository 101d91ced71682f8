"""A loopback fleet's life: network, TLS material, N daemons, and the clean-up of all of it.

    with Fleet(config) as fleet:          # stale leftovers removed; namespaces, links and daemons made
        fleet.start()                     # every node's `edge-node start`
        while not fleet.finished():
            events = fleet.poll()         # new round records and exits
    # every daemon stopped (SIGTERM, bounded wait, SIGKILL by pid), every namespace deleted

On 127.0.0.1 the nodes know each other as static peers ``node<j>@127.0.0.1:PORT``. With ``netns``
each runs in its own namespace on a bridge in another one, listens on its address there and finds the
others over mDNS on its ``eth0`` (a lock-step fleet lists them as static peers instead: lock-step needs
the whole fleet in client-index order). Bridges, veths, qdiscs and iptables rules all live inside the
fleet's namespaces, so deleting those removes everything; nothing is added to the machine's own network.

With device profiles (``devices``) each node's daemon also runs in a cgroup of its own that limits its CPU
and memory (:mod:`edge_node.fleet.cgroups`), and its link is shaped to its profile's rate and loss; the
groups are removed with the fleet, and any start removes the groups of killed fleets.

``OUTPUT/fleet-run.json`` names the supervisor, its daemons and namespaces while the fleet runs; a
later start on the same output directory ends what a killed supervisor left there, and any start
removes namespaces of killed fleets (:func:`edge_node.fleet.netns.cleanup_stale`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_node.errors import ConfigError
from edge_node.fleet import cgroups as _cgroups
from edge_node.fleet import netns as _netns
from edge_node.fleet.config import CONFIG_FILE, NETNS_PORT, FleetConfig, settings_to_flags
from edge_node.fleet.daemons import STOP_GRACE_S, DaemonProcess, end_leftover, pid_alive, python_command
from edge_node.fleet.devices import format_memory, node_link
from edge_node.fleet.link import LinkReport, LinkSpec, check_link_tools, shape_links
from edge_node.storage import atomic_write_text

_LOGGER = logging.getLogger(__name__)

RUN_FILE = "fleet-run.json"
TLS_DIR = "tls"
# What a --fresh start removes besides the node state directories (the summary's files are added by it).
METRICS_TARGETS = "metrics-targets.json"  # Prometheus file_sd: the nodes' metrics endpoints (--metrics)
METRICS_PORT = 9478  # each node's metrics port inside its namespace (--netns --metrics)
FLEET_FILES = (CONFIG_FILE, RUN_FILE, METRICS_TARGETS)


@dataclass(frozen=True)
class Event:
    """Something a poll saw: a node's new round record, or its exit."""

    node_id: str
    kind: str  # "record" or "exit"
    record: dict[str, Any] | None = None
    code: int | None = None


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (bound and released; a tiny race is accepted)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _write_private(path: Path, data: bytes) -> None:
    """A key file readable by its owner only (the daemon refuses group/other-readable keys)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def issue_tls_material(tls_dir: Path, fleet: str, node_ids: list[str]) -> None:
    """A fleet CA in ``tls_dir`` (kept when there) and a certificate per node id that lacks one."""
    from edge_node.net.tls import create_ca, issue_certificate

    tls_dir.mkdir(parents=True, exist_ok=True)
    ca_pem, ca_key = tls_dir / "ca.pem", tls_dir / "ca.key"
    if not (ca_pem.exists() and ca_key.exists()):
        cert, key = create_ca(fleet)
        _write_private(ca_key, key)
        ca_pem.write_bytes(cert)
    for node_id in node_ids:
        if not (tls_dir / f"{node_id}.pem").exists() or not (tls_dir / f"{node_id}.key").exists():
            cert, key = issue_certificate(ca_pem.read_bytes(), ca_key.read_bytes(), node_id)
            _write_private(tls_dir / f"{node_id}.key", key)
            (tls_dir / f"{node_id}.pem").write_bytes(cert)


def shared_host_limits(nodes: int) -> dict[str, float]:
    """The peer service's per-host caps for a fleet whose peers all connect from 127.0.0.1.

    The caps bound what one host may hold (``server_max_calls_per_host`` 8, ``..._connections_per_host``
    32) and start (``server_host_rate``, 50 calls/s); on one machine every peer is that one host, so a
    fleet of more than a few nodes would be refused by its own members. Scaled to the fleet, never beyond
    the service's totals (64 calls, 512 connections); the rate at twice what the fleet's waiting nodes
    ask (5 Hellos a second to each node, ``node/barrier.POLL_S``), pulls and static Hellos within it.
    """
    from edge_node.net.server import ServerLimits  # the node's modules, only when a fleet starts
    from edge_node.node.config import NodeConfig

    defaults, total_calls = NodeConfig(), ServerLimits().max_concurrent_rpcs
    return {
        "server_max_calls_per_host": min(total_calls, max(defaults.server_max_calls_per_host, 2 * nodes)),
        "server_max_connections_per_host": min(
            defaults.server_max_connections, max(defaults.server_max_connections_per_host, 4 * nodes)
        ),
        "server_host_rate": max(defaults.server_host_rate, 10.0 * nodes),
    }


class Fleet:
    """N ``edge-node start`` daemons on this machine; a context manager that always cleans up."""

    def __init__(self, config: FleetConfig, *, fresh: bool = False, kind: str = "fleet",
                 poisoned_launcher: Sequence[str] = ()) -> None:  # fmt: skip
        """``poisoned_launcher``: the command that starts a poisoned fleet's node in place of ``python -m edge_node``
        (the CLI's internal entry, ``edge_node.cli.loopback.POISONED_LAUNCHER``); a fleet with attackers needs it."""
        if config.attackers and not poisoned_launcher:
            raise ConfigError("a fleet with attackers is started by edge-node loopback (it has no poisoned launcher)")
        self.poisoned_launcher = list(poisoned_launcher)
        self.config = config
        self.fresh = fresh
        self.kind = kind
        self.output = config.output
        self.net: _netns.BridgeNet | None = None
        self.link_report = LinkReport()
        self.profiles = config.profiles  # one per node, or none
        self.node_links: list[LinkReport] = []  # with profiles: how each node's link was shaped
        self.groups: list[_cgroups.DeviceGroup | None] = []  # with profiles: each node's cgroup (None: unlimited)
        self.hierarchy: _cgroups.Hierarchy | None = None  # where the groups are, when any node is limited
        self.daemons: list[DaemonProcess] = []
        self.endpoints: list[tuple[str, int]] = []  # (host, port) of each node
        self.metrics_endpoints: list[str] = []  # HOST:PORT of each node's metrics (--metrics)
        self.started_unix: float | None = None
        self.stopped_unix: float | None = None
        self.resumed = False
        self._stack = ExitStack()
        self._exits_seen: set[tuple[int, int]] = set()  # (daemon, its start count) whose exit was reported
        self._run_file_written = False  # only a run file this fleet wrote is removed by it
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(config.threads)}

    # -- set-up -------------------------------------------------------------------------------------
    def __enter__(self) -> Fleet:
        try:
            self.open()
        except BaseException:
            self.close(grace_s=0.0)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # A second Ctrl-C arrives as KeyboardInterrupt: then the daemons are killed without waiting.
        self.close(grace_s=0.0 if exc_type is KeyboardInterrupt else STOP_GRACE_S)

    def open(self) -> None:
        """Clean up leftovers, check the output directory, make the network and the daemons (not started)."""
        config = self.config
        fleet_link = LinkSpec.parse(config.link) if config.link is not None else LinkSpec()
        hierarchy = None
        if any(p.cpu is not None or p.memory_bytes is not None for p in self.profiles):
            hierarchy = self.hierarchy = _cgroups.check_available()
        if config.netns:
            _netns.check_available()
            for spec in [fleet_link, *(node_link(p, fleet_link) for p in self.profiles)]:
                check_link_tools(spec)  # before anything is made
            _netns.cleanup_stale(self.kind)
        if os.geteuid() == 0:
            _cgroups.cleanup_stale(hierarchy or _cgroups.system_hierarchy(), self.kind)
        self._end_leftovers()
        self._prepare_output()
        if config.tls:
            issue_tls_material(self.output / TLS_DIR, config.fleet, config.node_ids)
        if config.netns:
            self.net = self._stack.enter_context(
                _netns.bridge_with_namespaces(config.nodes, subnet=config.subnet, kind=self.kind, tag="node")
            )
            self.endpoints = [(address, NETNS_PORT) for address in self.net.addresses]
            if self.profiles:
                self._shape_device_links(fleet_link)
            elif config.link is not None:
                self.link_report = shape_links(self.net, fleet_link)
        else:
            self.endpoints = [("127.0.0.1", port) for port in free_ports(config.nodes)]
        fastest = max((p.cpu for p in self.profiles if p.cpu is not None), default=1.0)
        self.groups = [
            None if hierarchy is None or (p.cpu is None and p.memory_bytes is None) else self._stack.enter_context(
                _cgroups.device_group(hierarchy, config.node_ids[i], kind=self.kind, cpu=p.cpu,
                                      memory_bytes=p.memory_bytes, weight=(p.cpu or fastest) / fastest))
            for i, p in enumerate(self.profiles)
        ]  # fmt: skip
        if config.metrics:
            hosts = [host for host, _ in self.endpoints]
            ports = [METRICS_PORT] * config.nodes if self.net is not None else free_ports(config.nodes)
            self.metrics_endpoints = [f"{h}:{p}" for h, p in zip(hosts, ports, strict=True)]
            targets = [{"targets": self.metrics_endpoints, "labels": {"fleet": config.fleet}}]
            atomic_write_text(self.output / METRICS_TARGETS, json.dumps(targets, indent=1) + "\n")
        self.daemons = [self.make_daemon(i) for i in range(config.nodes)]
        self._write_run_file()

    def _shape_device_links(self, fleet_link: LinkSpec) -> None:
        """Each node's link to its profile (``--link`` where the profile sets nothing); one report per node,
        and the fleet's report says how ``--link``'s own properties were applied."""
        assert self.net is not None
        self.node_links = [shape_links(self.net, node_link(p, fleet_link), hosts=[i])
                           for i, p in enumerate(self.profiles)]  # fmt: skip
        asked = fleet_link.describe()
        report = LinkReport(asked=asked)
        for node in self.node_links:
            report.applied.update({k: v for k, v in node.applied.items() if k in asked})
            report.not_applied.update({k: v for k, v in node.not_applied.items() if k in asked})
        self.link_report = report

    def link_warnings(self) -> list[str]:
        """One line per link property asked for (by ``--link`` or a profile) and not applied."""
        lines = self.link_report.warnings()
        for node_id, report in zip(self.config.node_ids, self.node_links, strict=False):
            lines += [f"{node_id}: {line}" for line in report.warnings() if line not in lines]
        return lines

    def device_info(self) -> dict[str, dict[str, Any]]:
        """Per node: its profile, how its link was shaped, its cgroup and how often the OOM killer struck."""
        info = {}
        for i, profile in enumerate(self.profiles):
            group = self.groups[i] if i < len(self.groups) else None
            info[self.config.node_ids[i]] = {
                "profile": profile.to_json(),
                "link": self.node_links[i].to_json() if i < len(self.node_links) else None,
                "cgroup": [str(d) for d in group.dirs] if group is not None else [],
                "oom_kills": group.oom_kills() if group is not None else 0,
            }
        return info

    def oom_note(self, node_id: str) -> str:
        """`` (by the OOM killer, under its memory limit of 1g)`` when the kernel killed that node for memory."""
        i = self.config.node_ids.index(node_id) if node_id in self.config.node_ids else -1
        group = self.groups[i] if 0 <= i < len(self.groups) else None
        if group is None or not group.oom_kills():
            return ""
        limit = self.profiles[i].memory_bytes
        return f" (by the OOM killer, under its memory limit of {format_memory(limit) if limit else '?'})"

    def _end_leftovers(self) -> None:
        """End daemons (and namespaces) a killed supervisor left in this output directory."""
        path = self.output / RUN_FILE
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        owner = int(run.get("pid", 0))
        if owner and owner != os.getpid() and pid_alive(owner):
            raise ConfigError(
                f"{self.output} is in use by a running fleet (pid {owner}); stop it or use another --output"
            )
        ended = [n["node_id"] for n in run.get("nodes", []) if n.get("pid")
                 and end_leftover(int(n["pid"]), Path(n["state_dir"]))]  # fmt: skip
        for ns in run.get("namespaces", []):
            if ns in _netns.list_namespaces() and _netns.creator_pid(ns) == owner:
                _netns.delete_namespace(ns)
        if ended:
            _LOGGER.warning("ended %s, left running by a killed fleet (pid %d)", ", ".join(ended), owner)
        path.unlink(missing_ok=True)

    def _prepare_output(self) -> None:
        config = self.config
        out = self.output
        saved_path = out / CONFIG_FILE
        if self.fresh:
            for node_id in config.node_ids:
                shutil.rmtree(out / node_id, ignore_errors=True)
                (out / f"{node_id}.log").unlink(missing_ok=True)
            shutil.rmtree(out / TLS_DIR, ignore_errors=True)
            for name in FLEET_FILES:
                (out / name).unlink(missing_ok=True)
        elif saved_path.exists():
            try:
                saved = json.loads(saved_path.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{saved_path} is unreadable ({exc}); pass --fresh to start over") from None
            diff = config.differences(saved)
            if diff:
                raise ConfigError(
                    f"{out} holds a fleet with other settings ({', '.join(diff)}); use another --output or --fresh"
                )
            self.resumed = True
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(saved_path, json.dumps(config.to_json(), indent=2) + "\n")

    def node_flags(self, i: int, *, node_id: str | None = None, tls_name: str | None = None,
                   host: int | None = None, overrides: dict[str, Any] | None = None) -> list[str]:  # fmt: skip
        """``edge-node start`` flags of node ``i`` (or of a node ``node_id`` with node ``i``'s data slice
        on host ``host``'s address, certificate ``tls_name``: tests add rogue and foreign nodes so)."""
        config = self.config
        settings = config.node_settings(i)
        node_id = node_id or config.node_ids[i]
        settings["node_id"] = node_id
        settings["state_dir"] = self.output / node_id
        where = i if host is None else host
        if self.net is not None:
            address = self.net.addresses[where]
            settings["listen"] = f"{address}:{NETNS_PORT}"
        else:
            address, port = self.endpoints[i] if host is None else ("127.0.0.1", free_ports(1)[0])
            settings["listen"] = f"{address}:{port}"
            settings.update(shared_host_limits(config.nodes))
        if self.net is not None and not config.lockstep:
            settings["discovery"] = "mdns"
            settings["interfaces"] = [self.net.addresses[where]]
        else:
            settings["discovery"] = "static"
            settings["peers"] = [f"{nid}@{h}:{p}" for nid, (h, p) in zip(config.node_ids, self.endpoints, strict=True)]
        if config.tls:
            tls_dir = self.output / TLS_DIR
            name = tls_name or node_id
            settings.update(
                tls_ca=tls_dir / "ca.pem", tls_cert=tls_dir / f"{name}.pem", tls_key=tls_dir / f"{name}.key"
            )
        else:
            settings["insecure"] = True
        if self.metrics_endpoints and host is None:
            settings["metrics_listen"] = self.metrics_endpoints[i]
        settings.update(overrides or {})
        return [*settings_to_flags(settings), *config.daemon_args]

    def make_daemon(self, i: int, *, node_id: str | None = None, host: int | None = None,
                    flags: list[str] | None = None) -> DaemonProcess:  # fmt: skip
        """The daemon of node ``i`` (not started); ``flags`` replace :meth:`node_flags`'s."""
        node_id = node_id or self.config.node_ids[i]
        config = self.config
        command = python_command()
        if config.attackers:  # a poisoned fleet: every node is told who attacks (the launcher hands start the attack)
            assert config.attack is not None  # FleetConfig refuses attackers without an attack
            command = [*self.poisoned_launcher, ",".join(config.attacker_ids), config.attack]
        argv = [*command, "start", *(flags if flags is not None else self.node_flags(i, host=host))]
        namespace = None
        if self.net is not None:
            namespace = self.net.namespaces[i if host is None else host]
        group = self.groups[i] if i < len(self.groups) else None
        if group is not None:
            argv = group.wrap(argv, namespace, self.hierarchy)
        elif namespace is not None:
            argv = ["ip", "netns", "exec", namespace, *argv]
        return DaemonProcess(
            node_id=node_id, state_dir=self.output / node_id, argv=argv, log_path=self.output / f"{node_id}.log",
            namespace=namespace, env=self._env,
        )  # fmt: skip

    def add_host(self, tag: str) -> int:
        """One more namespace on the fleet's bridge (``netns`` only); its index in ``net.namespaces``."""
        if self.net is None:
            raise ConfigError("add_host needs a --netns fleet")
        i = self.net.add_host(tag)
        self._write_run_file()
        return i

    # -- running ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every daemon that is not running."""
        self.started_unix = self.started_unix or time.time()
        for daemon in self.daemons:
            if not daemon.running:
                daemon.start()
        self._write_run_file()

    def start_extra(self, daemon: DaemonProcess) -> DaemonProcess:
        """Start a daemon beyond the fleet's own (tests' foreign nodes); it is stopped with the fleet."""
        self.daemons.append(daemon)
        daemon.start()
        self._write_run_file()
        return daemon

    def restart(self, daemon: DaemonProcess) -> None:
        """Start ``daemon`` again (after it exited or was killed) with the same command and state directory."""
        daemon.wait(STOP_GRACE_S)
        daemon.start()
        self._write_run_file()

    def poll(self) -> list[Event]:
        """New round records of every daemon, and the exits of daemons that ended since the last poll."""
        events: list[Event] = []
        for daemon in self.daemons:
            events += [Event(daemon.node_id, "record", record=r) for r in daemon.read_new_records()]
            code = daemon.returncode
            if code is not None and (id(daemon), daemon.starts) not in self._exits_seen:
                self._exits_seen.add((id(daemon), daemon.starts))
                daemon.reaped()
                events.append(Event(daemon.node_id, "exit", code=code))
        return events

    def own_daemons(self) -> list[DaemonProcess]:
        """The fleet's N nodes (not the extra ones tests add)."""
        return self.daemons[: self.config.nodes]

    def finished(self) -> bool:
        """Every node of the fleet has exited."""
        return all(d.proc is not None and not d.running for d in self.own_daemons())

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to every running daemon at once, a shared bounded wait, then SIGKILL by pid."""
        running = [d for d in self.daemons if d.running]
        for daemon in running:
            daemon.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for daemon in running:
            if daemon.wait(max(0.0, deadline - time.monotonic())) is None:
                _LOGGER.warning("%s did not stop within %.0f s of SIGTERM; killing pid %s", daemon.node_id,
                                grace_s, daemon.pid)  # fmt: skip
                daemon.kill()
        for daemon in self.daemons:
            daemon.stop(0)
        self.stopped_unix = time.time()

    def close(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every daemon, delete every namespace (with its bridge, veths, qdiscs, rules); idempotent."""
        try:
            self.stop(grace_s)
        finally:
            try:
                self._stack.close()
            finally:
                self.net = None
                if self._run_file_written:
                    (self.output / RUN_FILE).unlink(missing_ok=True)
                    self._run_file_written = False

    def _write_run_file(self) -> None:
        run = {
            "pid": os.getpid(),
            "started_unix": self.started_unix,
            "nodes": [{"node_id": d.node_id, "pid": d.pid, "state_dir": str(d.state_dir)} for d in self.daemons],
            "namespaces": self.net.names if self.net is not None else [],
            "cgroups": [str(d) for g in self.groups if g is not None for d in g.dirs],
        }
        atomic_write_text(self.output / RUN_FILE, json.dumps(run, indent=1) + "\n")
        self._run_file_written = True
