"""Hostile mDNS for tests and ``bench/hostile_mdns.py``: crafted packets, a fake responder, a measured node.

Everything runs inside network namespaces the caller made (``tests.netns``); nothing here touches
the machine's own interfaces. Two driver programs, started with ``ip netns exec NS python
tests/mdns_attack.py ...`` and spoken to with one JSON object per line:

* ``node CONFIG_JSON``: one :class:`~edge_node.net.discovery.MdnsDiscovery` (the victim, or an honest
  peer). Commands: ``stats`` (its CPU seconds, RSS, table, refusals, book sizes), ``wait`` (until given
  ids are listed / absent, bounded), ``pull`` (``record_pull``), ``stop``.
* ``attacker ADDRESS``: a raw UDP socket on ADDRESS:5353 that sends crafted responses (``burst``,
  ``ptr_only``, ``bad_alias``, ``bad_addresses``) and counts, from the start, every mDNS packet it
  hears by source address and kind (``count``), so the queries a victim sends can be counted.

:class:`NodeProc` and :class:`AttackerProc` drive them from the test (or bench) process.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SERVICE_TYPE = "_edge-node._tcp.local."
MDNS_ADDR = "224.0.0.251"
MDNS_PORT = 5353
START_S = 40.0  # bound on a driver's start-up on a busy 2-core machine (not a promise)
_FLAGS_RESPONSE = 0x8400  # QR | AA
_TYPE_A, _TYPE_PTR, _TYPE_TXT, _TYPE_SRV = 1, 12, 16, 33
_CLASS_IN = 1
_CLASS_UNIQUE = 0x8000


def _name(peer: Any) -> str:
    """A listed peer's node id (``PeerInfo.name``; ``node_id`` in the older code the bench also measures)."""
    return str(getattr(peer, "name", None) or peer.node_id)


# -- crafted records and packets -----------------------------------------------------------------


def txt_bytes(props: dict[str, str]) -> bytes:
    out = b""
    for key, value in props.items():
        item = f"{key}={value}".encode()
        out += bytes([len(item)]) + item
    return out


def service_records(
    node_id: str,
    *,
    fleet: str,
    address: str,
    port: int = 7000,
    ttl: int = 4500,
    arch: str = "",
    server: str | None = None,
    alias: str | None = None,
) -> list[Any]:
    """PTR, SRV, TXT and A records advertising ``node_id`` (valid in every field unless overridden)."""
    from zeroconf import DNSAddress, DNSPointer, DNSService, DNSText

    name = alias or f"{node_id}.{SERVICE_TYPE}"
    host = server or f"{node_id}.local."
    txt = {"v": "1.0", "id": node_id, "fleet": fleet, "arch": arch, "tier": "t1", "density": "0.5", "round": "1"}
    txt["fp"] = ""
    return [
        DNSPointer(SERVICE_TYPE, _TYPE_PTR, _CLASS_IN, ttl, name),
        DNSService(name, _TYPE_SRV, _CLASS_IN | _CLASS_UNIQUE, ttl, 0, 0, port, host),
        DNSText(name, _TYPE_TXT, _CLASS_IN | _CLASS_UNIQUE, ttl, txt_bytes(txt)),
        DNSAddress(host, _TYPE_A, _CLASS_IN | _CLASS_UNIQUE, ttl, socket.inet_aton(address)),
    ]


def response_packets(groups: Iterable[list[Any]], per_packet: int) -> list[bytes]:
    """Responses carrying ``per_packet`` groups of records each (zeroconf splits an oversized one)."""
    from zeroconf import DNSOutgoing

    packets: list[bytes] = []
    batch: list[list[Any]] = []

    def flush() -> None:
        if batch:
            out = DNSOutgoing(_FLAGS_RESPONSE)
            for group in batch:
                for record in group:
                    out.add_answer_at_time(record, 0)
            packets.extend(out.packets())
            batch.clear()

    for group in groups:
        batch.append(group)
        if len(batch) >= per_packet:
            flush()
    flush()
    return packets


def burst_packets(
    n: int, *, fleet: str, subnet: str, per_packet: int = 8, ttl: int = 4500, first: int = 0
) -> list[bytes]:
    """``n`` complete fake services ``fake-<first>``... of ``fleet`` (addresses ``subnet``.10-.249)."""
    return response_packets(
        (
            service_records(f"fake-{i:06d}", fleet=fleet, address=f"{subnet}.{10 + i % 240}", ttl=ttl)
            for i in range(first, first + n)
        ),
        per_packet,
    )


def spoof_srv_packets(node_id: str, port: int, ttl: int) -> list[bytes]:
    """One SRV record for ``node_id``'s instance name naming ``port``: what a spoofer sends."""
    from zeroconf import DNSService

    name = f"{node_id}.{SERVICE_TYPE}"
    record = DNSService(name, _TYPE_SRV, _CLASS_IN | _CLASS_UNIQUE, ttl, 0, 0, port, f"{node_id}.local.")
    return response_packets([[record]], 1)


def ptr_only_packets(n: int, *, per_packet: int = 58, ttl: int = 4500) -> list[bytes]:
    """``n`` PTR records of our service type with nothing behind them."""
    from zeroconf import DNSPointer

    return response_packets(
        ([DNSPointer(SERVICE_TYPE, _TYPE_PTR, _CLASS_IN, ttl, f"ghost-{i:05d}.{SERVICE_TYPE}")] for i in range(n)),
        per_packet,
    )


BAD_ALIASES = (
    "printer._ipp._tcp.local.",  # another service type: ServiceInfo(SERVICE_TYPE, name) raises on it
    "bad name._edge-node._tcp.local.",  # not a node id
    "-dash-first._edge-node._tcp.local.",  # not a node id (must start alphanumeric)
    "sub.domain._edge-node._tcp.local.",  # two labels
    "_edge-node._tcp.local.",  # the type itself
)


def bad_alias_packets(*, fleet: str, address: str, ttl: int = 4500) -> list[bytes]:
    """Complete advertisements under PTR aliases that are not ``<node-id>._edge-node._tcp.local.``."""
    groups = [
        service_records(f"alias{i}", fleet=fleet, address=address, ttl=ttl, alias=alias)
        for i, alias in enumerate(BAD_ALIASES)
    ]
    return response_packets(groups, 1)


def bad_address_packets(*, fleet: str, subnet: str, ttl: int = 4500) -> tuple[list[bytes], dict[str, str]]:
    """Advertisements with unusable addresses or ports, plus one good control ``ok-ctl``.

    Returns the packets and {node id: what is wrong with it}.
    """
    cases = {
        "bad-unspec": ("0.0.0.0", 7000),
        "bad-mcast": (MDNS_ADDR, 7000),
        "bad-bcast": ("255.255.255.255", 7000),
        "bad-subnet-bcast": (f"{subnet}.255", 7000),
        "bad-reserved": ("240.0.0.1", 7000),
        "bad-public": ("8.8.8.8", 7000),
        "bad-loopback": ("127.0.0.1", 7000),
        "bad-port0": (f"{subnet}.60", 0),
        "ok-ctl": (f"{subnet}.61", 7000),
    }
    groups = [
        service_records(node_id, fleet=fleet, address=address, port=port, ttl=ttl)
        for node_id, (address, port) in cases.items()
    ]
    return response_packets(groups, 1), {k: f"{a}:{p}" for k, (a, p) in cases.items()}


# -- driver: one measured node -------------------------------------------------------------------
def _emit(obj: dict[str, Any]) -> None:
    obj["t"] = time.monotonic()
    os.write(1, (json.dumps(obj, separators=(",", ":")) + "\n").encode())


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_node(config: dict[str, Any]) -> None:
    import logging

    from edge_node.net.discovery import MdnsDiscovery

    level = logging.DEBUG if config.pop("debug", False) else logging.WARNING
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    disc = MdnsDiscovery(**config)
    disc.start()

    def stats() -> dict[str, Any]:
        peers = disc.peers()
        return {
            "cpu_s": _cpu_s(),
            "rss_kb": _rss_kb(),
            "peers": [{"node_id": _name(p), "addresses": p.addresses, "port": p.port} for p in peers],
            # getattr: the bench also measures older code that lacks these
            "refusals": getattr(disc, "refusals", dict)(),
            "book": getattr(disc, "stats", dict)(),
        }

    _emit({"event": "started", **stats()})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "stats":
            _emit({"event": "stats", **stats()})
        elif op == "wait":
            ids = set(cmd["ids"])
            present = cmd.get("present", True)

            def holds(peers: list[Any], ids: set[str] = ids, present: bool = present) -> bool:
                listed = {_name(p) for p in peers}
                return ids <= listed if present else not (ids & listed)

            t0 = time.monotonic()
            ok = holds(disc.wait_for(holds, float(cmd["timeout_s"])))
            _emit({"event": "waited", "ok": ok, "waited_s": time.monotonic() - t0, **stats()})
        elif op == "pull":
            disc.record_pull(cmd["node_id"], bool(cmd["ok"]))
            _emit({"event": "pulled"})
        elif op == "stop":
            break
    disc.stop()
    _emit({"event": "stopped"})


# -- driver: the attacker (sender and counter) ---------------------------------------------------
def _open_mdns_socket(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(("", MDNS_PORT))
    membership = socket.inet_aton(MDNS_ADDR) + socket.inet_aton(address)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(address))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
    sock.settimeout(0.2)
    return sock


def run_attacker(address: str) -> None:
    sock = _open_mdns_socket(address)
    heard: deque[tuple[float, str, bool]] = deque(maxlen=1_000_000)  # (time, source, is a query)
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            try:
                data, (source, _port) = sock.recvfrom(9000)
            except TimeoutError:
                continue
            except OSError:
                return
            if len(data) >= 12:
                (flags,) = struct.unpack_from("!H", data, 2)
                heard.append((time.monotonic(), source, not flags & 0x8000))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()

    def send(packets: list[bytes], pace_s: float) -> dict[str, Any]:
        t0 = time.monotonic()
        for packet in packets:
            sock.sendto(packet, (MDNS_ADDR, MDNS_PORT))
            if pace_s:
                time.sleep(pace_s)
        return {"sent": len(packets), "bytes": sum(map(len, packets)), "t0": t0, "t1": time.monotonic()}

    _emit({"event": "started"})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        pace_s = float(cmd.get("pace_s", 0.0))
        if op == "burst":
            packets = burst_packets(
                cmd["n"],
                fleet=cmd["fleet"],
                subnet=cmd["subnet"],
                per_packet=cmd["per_packet"],
                first=cmd.get("first", 0),
                ttl=cmd.get("ttl", 4500),
            )
            _emit({"event": "sent", **send(packets, pace_s)})
        elif op == "spoof_srv":
            _emit({"event": "sent", **send(spoof_srv_packets(cmd["node_id"], cmd["port"], cmd["ttl"]), pace_s)})
        elif op == "ptr_only":
            _emit({"event": "sent", **send(ptr_only_packets(cmd["n"], per_packet=cmd["per_packet"]), pace_s)})
        elif op == "bad_alias":
            _emit({"event": "sent", **send(bad_alias_packets(fleet=cmd["fleet"], address=cmd["address"]), pace_s)})
        elif op == "bad_addresses":
            packets, cases = bad_address_packets(fleet=cmd["fleet"], subnet=cmd["subnet"])
            _emit({"event": "sent", "cases": cases, **send(packets, pace_s)})
        elif op == "count":
            t0, t1, source = float(cmd["t0"]), float(cmd["t1"]), cmd["src"]
            window = [h for h in list(heard) if t0 <= h[0] <= t1 and h[1] == source]
            _emit(
                {
                    "event": "counted",
                    "queries": sum(1 for h in window if h[2]),
                    "responses": sum(1 for h in window if not h[2]),
                }
            )
        elif op == "stop":
            break
    stop.set()
    sock.close()
    _emit({"event": "stopped"})


# -- controllers (test / bench side) -------------------------------------------------------------
class _Driver:
    """A driver process inside namespace ``ns``; ``ask`` sends a command and waits (bounded) for its reply."""

    def __init__(self, ns: str, argv: list[str], *, code: Path | None = None) -> None:
        from tests.netns import NetnsProcess

        # ``code``: a tree whose edge_node/ to import instead of this one's (the bench's "before")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (code, REPO) if p is not None)}
        # run as a script, not with -m: -m puts the working directory first on sys.path, ahead of ``code``
        self.proc = NetnsProcess(ns, [sys.executable, str(Path(__file__).resolve()), *argv], env=env)
        self._seen = 0
        self.started = self.expect("started", START_S)

    def expect(self, event: str, timeout_s: float) -> dict[str, Any]:
        def find(lines: list[str]) -> bool:
            return any(json.loads(line).get("event") == event for line in lines[self._seen :] if line.startswith("{"))

        if not self.proc.wait_for(find, timeout_s):
            raise RuntimeError(
                f"{self.proc.argv[2:4]}: no {event!r} within {timeout_s} s:\n{self.proc.stderr_text[-3000:]}"
            )
        lines = list(self.proc.lines)
        for i in range(self._seen, len(lines)):
            if lines[i].startswith("{"):
                message = json.loads(lines[i])
                if message.get("event") == event:
                    self._seen = i + 1
                    return message
        raise AssertionError("unreachable")

    def ask(self, event: str, reply_within_s: float = 30.0, **cmd: Any) -> dict[str, Any]:
        self.proc.send(json.dumps(cmd))
        return self.expect(event, reply_within_s)

    def close(self) -> None:
        if self.proc.proc.poll() is None:
            with contextlib.suppress(OSError):  # it may have exited already
                self.proc.send(json.dumps({"op": "stop"}))
            if self.proc.wait(5.0) is None:
                self.proc.kill()
        self.proc.kill()

    def __enter__(self) -> _Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NodeProc(_Driver):
    """A measured :class:`MdnsDiscovery` in ``ns`` (keyword arguments as its constructor's)."""

    def __init__(self, ns: str, *, code: Path | None = None, **config: Any) -> None:
        self.node_id = config.get("node_id")
        super().__init__(ns, ["node", json.dumps(config)], code=code)

    def stats(self) -> dict[str, Any]:
        return self.ask("stats", op="stats")

    def wait_listed(self, ids: Iterable[str], timeout_s: float, *, present: bool = True) -> dict[str, Any]:
        return self.ask("waited", timeout_s + 10, op="wait", ids=sorted(ids), timeout_s=timeout_s, present=present)

    def pull(self, node_id: str, ok: bool) -> None:
        self.ask("pulled", op="pull", node_id=node_id, ok=ok)


class AttackerProc(_Driver):
    """The fake responder and query counter on ``address`` in ``ns``."""

    def __init__(self, ns: str, address: str) -> None:
        super().__init__(ns, ["attacker", address])

    def send(self, op: str, **args: Any) -> dict[str, Any]:
        return self.ask("sent", 60.0, op=op, **args)

    def queries_from(self, source: str, t0: float, t1: float) -> int:
        return int(self.ask("counted", op="count", src=source, t0=t0, t1=t1)["queries"])


def peer_ids(stats: dict[str, Any]) -> set[str]:
    return {p["node_id"] for p in stats["peers"]}


def wait_until(predicate: Callable[[], bool], timeout_s: float, step_s: float = 0.2) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes (bounded in time and count)."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / step_s) + 2):
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step_s)
    return predicate()


def main(argv: list[str]) -> None:
    if argv[:1] == ["node"] and len(argv) == 2:
        run_node(json.loads(argv[1]))
    elif argv[:1] == ["attacker"] and len(argv) == 2:
        run_attacker(argv[1])
    else:
        raise SystemExit("usage: python tests/mdns_attack.py node CONFIG_JSON | attacker ADDRESS")


if __name__ == "__main__":
    main(sys.argv[1:])
