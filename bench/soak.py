"""Soak: a loopback fleet of real daemons for a long time; does any daemon grow (memory, file descriptors)?

    .venv/bin/python bench/soak.py [--nodes 8] [--minutes 30] [--sample-s 10] [--netns] [--attack N] [--json soak.json]

Runs ``--nodes`` ``edge-node start`` daemons (the loopback fleet of ``edge-node loopback``, demo set,
one thread each, until stopped) for ``--minutes``, sampling every ``--sample-s`` each daemon's RSS and
open file descriptors (psutil) and its completed rounds. Growth is measured after warm-up (from each
node's first completed round, so start-up's imports and first allocations do not count as growth):
per node RSS and fd count at the start and the end of that window, a least-squares slope of RSS in
MB/hour and fds/hour, and the rounds completed. Prints a table and the fleet's worst slope; writes
every sample to ``--json``. Nothing is asserted: the figures are the result.

``--attack N`` repeats ``bench/hostile.py``'s attacks on the server (``SERVER_ATTACKS``: withheld
GetModel and Hello calls, 1,100 idle connections, from 127.0.0.2) against node N's gRPC port for the
whole run, one after another with ``--attack-gap-s`` between them; each attack's figures (an honest
Hello's latency before and during it, what the attacker held) go to the JSON's ``attacks``, and the
attacked node's ``server_refusals`` come from its round records.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._provenance import commit, machine  # noqa: E402
from bench.hostile import SERVER_ATTACKS, server_attack  # noqa: E402
from edge_node.fleet.config import FleetConfig  # noqa: E402
from edge_node.fleet.fleet import Fleet  # noqa: E402


def _slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per hour (None with fewer than 3 points)."""
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return None
    return 3600 * sum((t - mt) * (v - mv) for t, v in points) / den


def _sample(fleet: Fleet, t0: float) -> list[dict[str, Any]]:
    fleet.poll()
    rows = []
    for daemon in fleet.own_daemons():
        row: dict[str, Any] = {"node": daemon.node_id, "t_s": round(time.monotonic() - t0, 1),
                               "rounds": len(daemon.completed), "pid": daemon.pid}  # fmt: skip
        try:
            proc = psutil.Process(daemon.pid)
            row["rss_mb"] = round(proc.memory_info().rss / 1e6, 2)
            row["fds"] = proc.num_fds()
            row["threads"] = proc.num_threads()
        except (psutil.NoSuchProcess, psutil.AccessDenied, TypeError):
            row["rss_mb"] = row["fds"] = row["threads"] = None
        rows.append(row)
    return rows


def summarize(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per node: RSS and fds at the start and end of the post-warm-up window, slopes per hour, rounds."""
    out = []
    for node in sorted({s["node"] for s in samples}):
        mine = [s for s in samples if s["node"] == node and s["rss_mb"] is not None]
        warm = [s for s in mine if s["rounds"] >= 1] or mine
        if not warm:
            out.append({"node": node, "samples": 0})
            continue
        first, last = warm[0], warm[-1]
        hours = (last["t_s"] - first["t_s"]) / 3600
        out.append({
            "node": node,
            "samples": len(warm),
            "window_s": round(last["t_s"] - first["t_s"], 1),
            "rss_mb_start": first["rss_mb"],
            "rss_mb_end": last["rss_mb"],
            "rss_mb_max": max(s["rss_mb"] for s in warm),
            "rss_slope_mb_per_h": _round(_slope_per_hour([(s["t_s"], s["rss_mb"]) for s in warm])),
            "fds_start": first["fds"],
            "fds_end": last["fds"],
            "fds_max": max(s["fds"] for s in warm),
            "fds_slope_per_h": _round(_slope_per_hour([(s["t_s"], s["fds"]) for s in warm])),
            "threads_start": first["threads"],
            "threads_end": last["threads"],
            "rounds": last["rounds"],
            "rounds_per_h": round(last["rounds"] / hours, 1) if hours > 0 else None,
        })  # fmt: skip
    return out


def _attack_loop(fleet: Fleet, index: int, gap_s: float, stop: threading.Event, out: list[dict[str, Any]]) -> None:
    """Run ``SERVER_ATTACKS`` in turn against node ``index`` until ``stop``; one row per attack in ``out``."""
    daemon = fleet.own_daemons()[index]
    _host, port = fleet.endpoints[index]
    while not daemon.completed and not stop.wait(1.0):  # its server is up once it has done a round (read by
        pass  # the main thread's samples: one reader of the records)
    turn = 0
    while not stop.wait(gap_s):
        attack = SERVER_ATTACKS[turn % len(SERVER_ATTACKS)]
        turn += 1
        try:
            row = server_attack(attack, port, node_id=daemon.node_id, fleet=fleet.config.fleet, victim_pid=daemon.pid)
        except Exception as exc:  # the node restarting or gone: note it and go on
            row = {"attack": attack, "error": f"{type(exc).__name__}: {exc}"[:300]}
        row["t_unix"] = round(time.time(), 1)
        out.append(row)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--netns", action="store_true", help="each daemon in its own namespace, mDNS (root)")
    parser.add_argument("--output", type=Path, default=None, help="fleet directory [default: a temp dir]")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--attack", type=int, default=None, help="attack node N's server throughout (index)")
    parser.add_argument("--attack-gap-s", type=float, default=5.0, help="pause between two attacks")
    args = parser.parse_args()
    if args.attack is not None and (args.netns or not 0 <= args.attack < args.nodes):
        parser.error("--attack N needs 0 <= N < --nodes and no --netns (the attacker is 127.0.0.2)")
    attacks: list[dict[str, Any]] = []
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with tempfile.TemporaryDirectory(prefix="edge-node-soak-") as tmp:
        output = args.output or Path(tmp) / "fleet"
        config = FleetConfig(nodes=args.nodes, rounds=0, netns=args.netns, output=output, pull_timeout_s=30.0)
        samples: list[dict[str, Any]] = []
        started_unix = time.time()
        with Fleet(config, fresh=True) as fleet:
            fleet.start()
            attacker = None
            if args.attack is not None:
                attacker = threading.Thread(
                    target=_attack_loop, args=(fleet, args.attack, args.attack_gap_s, stop, attacks), daemon=True
                )
                attacker.start()
            t0 = time.monotonic()
            end = t0 + 60 * args.minutes
            while time.monotonic() < end and not stop.is_set():
                rows = _sample(fleet, t0)
                samples += rows
                dead = [d.node_id for d in fleet.own_daemons() if not d.running]
                if dead:
                    print(f"soak: {dead} exited early; stopping", file=sys.stderr)
                    break
                print(f"[{rows[0]['t_s']:>7.0f} s] rounds {[r['rounds'] for r in rows]}, RSS MB "
                      f"{[r['rss_mb'] for r in rows]}", file=sys.stderr, flush=True)  # fmt: skip
                stop.wait(min(args.sample_s, max(0.0, end - time.monotonic())))
            samples += _sample(fleet, t0)
            stop.set()
            if attacker is not None:
                attacker.join(60)
            refusals = {d.node_id: (d.completed[-1].get("server_refusals") if d.completed else None)
                        for d in fleet.own_daemons()}  # fmt: skip
            fleet.stop()
            exits = {d.node_id: d.returncode for d in fleet.own_daemons()}
    per_node = summarize(samples)
    slopes = [n["rss_slope_mb_per_h"] for n in per_node if n.get("rss_slope_mb_per_h") is not None]
    fd_growth = [n["fds_end"] - n["fds_start"] for n in per_node if n.get("samples")]
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": dt.datetime.fromtimestamp(started_unix, dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "nodes": args.nodes,
        "minutes": round((samples[-1]["t_s"] if samples else 0) / 60, 2),
        "exit_codes": exits,
        "per_node": per_node,
        "worst_rss_slope_mb_per_h": max(slopes) if slopes else None,
        "fd_growth_max": max(fd_growth) if fd_growth else None,
        "attacked_node": args.attack,
        "attacks": attacks,
        "server_refusals_last_round": refusals,
        "samples": samples,
    }
    print(f"soak of {args.nodes} daemons for {result['minutes']} min ({result['machine']}), commit {result['commit']}")
    print(f"{'node':<8}{'rounds':>7}{'RSS MB start':>14}{'end':>8}{'max':>8}{'MB/h':>8}{'fds start':>11}{'end':>6}"
          f"{'fds/h':>8}")  # fmt: skip
    for n in per_node:
        if not n.get("samples"):
            print(f"{n['node']:<8} no samples")
            continue
        print(
            f"{n['node']:<8}{n['rounds']:>7}{n['rss_mb_start']:>14.1f}{n['rss_mb_end']:>8.1f}{n['rss_mb_max']:>8.1f}"
            f"{_fmt(n['rss_slope_mb_per_h']):>8}{n['fds_start']:>11}{n['fds_end']:>6}{_fmt(n['fds_slope_per_h']):>8}"
        )
    print(
        f"worst RSS slope {_fmt(result['worst_rss_slope_mb_per_h'])} MB/h; largest fd growth "
        f"{result['fd_growth_max']}; exit codes {sorted(set(exits.values()), key=str)}"
    )
    if attacks:
        done = [a for a in attacks if "error" not in a]
        busy = [a["honest_hello_ms"][1] for a in done if a["honest_hello_ms"][1] is not None]
        quiet = [a["honest_hello_ms"][0] for a in done if a["honest_hello_ms"][0] is not None]
        failed = sum(a["honest_hello_failed"][1] for a in done)
        print(
            f"attacks on {per_node[args.attack]['node'] if per_node else args.attack}: {len(attacks)} run"
            f" ({len(attacks) - len(done)} errors); honest Hello median ms quiet {_median(quiet)}, under attack"
            f" {_median(busy)} (max {max(busy, default=None)}), {failed} honest Hellos failed under attack;"
            f" server refusals at its last round {refusals.get(per_node[args.attack]['node']) if per_node else None}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


def _median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


if __name__ == "__main__":
    main()
