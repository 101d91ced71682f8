"""mDNS discovery with real zeroconf traffic, inside private network namespaces made by each test.

Every node is its own process (``ip netns exec NS python -c <driver>``), so a node can be killed with
SIGKILL like a crashed device. No packet leaves the namespaces: nodes bind 127.0.0.1 in a namespace
whose ``lo`` has multicast on, or 10.77.0.x on veths of a private bridge.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:  # `tests.netns` is a helper module, not an installed package
    sys.path.insert(0, str(_REPO))

from edge_node.net.discovery.peer_book import CHALLENGE_S  # noqa: E402
from edge_node.protocol import PROTOCOL_VERSION  # noqa: E402
from tests.netns import NetnsProcess, bridge_with_namespaces, cleanup_stale, netns, run_in_netns  # noqa: E402

PYTHON = sys.executable
EDGE_NODE = str(Path(sys.executable).with_name("edge-node"))
FLEET = "fleet-a"
TTL_S = 3  # short, so a killed node must vanish within seconds
FIND_S = 5.0  # the promise: nodes find each other within this
START_S = 40.0  # generous bound on interpreter start-up on a busy 2-core machine (not a promise)
GOODBYE_S = CHALLENGE_S + 1.5  # a goodbye is challenged (anyone can send one), then applied unless answered
KILLED_S = TTL_S + 1.5  # record TTL, plus one sweep and scheduling slack

# The node host: imports discovery once (slow: the package pulls in torch), then forks one child per
# node; the child enters its namespace (setns) and runs MdnsDiscovery from a JSON config. Every child
# prints a JSON line {"node", "event", "peers"} with its whole table on each change (one write per
# line, atomic on a pipe). Commands on stdin: spawn / update / stop / kill, by node id.
_HOST = r"""
import json, logging, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from tests.netns import enter_netns
from edge_node.net.discovery import MdnsDiscovery

def emit(obj):
    obj["t"] = time.monotonic()
    os.write(1, (json.dumps(obj, separators=(",", ":")) + "\n").encode())

def run_node(ns, cfg, cmd_fd):
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    try:
        enter_netns(ns)
    except OSError:
        os._exit(3)  # never run mDNS outside the test's namespace
    node_id = cfg["node_id"]
    logging.basicConfig(level=logging.DEBUG if cfg.pop("debug", False) else logging.WARNING, stream=sys.stderr,
                        format=node_id + " %(levelname)s %(name)s: %(message)s", force=True)
    try:
        d = MdnsDiscovery(**cfg)
        d.start()
    except Exception as exc:
        emit({"node": node_id, "event": "error", "error": f"{type(exc).__name__}: {exc}", "peers": []})
        os._exit(2)
    def table():
        return [{k: p.to_json()[k] for k in ("node_id", "addresses", "port", "fleet", "arch", "tier", "density",
                                              "round", "protocol_version", "endpoint")} for p in d.peers()]
    d.add_listener(lambda ev, p: emit({"node": node_id, "event": ev.value + ":" + p.name, "peers": table()}))
    emit({"node": node_id, "event": "started", "peers": table()})
    for line in os.fdopen(cmd_fd):
        cmd = json.loads(line)
        if cmd["op"] == "update":
            d.update(**cmd["args"])
        elif cmd["op"] == "stop":
            break
    emit({"node": node_id, "event": "stopping", "peers": table()})
    d.stop()
    emit({"node": node_id, "event": "stopped", "peers": []})
    os._exit(0)

children = {}
emit({"node": "", "event": "ready"})
try:
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "spawn":
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                for _, fd in children.values():
                    os.close(fd)
                try:
                    run_node(cmd["ns"], cmd["cfg"], r)
                finally:
                    os._exit(1)
            os.close(r)
            children[cmd["handle"]] = (pid, w)
        elif cmd["handle"] not in children:
            continue  # exited already
        elif cmd["op"] == "kill":
            os.kill(children[cmd["handle"]][0], signal.SIGKILL)
        else:
            os.write(children[cmd["handle"]][1], (json.dumps(cmd) + "\n").encode())
        while children:  # reap exited children, and forget them so their pids are never signalled
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            for handle, (child, fd) in list(children.items()):
                if child == pid:
                    os.close(fd)
                    del children[handle]
finally:
    for pid, _ in children.values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
"""


class NodeHost:
    """The host process; ``spawn`` forks a node into a namespace and returns its handle."""

    def __init__(self) -> None:
        self.proc = NetnsProcess(None, [PYTHON, "-c", _HOST, str(_REPO)])
        self.nodes: list[Node] = []
        if not self.proc.wait_for(lambda lines: any('"event":"ready"' in line for line in lines), START_S):
            self.proc.kill()
            raise RuntimeError(f"node host did not start:\n{self.proc.stderr_text[-3000:]}")

    def command(self, **cmd: object) -> None:
        self.proc.send(json.dumps(cmd))

    def spawn(self, ns: str, node_id: str, address: str, *, fleet: str = FLEET, **options: object) -> Node:
        config = {
            "node_id": node_id,
            "port": 7000,
            "fleet": fleet,
            "interfaces": [address],
            "ttl_s": TTL_S,
            "min_update_interval_s": 0.5,
            **options,
        }
        handle = f"{node_id}#{len(self.nodes)}-{time.monotonic_ns()}"
        self.command(op="spawn", ns=ns, cfg=config, handle=handle)
        node = Node(self, node_id, handle)
        self.nodes.append(node)
        return node

    def kill_all(self) -> None:
        for node in self.nodes:
            if not node.stopped():
                self.command(op="kill", handle=node.handle)
        self.nodes.clear()


class Node:
    """One node forked by the host; its view is the latest table it printed."""

    def __init__(self, host: NodeHost, node_id: str, handle: str) -> None:
        self.host = host
        self.node_id = node_id
        self.handle = handle
        self._tag = f'{{"node":"{node_id}",'

    def _mine(self, lines: list[str]) -> list[dict]:
        return [json.loads(line) for line in lines if line.startswith(self._tag)]

    def _table(self, lines: list[str]) -> dict[str, dict] | None:
        mine = self._mine(lines)
        return {p["node_id"]: p for p in mine[-1]["peers"]} if mine else None

    def wait_table(self, predicate: Callable[[dict[str, dict]], bool], timeout_s: float) -> bool:
        return self.host.proc.wait_for(lambda ls: (t := self._table(ls)) is not None and predicate(t), timeout_s)

    def wait_event(self, event: str, timeout_s: float) -> bool:
        return self.host.proc.wait_for(lambda ls: any(m["event"] == event for m in self._mine(ls)), timeout_s)

    def event_time(self, event: str) -> float:
        """When (monotonic clock, shared by all processes) this node first reported ``event``."""
        return next(m["t"] for m in self._mine(self.host.proc.lines) if m["event"] == event)

    def table(self) -> dict[str, dict]:
        return self._table(self.host.proc.lines) or {}

    def error(self) -> str | None:
        errors = [m["error"] for m in self._mine(self.host.proc.lines) if m["event"] == "error"]
        return errors[-1] if errors else None

    def stopped(self) -> bool:
        return any(m["event"] == "stopped" for m in self._mine(self.host.proc.lines))

    def update(self, **args: object) -> None:
        self.host.command(op="update", handle=self.handle, args=args)

    def stop(self) -> None:
        """Graceful stop: goodbye packets, then the process exits."""
        self.host.command(op="stop", handle=self.handle)

    def kill(self) -> None:
        self.host.command(op="kill", handle=self.handle)

    def log(self) -> str:
        """This node's log lines (the host's stderr, tagged with the node id)."""
        return "\n".join(line for line in list(self.host.proc.stderr_lines) if line.startswith(self.node_id + " "))

    def diagnostics(self) -> str:
        return f"{self.node_id}: table={sorted(self.table())}\n{self.log()[-2000:]}"


@pytest.fixture(scope="module", autouse=True)
def _no_stale_namespaces() -> None:
    """Remove namespaces left by an earlier run that was killed before it could clean up."""
    if os.geteuid() == 0:
        cleanup_stale()


@pytest.fixture(scope="module")
def _node_host() -> Iterator[NodeHost]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create private network namespaces")
    host = NodeHost()
    try:
        yield host
    finally:
        host.proc.kill()


@pytest.fixture
def hosts(require_root: None, _node_host: NodeHost) -> Iterator[NodeHost]:
    """The shared node host; the nodes a test spawned are killed when it ends, pass or fail."""
    try:
        yield _node_host
    finally:
        _node_host.kill_all()


def _wait_started(nodes: list[Node]) -> None:
    deadline = time.monotonic() + START_S
    for node in nodes:
        assert node.wait_event("started", max(0.1, deadline - time.monotonic())), node.diagnostics()


def _assert_all(
    nodes: list[Node], predicate: Callable[[Node, dict[str, dict]], bool], timeout_s: float, what: str, t0: float
) -> float:
    """Every node's table satisfies ``predicate`` by ``t0 + timeout_s``; returns seconds since ``t0``."""
    for node in nodes:
        remaining = max(0.0, t0 + timeout_s - time.monotonic())
        ok = node.wait_table(lambda table, n=node: predicate(n, table), remaining)
        assert ok, f"{what}: not within {timeout_s} s for {node.diagnostics()}"
    return time.monotonic() - t0


def _fleet_scenario(host: NodeHost, places: list[tuple[str, str]], alien_place: tuple[str, str]) -> dict[str, float]:
    """Nodes at ``places`` (ns, address) find each other, see TXT updates, drop goodbyes and the dead.

    A node of another fleet at ``alien_place`` runs alongside and must never be listed.
    """
    n = len(places)
    ids = [f"n{i}" for i in range(n)]
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    fleet = [host.spawn(ns, nid, addr) for (ns, addr), nid in zip(places, ids, strict=True)]
    alien = host.spawn(alien_place[0], "alien", alien_place[1], fleet="fleet-b")
    # from the start of the processes (fork), probing and announcing included
    timings["find_s"] = _assert_all(
        fleet, lambda node, t: set(t) == set(ids) - {node.node_id}, FIND_S, "find each other", t0
    )
    _wait_started([*fleet, alien])
    assert alien.table() == {}, "the other fleet's node listed fleet-a nodes"

    fleet[0].update(round=7, density=0.5, tier="t2")
    timings["update_s"] = _assert_all(
        fleet[1:],
        lambda node, t: t["n0"]["round"] == 7 and t["n0"]["density"] == 0.5 and t["n0"]["tier"] == "t2",
        3.0,
        "see the TXT update",
        time.monotonic(),
    )

    bye, remaining = fleet[-1], fleet[:-1]
    bye.stop()
    timings["goodbye_s"] = _assert_all(
        remaining, lambda node, t: bye.node_id not in t, GOODBYE_S, "drop the node that said goodbye", time.monotonic()
    )
    assert bye.wait_event("stopped", 5.0), bye.diagnostics()
    seen_gone = max(node.event_time(f"removed:{bye.node_id}") for node in remaining)
    timings["goodbye_latency_s"] = seen_gone - bye.event_time("stopping")

    if len(remaining) >= 2:
        dead, survivors = remaining[-1], remaining[:-1]
        assert all(dead.node_id in node.table() for node in survivors)
        t_kill = time.monotonic()
        dead.kill()
        timings["killed_s"] = _assert_all(
            survivors, lambda node, t: dead.node_id not in t, KILLED_S, "drop the killed node within its TTL", t_kill
        )
        assert timings["killed_s"] > 1.0, "a killed node sends no goodbye: only its TTL can remove it"
        # live peers outlast several TTLs: their records are refreshed, only the dead expire
        time.sleep(max(0.0, t0 + 2.5 * TTL_S - time.monotonic()))
        alive = {node.node_id for node in survivors}
        for node in survivors:
            assert set(node.table()) == alive - {node.node_id}, node.diagnostics()
    assert all("alien" not in node.table() for node in fleet)
    print(f"\n{n} nodes: " + ", ".join(f"{k}={v:.2f}" for k, v in timings.items()))
    return timings


@pytest.fixture
def lo_ns(require_root: None) -> Iterator[str]:
    with netns() as ns:
        yield ns


@pytest.mark.netns
@pytest.mark.parametrize("n", [2, 5])
def test_nodes_on_loopback_find_update_and_drop_each_other(hosts: NodeHost, lo_ns: str, n: int) -> None:
    _fleet_scenario(hosts, [(lo_ns, "127.0.0.1")] * n, (lo_ns, "127.0.0.1"))


@pytest.mark.netns
@pytest.mark.parametrize("n", [2, 5])
def test_nodes_on_a_bridge_find_update_and_drop_each_other(hosts: NodeHost, n: int) -> None:
    with bridge_with_namespaces(n + 1) as net:
        places = list(zip(net.namespaces, net.addresses, strict=True))
        try:
            _fleet_scenario(hosts, places[:n], places[n])
            peer = hosts.nodes[0].table()["n1"] if n > 2 else None
        finally:
            hosts.kill_all()
        if peer is not None:  # each peer is reached at its own namespace's address
            assert peer["addresses"] == [net.addresses[1]] and peer["endpoint"] == f"{net.addresses[1]}:7000"


@pytest.mark.netns
def test_cli_announce_and_json_listing(lo_ns: str) -> None:
    """Two ``--announce`` processes of one fleet are exactly what a third ``--json`` listing shows."""
    base = [EDGE_NODE, "peers", "--interface", "127.0.0.1"]
    announcers = [
        NetnsProcess(lo_ns, [*base, "--announce", nid, "--fleet", FLEET, "--port", str(port), "--ttl", "30"])
        for nid, port in (("A", 5001), ("B", 5002))
    ]
    try:
        deadline = time.monotonic() + START_S
        for proc in announcers:
            # the announcer prints its (possibly empty) table once it is advertised
            assert proc.wait_for(
                lambda lines: any(line.startswith("ID") for line in lines), max(0.1, deadline - time.monotonic())
            ), proc.stderr_text
        listing = run_in_netns(lo_ns, [*base, "--fleet", FLEET, "--json", "--timeout", "5"], timeout_s=60)
        assert listing.returncode == 0, listing.stderr
        peers = json.loads(listing.stdout)
        assert sorted(p["node_id"] for p in peers) == ["A", "B"]
        by_id = {p["node_id"]: p for p in peers}
        for nid, port in (("A", 5001), ("B", 5002)):
            peer = by_id[nid]
            assert peer["port"] == port and peer["endpoint"] == f"127.0.0.1:{port}"
            assert peer["fleet"] == FLEET and peer["protocol_version"] == PROTOCOL_VERSION
            assert peer["tier"] is None and peer["density"] == 1.0 and peer["round"] == 0  # no tier: unknown (None)
            assert peer["fingerprint"] is None and peer["arch"] is None  # a probe has no model, so no architecture
        # --static: ID@HOST:PORT lines, the syntax of --peers and peers files
        static = run_in_netns(lo_ns, [*base, "--fleet", FLEET, "--static", "--timeout", "3"], timeout_s=60)
        assert static.returncode == 0, static.stderr
        assert sorted(static.stdout.split()) == ["A@127.0.0.1:5001", "B@127.0.0.1:5002"]
        # each announcer lists the other one (table rows start with the id)
        assert announcers[0].wait_for(lambda lines: any(line.startswith("B ") for line in lines), FIND_S)
        assert announcers[1].wait_for(lambda lines: any(line.startswith("A ") for line in lines), FIND_S)

        # SIGTERM: B says goodbye and exits 0; A, watching, prints its table again without B at once
        announcer_a, announcer_b = announcers
        announcer_b.signal(signal.SIGTERM)
        assert announcer_b.wait(10) == 0, announcer_b.stderr_text
        assert announcer_a.wait_for(lambda lines: lines[-1].startswith("ID"), GOODBYE_S + 0.5), announcer_a.lines[-3:]
        announcer_a.signal(signal.SIGTERM)
        assert announcer_a.wait(10) == 0, announcer_a.stderr_text
    finally:
        for proc in announcers:
            proc.kill()


@pytest.mark.netns
def test_txt_updates_are_rate_limited_and_coalesced(hosts: NodeHost, lo_ns: str) -> None:
    """20 round updates in 2 s go out as at most one announcement per interval, the last value included."""
    interval_s = 1.0
    busy = hosts.spawn(lo_ns, "busy", "127.0.0.1", min_update_interval_s=interval_s, debug=True)
    watcher = hosts.spawn(lo_ns, "watcher", "127.0.0.1")
    _wait_started([busy, watcher])
    assert watcher.wait_table(lambda t: "busy" in t, FIND_S), watcher.diagnostics()
    t0 = time.monotonic()
    for round_ in range(1, 21):
        busy.update(round=round_)
        time.sleep(0.1)
    assert watcher.wait_table(lambda t: t.get("busy", {}).get("round") == 20, interval_s + 2.0), watcher.diagnostics()
    elapsed_s = time.monotonic() - t0
    announcements = busy.log().count("re-announcing busy")
    # announcements are at least interval_s apart, all within [t0, t0 + elapsed_s]
    assert 1 <= announcements <= elapsed_s / interval_s + 1, (announcements, elapsed_s, busy.log()[-2000:])
    updates = [m for m in watcher._mine(hosts.proc.lines) if m["event"] == "updated:busy"]
    rounds_seen = [next(p["round"] for p in m["peers"] if p["node_id"] == "busy") for m in updates]
    assert rounds_seen[-1] == 20 and len(rounds_seen) <= elapsed_s / interval_s + 1, rounds_seen


@pytest.mark.netns
def test_independent_client_sees_the_advertisement(hosts: NodeHost, lo_ns: str) -> None:
    """``dig`` (legacy unicast to port 5353) finds the service, its SRV/A and every TXT key."""
    if shutil.which("dig") is None:
        pytest.skip("dig is missing: apt-get install bind9-dnsutils (.ci/run does)")
    node = hosts.spawn(lo_ns, "dig-me", "127.0.0.1", ttl_s=30)
    _wait_started([node])
    node.update(round=12)
    dig = ["dig", "-p", "5353", "@127.0.0.1", "+time=2", "+tries=2", "+noall", "+answer"]

    def ask(*question: str, expect: str) -> str:
        out = ""
        for _ in range(5):
            out = run_in_netns(lo_ns, [*dig, *question], timeout_s=15).stdout
            if expect in out:
                break
            time.sleep(0.3)
        return out

    ptr = ask("_edge-node._tcp.local", "PTR", expect="dig-me")
    assert "PTR\tdig-me._edge-node._tcp.local." in ptr, ptr
    srv = ask("dig-me._edge-node._tcp.local", "SRV", expect="SRV")
    assert "SRV\t0 0 7000 dig-me.local." in srv, srv
    address = ask("dig-me.local", "A", expect="127.0.0.1")
    assert "A\t127.0.0.1" in address, address
    txt = ask("dig-me._edge-node._tcp.local", "TXT", expect="round=12")
    expected = (f"v={PROTOCOL_VERSION}", "id=dig-me", f"fleet={FLEET}", "arch=", "tier=unknown", "density=1.0")
    for item in (*expected, "round=12", "fp="):
        assert f'"{item}"' in txt, txt


@pytest.mark.netns
def test_ipv6_nodes_on_a_bridge_find_each_other(hosts: NodeHost) -> None:
    with bridge_with_namespaces(2, ipv6_subnet="fd00:77::") as net:
        a, b = (
            hosts.spawn(ns, f"v6-{i}", "eth0", ipv6=True)  # an interface name: its IPv6 addresses
            for i, ns in enumerate(net.namespaces)
        )
        assert a.wait_table(lambda t: "v6-1" in t, FIND_S + 2), a.diagnostics()
        assert b.wait_table(lambda t: "v6-0" in t, FIND_S), b.diagnostics()
        peer = a.table()["v6-1"]
        assert "fd00:77::2" in peer["addresses"] and all(":" in addr for addr in peer["addresses"])
        assert peer["endpoint"] == "[fd00:77::2]:7000"
        assert all("%" in addr for addr in peer["addresses"] if addr.startswith("fe80"))  # scoped, so usable
        hosts.kill_all()


@pytest.mark.netns
def test_a_node_id_in_use_is_refused(hosts: NodeHost) -> None:
    # two devices; on one host, several responders share port 5353 and unicast probe answers may go astray
    with bridge_with_namespaces(2) as net:
        first = hosts.spawn(net.namespaces[0], "twin", net.addresses[0])
        _wait_started([first])
        second = hosts.spawn(net.namespaces[1], "twin", net.addresses[1])
        try:
            assert second.wait_event("error", 10.0), second.diagnostics()
            assert second.error() == "DiscoveryError: node id 'twin' is already advertised in this network"
        finally:
            hosts.kill_all()


@pytest.mark.netns
def test_netns_helpers_clean_up_after_a_failure(require_root: None) -> None:
    from tests.netns import list_namespaces

    made: list[str] = []
    with pytest.raises(RuntimeError, match="boom"), bridge_with_namespaces(2) as net:
        made = [net.bridge_ns, *net.namespaces]
        assert set(made) <= set(list_namespaces())
        shown = run_in_netns(net.namespaces[1], ["ip", "-4", "addr", "show", "dev", net.interface]).stdout
        assert f"inet {net.addresses[1]}/24" in shown
        raise RuntimeError("boom")
    assert made and not set(made) & set(list_namespaces())


# A foreign advertiser speaking zeroconf directly: bad TXT first, then one valid node.
_FOREIGN = r"""
import asyncio, sys, json
from zeroconf import ServiceInfo
from zeroconf.asyncio import AsyncZeroconf
T = "_edge-node._tcp.local."
def txt(**over):
    base = {"v": "1.0", "id": None, "fleet": "fleet-a", "arch": "cnn/10/0000abcd", "tier": "t1", "density": "0.5",
            "round": "3", "fp": ""}
    base.update(over)
    return {k: (None if v == "<bare>" else v) for k, v in base.items() if v is not None}
BAD = json.loads(sys.argv[1])
async def main():
    zc = AsyncZeroconf(interfaces=["127.0.0.1"])
    async def reg(name, props):
        props = {k: (v.encode("latin-1") if isinstance(v, str) else v) for k, v in props.items()}
        info = ServiceInfo(T, f"{name}.{T}", port=9000, properties=props, server=f"{name}.local.",
                           parsed_addresses=["127.0.0.1"])
        await (await zc.async_register_service(info, cooperating_responders=True))
    await asyncio.gather(*(reg(name, txt(**{"id": name, **props})) for name, props in BAD.items()))
    print("bad registered", flush=True)
    await asyncio.sleep(1.0)
    await reg("late-good", txt(id="late-good"))
    print("good registered", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""

_MALFORMED = {
    "bad-density": {"density": "fast"},
    "nan-density": {"density": "nan"},
    "big-density": {"density": "2.5"},
    "neg-round": {"round": "-1"},
    "sci-round": {"round": "1e3"},
    "long-fleet": {"fleet": "f" * 240},
    "long-arch": {"arch": "a" * 240},
    "no-fleet": {"fleet": None},  # None: the key is left out
    "no-version": {"v": None},
    "bare-round": {"round": "<bare>"},  # the key without "=value"
    "latin1-tier": {"tier": "t\u00e9"},
    "bad-version": {"v": "one"},
    "id-mismatch": {"id": "someone-else"},
    "other-major": {"v": "2.0"},
    "other-arch": {"arch": "resnet18/10/0000def0"},
    "old-arch-form": {"arch": "cnn:10:abc"},  # TXT's old, wider rule took it: the wire's NAME/CLASSES/HASH8 wins
    "unknown-tier": {"tier": "fast"},  # TXT's old rule took any name: the Hello's tier names win
}


@pytest.mark.netns
def test_malformed_txt_is_ignored_and_browsing_goes_on(hosts: NodeHost, lo_ns: str) -> None:
    log_from = len(hosts.proc.stderr_lines)
    observer = hosts.spawn(lo_ns, "observer", "127.0.0.1", arch="cnn/10/0000abcd", debug=True)
    _wait_started([observer])
    with NetnsProcess(lo_ns, [PYTHON, "-c", _FOREIGN, json.dumps(_MALFORMED)]) as foreign:
        assert foreign.wait_for(lambda lines: "good registered" in lines, START_S), foreign.stderr_text
        assert observer.wait_table(lambda t: "late-good" in t, FIND_S), observer.diagnostics()
        time.sleep(0.5)
        assert set(observer.table()) == {"late-good"}, observer.diagnostics()
        assert observer.table()["late-good"]["density"] == 0.5
    log = observer.log()
    for name in _MALFORMED:
        assert any(name in line and "ignoring" in line for line in log.splitlines()), (
            f"no debug line for {name}:\n{log}"
        )
    assert observer.error() is None and "Traceback" not in "\n".join(hosts.proc.stderr_lines[log_from:])
    observer.stop()
    assert observer.wait_event("stopped", 5.0), "the browser did not survive the malformed records"
