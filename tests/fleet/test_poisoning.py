"""A poisoned loopback fleet: attackers only through ``loopback``, named in every record and the summary, and the
robust setting's distance check refusing a sign-flipped peer (a counted refusal, kind ``distance``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edge_node.cli.loopback import POISONED_LAUNCHER
from edge_node.errors import ConfigError
from edge_node.fleet.config import FleetConfig
from edge_node.fleet.fleet import Fleet
from edge_node.fleet.summary import summarize
from tests.fleet.fleets import config, records, run_cli, run_to_end


def test_a_sign_flipped_attacker_is_named_everywhere_and_refused_by_distance(tmp_path):
    settings = dict(nodes=3, rounds=2, lockstep=True, neighbours=2, capacity="0.6", batch_size=32,
                    attackers=1, attack="sign-flip", aggregate="median")  # fmt: skip
    with Fleet(config(tmp_path / "fleet", **settings), poisoned_launcher=POISONED_LAUNCHER) as fleet:
        run_to_end(fleet)
        per_node = {d.node_id: records(fleet, d.node_id) for d in fleet.own_daemons()}
        argv = [d.argv for d in fleet.own_daemons()]
    assert all("edge_node.cli._attacker" in a for a in argv)
    for node, recs in per_node.items():
        assert [r["round"] for r in recs] == [0, 1]
        for r in recs:
            assert r["attackers"] == ["node2"] and r["attack"] == "sign-flip"
            if node != "node2":  # both others are pulled every round: the attacker is refused, the honest kept
                assert r["refusals"] == {"distance": 1}, r["peers_refused"]
                assert r["peers_refused"]["node2"]["detail"].startswith("distance:")
                assert r["peers_answered"] == [n for n in ("node0", "node1") if n != node]
    summary = summarize({}, per_node, {n: 0 for n in per_node}, {n: 1 for n in per_node})
    assert summary["attackers"] == ["node2"] and summary["attack"] == "sign-flip"
    honest = [per_node[n][-1]["acc_after"] for n in ("node0", "node1")]
    assert summary["acc_final_honest_mean"] == pytest.approx(sum(honest) / 2)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"attackers": 3, "attack": "zero"}, "below the fleet's 3 nodes"),
        ({"attackers": -1, "attack": "zero"}, "integer >= 0"),
        ({"attackers": 1, "attack": "flip"}, "must be one of"),
        ({"attackers": 1, "attack": "scale:inf"}, "finite number above 0"),
        ({"attackers": 1, "attack": "scale:0"}, "finite number above 0"),
        ({"attackers": 1, "attack": "stale:6", "rounds": 5}, "beyond the run's 5 rounds"),
        ({"attack": "zero"}, "needs --attackers"),
        ({"attackers": 1}, "needs --attack"),
        ({"aggregate": "trimmed:0.5"}, "must be a number in"),
        ({"attackers": 1, "attack": "label-flip", "task": "regression"}, "has none"),
    ],
)
def test_bad_poisoning_settings_are_refused_before_anything_starts(tmp_path, settings, match):
    with pytest.raises(ConfigError, match=match):
        FleetConfig(nodes=3, output=tmp_path / "out", **settings)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["start", "--attack", "sign-flip"], "No such option '--attack'"),
        (["start", "--aggregate", "trimmed:-1"], "must be a number in"),
        (["loopback", "--nodes", "3", "--attackers", "3", "--attack", "zero"], "below the fleet's 3 nodes"),
    ],
)
def test_bad_poisoning_flags_are_one_line_and_exit_2(tmp_path, args, match):
    result = run_cli([*args, "--output" if args[0] == "loopback" else "--state-dir", str(tmp_path / "out")])
    assert result.returncode == 2, result.stderr
    assert match in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()  # nothing written


def test_only_the_loopback_command_starts_a_poisoned_fleet(tmp_path):
    with pytest.raises(ConfigError, match="started by edge-node loopback"):
        Fleet(config(tmp_path / "fleet", nodes=3, attackers=1, attack="zero"))


def test_start_config_file_accepts_no_attack(tmp_path):
    (tmp_path / "node.toml").write_text('attack = "sign-flip"\nattackers = ["node0"]\n')
    result = run_cli(["start", "--config", str(tmp_path / "node.toml"), "--state-dir", str(tmp_path / "out")])
    assert result.returncode == 2 and "attack" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_the_attacker_entry_refuses_a_node_outside_the_loopback_fleet(tmp_path):
    argv = [sys.executable, "-m", "edge_node.cli._attacker", "n1", "sign-flip", "start",
            "--listen", "192.168.1.5:7000", "--state-dir", str(tmp_path / "n1")]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "only for a loopback fleet" in result.stderr
    assert not (tmp_path / "n1").exists()
