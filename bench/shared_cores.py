"""What a round costs when the device's application takes cores: thread policies side by side.

Runs ``edge-node simulate`` (the demo set, 4 clients, ``--rounds`` rounds) under each thread policy while
``--busy`` other processes spin (an application taking that many cores), and prints the median seconds per
round (the records' ``wall_s``, round 1 left out as warm-up) and each figure's ratio to the same policy on
an idle machine and to the first policy under the same load. Every cell runs ``--repeats`` times,
cells interleaved, so that a busy machine slows each alike.

With ``--daemon`` each cell is one ``edge-node start`` node instead (client 0 of the same 4-client demo
fleet, the same epochs, batch and density 0.6 as the demo preset, no peers): a round's seconds are its
training, aggregation and communication phases (the records' ``seconds``; a node without peers also pauses
1 s between rounds, which is left out).

A policy is NAME=SETTINGS: ``ENV=VALUE`` words go into the command's environment (what torch reads as it
loads), the others are ``edge-node simulate`` flags.

    .venv/bin/python bench/shared_cores.py                    # idle, 1 busy core; default, --threads 1, PASSIVE
    .venv/bin/python bench/shared_cores.py --busy 0 1 2 --repeats 3
    .venv/bin/python bench/shared_cores.py --policy 'auto=' --policy 'torch=--threads 2 OMP_WAIT_POLICY=ACTIVE'
    .venv/bin/python bench/shared_cores.py --daemon --busy 0 1 2 --policy 'policy=' --policy 'torch=--threads 2'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _provenance import commit, machine

SPIN = "while True: pass"
DEFAULT_POLICIES = ("default=", "threads1=--threads 1", "passive=OMP_WAIT_POLICY=PASSIVE")


def parse_policy(text: str) -> tuple[str, list[str], dict[str, str]]:
    """``NAME=SETTINGS`` as the name, its simulate flags and its environment."""
    name, _, settings = text.partition("=")
    flags: list[str] = []
    env: dict[str, str] = {}
    for word in settings.split():
        key, eq, value = word.partition("=")
        if eq and key.isupper() and not key.startswith("-"):
            env[key] = value
        else:
            flags.append(word)
    return name, flags, env


DAEMON = ["--fleet", "bench", "--num-clients", "4", "--client-index", "0", "--epochs", "1", "--batch-size", "32",
          "--capacity", "0.6", "--discovery", "static", "--peers", "127.0.0.1:1", "--insecure", "--no-export-onnx",
          "--energy-backend", "estimate", "--listen", "127.0.0.1:0"]  # fmt: skip
ROUND_PHASES = ("train", "aggregate", "communicate")  # a daemon's round, without the pause of a node without peers


def round_seconds(policy: tuple[str, list[str], dict[str, str]], rounds: int, out: Path, daemon: bool) -> float:
    """The median seconds of rounds 2.. of one ``edge-node simulate`` run (or one node's, ``daemon``) under
    ``policy``."""
    _, flags, env = policy
    shutil.rmtree(out, ignore_errors=True)
    edge_node = str(Path(sys.executable).with_name("edge-node"))
    if daemon:
        cmd = [edge_node, "start", *DAEMON, "--rounds", str(rounds), "--state-dir", str(out), *flags]
    else:
        cmd = [edge_node, "simulate", "--clients", "4", "--rounds", str(rounds), "--output", str(out), "--no-progress",
               *flags]  # fmt: skip
    run_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    subprocess.run(cmd, check=True, env={**run_env, **env}, capture_output=True, timeout=1800)
    records = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines() if line.strip()]
    walls = [sum(r["seconds"][p] for p in ROUND_PHASES) if daemon else r["wall_s"] for r in records]
    return statistics.median(walls[1:] or walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1], help="other processes spinning (cores taken)")
    parser.add_argument(
        "--policy", action="append", help="NAME=SETTINGS (repeatable); default: " + ", ".join(DEFAULT_POLICIES)
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--daemon", action="store_true", help="time one edge-node start node, not a simulation")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    policies = [parse_policy(p) for p in (args.policy or DEFAULT_POLICIES)]
    cells: dict[tuple[int, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for busy in args.busy:
                spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
                try:
                    for policy in policies:
                        seconds = round_seconds(policy, args.rounds, Path(tmp) / "run", args.daemon)
                        cells.setdefault((busy, policy[0]), []).append(seconds)
                        print(f"repeat {repeat + 1}, busy {busy}, {policy[0]}: {seconds:.2f} s/round", file=sys.stderr)
                finally:
                    for spinner in spinners:
                        spinner.kill()
                        spinner.wait()
    what = "one edge-node start node (client 0 of 4)" if args.daemon else "edge-node simulate, 4 clients"
    print(f"# {machine()}; commit {commit()}; demo, {what}, median s/round of rounds 2-{args.rounds}, "
          f"{args.repeats} repeats (median)")  # fmt: skip
    print(f"| busy cores | policy | s/round | vs idle | vs {policies[0][0]} |")
    print("|---|---|---|---|---|")
    table = []
    for busy in args.busy:
        for name, _, _ in policies:
            seconds = statistics.median(cells[(busy, name)])
            idle = statistics.median(cells[(args.busy[0], name)])
            default = statistics.median(cells[(busy, policies[0][0])])
            table.append({"busy": busy, "policy": name, "s_per_round": seconds, "runs": cells[(busy, name)]})
            print(f"| {busy} | {name} | {seconds:.2f} | {seconds / idle:.2f}x | {seconds / default:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "commit": commit(), "cells": table}, indent=1))


if __name__ == "__main__":
    main()
