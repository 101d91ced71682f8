"""The receive-path screen in the simulation: the same rule a device applies before aggregating.

A client whose model is blown up (its checkpointed weights scaled by 1e4, as a hostile or broken peer
would send) is refused by every neighbour that pulls it when the screen is on, and aggregated when it is
off; an honest run refuses nobody, so the screen changes nothing there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edge_node.algorithm import robust
from edge_node.checkpoint_io import load_payload, save_payload
from edge_node.cli import main
from edge_node.records import per_node

SMALL = [
    "simulate", "--dataset", "demo", "--clients", "4", "--neighbours", "3", "--epochs", "1",
    "--samples-per-client", "100", "--batch-size", "32", "--no-progress", "--energy-backend", "estimate",
]  # fmt: skip


def _run(args: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code in (0, None)


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_round(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("screen") / "run"
    _run([*SMALL, "--rounds", "1", "--output", str(out)])
    return out


def _blow_up_client_0(run: Path) -> None:
    path = run / "checkpoint.pt"
    payload = load_payload(path, what="simulation checkpoint")
    payload["values"][0] = {k: v * 1e4 for k, v in payload["values"][0].items()}
    save_payload(path, payload)


def test_an_honest_run_refuses_nobody(one_round: Path):
    (record,) = _records(one_round)
    assert record["screen"] is True and record["screen_refusals"] == 0 and record["screen_refused"] == {}


def _resume_blown_up(one_round: Path, run: Path, *, screen: bool) -> dict:
    """Round 2 of ``one_round`` with client 0's model blown up, with or without the screen."""
    shutil.copytree(one_round, run)
    _blow_up_client_0(run)
    if not screen:  # a run's settings are fixed; --no-screen is another run resumed from the same state
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**config, "screen": False}))
        payload = load_payload(run / "checkpoint.pt", what="simulation checkpoint")
        payload["config"]["screen"] = False
        save_payload(run / "checkpoint.pt", payload)
    _run([*SMALL, "--rounds", "2", "--output", str(run), *([] if screen else ["--no-screen"])])
    return _records(run)[1]


def test_a_blown_up_client_is_refused_by_every_puller_only_with_the_screen(one_round: Path, tmp_path: Path):
    screened = _resume_blown_up(one_round, tmp_path / "screened", screen=True)
    unscreened = _resume_blown_up(one_round, tmp_path / "unscreened", screen=False)
    # 4 clients, 3 neighbours each: everybody pulls everybody, so clients 1-3 all pull client 0.
    refused = screened["screen_refused"]
    assert refused.keys() == {"client-1", "client-2", "client-3"} and screened["screen_refusals"] == 3, refused
    assert all(set(r) == {"client-0"} for r in refused.values())
    reason = refused["client-1"]["client-0"]
    assert "rms" in reason or "max |w|" in reason, reason
    assert unscreened["screen"] is False and unscreened["screen_refusals"] is None
    assert unscreened["screen_refused"] is None
    # Without it every puller averaged weights 1e4 too large into its own model, and it shows.
    kept = sum(per_node(screened, "acc_after")[1:]) / 3
    spoiled = sum(per_node(unscreened, "acc_after")[1:]) / 3
    assert kept > spoiled + 0.1, (per_node(screened, "acc_after"), per_node(unscreened, "acc_after"))


def test_a_round_computes_each_published_models_statistics_once(tmp_path: Path, monkeypatch):
    """Each of the 4 clients screens its 3 neighbours' models and its own: 16 screenings of 4 models a round,
    whose statistics (which depend on the model alone) a round computes once each."""
    computed: list[int] = []
    real = robust.model_stats
    monkeypatch.setattr(robust, "model_stats", lambda w, m, names: computed.append(id(w)) or real(w, m, names))
    _run([*SMALL, "--rounds", "2", "--output", str(tmp_path / "run")])
    assert len(computed) == 2 * 4, computed
    assert [r["screen_refusals"] for r in _records(tmp_path / "run")] == [0, 0]
