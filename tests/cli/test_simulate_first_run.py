"""The README's first run, ``edge-node simulate`` with no flag: small enough for a minute on 2 cores, and it learns;
in a pipe a long round still says how far it is."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from edge_node.cli.simulate import _client_lines
from edge_node.data.demo import DEMO_TRAIN_PER_CLASS
from edge_node.sim.config import SimConfig
from tests.daemons import run_cli

DEMO_TRAIN = 10 * DEMO_TRAIN_PER_CLASS


def test_the_default_run_is_sized_for_a_first_run():
    """At most 6,000 training samples per round (the old defaults: 30,000, 330 s for one round on 2 loaded
    cores) and at least 40 SGD steps per client and round (fewer stayed at the class prior)."""
    config = SimConfig()
    per_client = DEMO_TRAIN // config.clients
    assert config.dataset == "demo" and config.rounds <= 5
    assert config.clients * per_client * config.epochs <= 6_000
    assert math.ceil(per_client / config.batch_size) * config.epochs >= 40


def test_a_long_round_prints_progress_lines_without_bars(capsys):
    line = _client_lines(SimConfig(rounds=5), every_s=0.0)
    for done in (1, 2, 3, 4):
        line(1, done, 4)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "round 2/5: 1 of 4 clients, 0 s" or re.fullmatch(r"round 2/5: 1 of 4 clients, \d+ s", err[0])
    assert len(err) == 3  # the last client's line is the round's own line


@pytest.mark.slow
def test_the_first_run_learns_and_says_so_in_a_pipe(tmp_path: Path):
    result = run_cli(["simulate", "--output", str(tmp_path / "first"), "--energy-backend", "estimate"],
                     timeout_s=1200, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rounds = [float(m) for m in re.findall(r"^round \d/5: acc ([\d.]+)%", result.stderr, re.MULTILINE)]
    assert len(rounds) == 5, result.stderr[-3000:]
    assert rounds[-1] > rounds[0] + 10, rounds  # measured: 35.4 -> 57.1
