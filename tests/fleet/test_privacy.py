"""A lock-step fleet of real daemons under ``--privacy dp-sgd``: every round record and status carry the budget
spent so far, it grows round by round as Opacus's accountant says, and a node whose budget is spent stops
training and publishing (its snapshot stays at the last private round) while it keeps serving."""

from __future__ import annotations

import json
import math

from edge_node.algorithm.dp import noise_multiplier_for, spent_epsilon
from edge_node.cli.status import format_status
from edge_node.fleet.fleet import Fleet
from edge_node.node.status import STATUS_FILE
from tests.fleet.fleets import config, records, wait_until

EPSILON, DELTA, PLANNED, BATCH = 4.0, 1e-5, 2, 32


def test_dp_sgd_daemons_report_the_budget_and_stop_publishing_when_it_is_spent(tmp_path):
    args = ("--privacy", "dp-sgd", "--epsilon", str(EPSILON), "--delta", str(DELTA))
    settings = dict(nodes=2, rounds=PLANNED + 2, planned_rounds=PLANNED, lockstep=True, neighbours=1, seed=2,
                    capacity="0.6", batch_size=BATCH, round_budget_s=60.0, daemon_args=args)  # fmt: skip
    out = tmp_path / "fleet"
    with Fleet(config(out, **settings)) as fleet:
        fleet.start()

        def spent_everywhere() -> bool:
            files = [out / d.node_id / STATUS_FILE for d in fleet.own_daemons()]
            return all(f.exists() and json.loads(f.read_text()).get("phase") == "budget-spent" for f in files)

        wait_until(fleet, spent_everywhere, 300, "out of budget on every node")
        per_node = {d.node_id: records(fleet, d.node_id) for d in fleet.own_daemons()}
        statuses = {d.node_id: json.loads((out / d.node_id / STATUS_FILE).read_text()) for d in fleet.own_daemons()}
        assert all(d.running for d in fleet.own_daemons())  # still serving its last model
    for node_id, recs in per_node.items():
        assert [r["round"] for r in recs] == list(range(PLANNED)), node_id  # no round past the budget
        spent = [r["dp_epsilon_spent"] for r in recs]
        assert 0 < spent[0] < spent[1] <= EPSILON and spent[1] > 0.8 * EPSILON
        samples = recs[0]["samples"]
        q, per_round = BATCH / samples, math.ceil(samples / BATCH)
        z = noise_multiplier_for(EPSILON, DELTA, q, PLANNED * per_round)
        assert recs[0]["dp_noise_multiplier"] == z
        assert spent == [spent_epsilon(z, q, (t + 1) * per_round, DELTA) for t in range(PLANNED)]
        status = statuses[node_id]
        assert status["rounds_done"] == PLANNED and status["privacy"]["dp_budget_left"] is False
        assert status["privacy"]["dp_epsilon_spent"] == spent[-1]
        assert "SPENT: no new models are published" in format_status(status)
