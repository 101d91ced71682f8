"""What each mDNS attack costs a node, next to what honest peers cost it, measured in private namespaces.

Every scenario builds its own bridge with three network namespaces (nothing touches this machine's
interfaces): the victim (one ``MdnsDiscovery`` in its own process, 10.77.0.1), three honest peers
(10.77.0.2) and a fake responder (10.77.0.3) that sends crafted responses from a raw UDP socket and
counts every packet it hears, so the victim's queries are counted on the wire. Scenarios:

  honest       REAL_PEERS + 9 more honest peers, no attack: the baseline
  burst        5,000 complete fake services of the victim's fleet in 625 packets (the issue's probe)
  flood        a new burst of 1,000 fake services every second for the whole window
  ptr_only     2,000 PTR records with nothing behind them, in ~70 packets
  bad_alias    PTR aliases of another service type and bad labels, every 0.5 s, while an honest
               peer (TTL 3 s) is killed: is it dropped on time?
  bad_address  advertisements with 0.0.0.0, multicast, broadcast, reserved, public, loopback, port 0

For each: the victim's CPU seconds and RSS growth from just before the attack to the end of the
window, the queries it sent (per second), how many of the 3 honest peers it still lists, its table
size and its refusal counts. ``--before DIR`` runs every scenario a second time with the victim
importing ``edge_node`` from DIR (e.g. ``git archive <commit> edge_node | tar -x -C DIR``).

    sudo .venv/bin/python bench/hostile_mdns.py [--quick] [--json FILE] [--before DIR]

Needs root (network namespaces) and iproute2. Figures, not assertions: the tests assert the bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FLEET = "fleet-a"
SUBNET = "10.77.0"
REAL_TTL_S = 10  # honest peers' TTL: they must be refreshed during the window to stay listed
REALS = ("real-0", "real-1", "real-2")
DOOMED_TTL_S = 3  # the peer killed during bad_alias
SCENARIOS = ("honest", "burst", "flood", "ptr_only", "bad_alias", "bad_address")


def _needs_root() -> None:
    if os.geteuid() != 0:
        print(
            "bench/hostile_mdns.py needs root: it creates private network namespaces (ip netns) so that no\n"
            "mDNS packet reaches this machine's own interfaces. Run it as root, e.g.\n"
            "  sudo .venv/bin/python bench/hostile_mdns.py",
            file=sys.stderr,
        )
        raise SystemExit(2)


def run_scenario(name: str, *, quick: bool, window_s: float, code: Path | None, max_peers: int) -> dict[str, Any]:
    from tests.mdns_attack import AttackerProc, NodeProc, peer_ids, wait_until
    from tests.netns import bridge_with_namespaces

    with bridge_with_namespaces(3) as net, ExitStack() as stack:
        (victim_ns, reals_ns, attacker_ns), (victim_addr, reals_addr, attacker_addr) = net.namespaces, net.addresses
        options: dict[str, Any] = {} if code is not None else {"max_peers": max_peers}
        victim = stack.enter_context(
            NodeProc(
                victim_ns, code=code, node_id="victim", port=7000, fleet=FLEET, interfaces=[victim_addr], **options
            )
        )
        honest = REALS + (tuple(f"honest-{i}" for i in range(9)) if name == "honest" else ())
        honest += ("doomed",) if name == "bad_alias" else ()
        procs = {
            nid: stack.enter_context(
                NodeProc(
                    reals_ns,
                    node_id=nid,
                    port=7001 + i,
                    fleet=FLEET,
                    interfaces=[reals_addr],
                    ttl_s=DOOMED_TTL_S if nid == "doomed" else REAL_TTL_S,
                )
            )
            for i, nid in enumerate(honest)
        }
        attacker = stack.enter_context(AttackerProc(attacker_ns, attacker_addr))
        found = victim.wait_listed(honest, 15.0)
        time.sleep(1.0)
        before = victim.stats()
        t0 = time.monotonic()
        sent_packets = 0
        scale = 5 if quick else 1
        deadline = t0 + window_s
        if name == "burst":
            sent_packets += attacker.send(
                "burst", n=5000 // scale, per_packet=8, fleet=FLEET, subnet=SUBNET, pace_s=0.0005
            )["sent"]
        elif name == "ptr_only":
            sent_packets += attacker.send("ptr_only", n=2000 // scale, per_packet=58, pace_s=0.001)["sent"]
        elif name == "bad_address":
            sent_packets += attacker.send("bad_addresses", fleet=FLEET, subnet=SUBNET)["sent"]
        elif name == "bad_alias":
            sent_packets += attacker.send("bad_alias", fleet=FLEET, address=f"{SUBNET}.70")["sent"]
            procs["doomed"].proc.kill()  # SIGKILL by pid: no goodbye, only its TTL can remove it
        doomed_gone_s = None
        for second in range(int(window_s * 4) + 2):  # the window, bounded in count and time
            if time.monotonic() >= deadline:
                break
            if name == "flood":  # new names every second
                n = 1000 // scale
                sent_packets += attacker.send(
                    "burst", n=n, first=second * n, per_packet=8, fleet=FLEET, subnet=SUBNET, pace_s=0.0002
                )["sent"]
            elif name == "bad_alias":
                sent_packets += attacker.send("bad_alias", fleet=FLEET, address=f"{SUBNET}.70")["sent"]
                if doomed_gone_s is None and "doomed" not in peer_ids(stats := victim.stats()):
                    doomed_gone_s = round(stats["t"] - t0, 2)
            time.sleep(1.0 if name == "flood" else 0.5 if name == "bad_alias" else 0.25)
        wait_until(lambda: time.monotonic() >= deadline, window_s + 1, step_s=0.25)
        after = victim.stats()
        duration_s = after["t"] - t0
        queries = attacker.queries_from(victim_addr, t0, after["t"])
        return {
            "scenario": name,
            "code": "before" if code is not None else "now",
            "honest_found": bool(found["ok"]),
            "packets_sent_by_attacker": sent_packets,
            "window_s": round(duration_s, 2),
            "cpu_s": round(after["cpu_s"] - before["cpu_s"], 3),
            "rss_growth_mb": round((after["rss_kb"] - before["rss_kb"]) / 1024, 2),
            "rss_mb": round(after["rss_kb"] / 1024, 1),
            "queries_sent": queries,
            "queries_per_s": round(queries / duration_s, 2),
            "real_peers_kept": len(set(REALS) & peer_ids(after)),
            "table_size": len(after["peers"]),
            "refusals": after["refusals"],
            # bad_alias: seconds from killing the doomed peer (TTL 3 s) to its removal; None: still listed
            "dead_peer_dropped_s": doomed_gone_s if name == "bad_alias" else None,
        }


def _print(rows: list[dict[str, Any]]) -> None:
    header = ("scenario", "code", "CPU s", "RSS +MB", "queries/s", "reals kept", "table", "refusals")
    table = [header] + [
        (
            r["scenario"],
            r["code"],
            f"{r['cpu_s']:.2f}",
            f"{r['rss_growth_mb']:.1f}",
            f"{r['queries_per_s']:.1f}",
            f"{r['real_peers_kept']}/3",
            str(r["table_size"]),
            ", ".join(f"{k}={v}" for k, v in r["refusals"].items()) or "-",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1])
    for r in rows:
        if r["scenario"] == "bad_alias":
            gone = r["dead_peer_dropped_s"]
            verdict = "still listed at the end" if gone is None else f"dropped after {gone} s"
            print(f"bad_alias ({r['code']}): the peer killed at the start (TTL {DOOMED_TTL_S} s) was {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fifth of the records, 4 s windows (for CI)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--before", type=Path, metavar="DIR", help="also measure the edge_node/ under DIR")
    parser.add_argument("--window", type=float, default=None, metavar="S", help="seconds measured per scenario")
    parser.add_argument("--max-peers", type=int, default=64, help="the victim's table bound (default 64)")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, help="run only these scenarios")
    args = parser.parse_args(argv)
    _needs_root()
    if args.before is not None and not (args.before / "edge_node" / "__init__.py").is_file():
        parser.error(f"--before {args.before}: no edge_node/ package there")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.netns import cleanup_stale

    cleanup_stale()
    window_s = args.window if args.window is not None else (4.0 if args.quick else 10.0)
    rows = []
    for name in args.only or SCENARIOS:
        for code in (None, args.before) if args.before is not None else (None,):
            row = run_scenario(name, quick=args.quick, window_s=window_s, code=code, max_peers=args.max_peers)
            rows.append(row)
            print(f"{name} ({row['code']}): done", file=sys.stderr, flush=True)
    print(f"\nvictim costs over a {window_s:g} s window from the start of each attack (3 honest peers present):")
    _print(rows)
    if args.json is not None:
        args.json.write_text(json.dumps({"window_s": window_s, "quick": args.quick, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
