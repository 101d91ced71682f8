"""What a round costs when the device's application takes cores: thread policies side by side.

Runs ``edge-node simulate`` (the demo set, 4 clients, ``--rounds`` rounds) under each thread policy while
``--busy`` other processes spin (an application taking that many cores), and prints the median seconds per
round (the records' ``wall_s``, round 1 left out as warm-up) and each figure's ratio to the same policy on
an idle machine and to the ``default`` policy under the same load. Every cell runs ``--repeats`` times,
cells interleaved, so that a busy machine slows each alike.

A policy is NAME=SETTINGS: ``ENV=VALUE`` words go into the command's environment (what torch reads as it
loads), the others are ``edge-node simulate`` flags.

    .venv/bin/python bench/shared_cores.py                    # idle, 1 busy core; default, --threads 1, PASSIVE
    .venv/bin/python bench/shared_cores.py --busy 0 1 2 --repeats 3
    .venv/bin/python bench/shared_cores.py --policy 'auto=' --policy 'torch=--threads 2 OMP_WAIT_POLICY=ACTIVE'
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


def round_seconds(policy: tuple[str, list[str], dict[str, str]], rounds: int, out: Path) -> float:
    """The median ``wall_s`` of rounds 2.. of one ``edge-node simulate`` run under ``policy``."""
    _, flags, env = policy
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(Path(sys.executable).with_name("edge-node")), "simulate", "--clients", "4", "--rounds", str(rounds),
           "--output", str(out), "--no-progress", *flags]  # fmt: skip
    run_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    subprocess.run(cmd, check=True, env={**run_env, **env}, capture_output=True, timeout=1800)
    walls = [json.loads(line)["wall_s"] for line in (out / "rounds.jsonl").read_text().splitlines() if line.strip()]
    return statistics.median(walls[1:] or walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1], help="other processes spinning (cores taken)")
    parser.add_argument(
        "--policy", action="append", help="NAME=SETTINGS (repeatable); default: " + ", ".join(DEFAULT_POLICIES)
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
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
                        seconds = round_seconds(policy, args.rounds, Path(tmp) / "run")
                        cells.setdefault((busy, policy[0]), []).append(seconds)
                        print(f"repeat {repeat + 1}, busy {busy}, {policy[0]}: {seconds:.2f} s/round", file=sys.stderr)
                finally:
                    for spinner in spinners:
                        spinner.kill()
                        spinner.wait()
    print(f"# {machine()}; commit {commit()}; demo, 4 clients, median s/round of rounds 2-{args.rounds}, "
          f"{args.repeats} repeats (median)")  # fmt: skip
    print("| busy cores | policy | s/round | vs idle | vs default |")
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
