"""capacity auto under width tiers: every tier's own narrow step is timed, and the rule takes each tier's train time."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from edge_node.cli.capacity import format_decision
from edge_node.models import TierWidth, build_model
from edge_node.node import capacity
from edge_node.node.config import NodeConfig
from edge_node.wire import ModelSpec

PROBE_S = 2.5  # the full model's window; the four narrow tiers share a second one as long
KW = dict(epochs=5, samples=500, neighbours=3, round_budget_s=60.0)


@pytest.fixture(scope="module")
def widths() -> dict[str, TierWidth]:
    return capacity.model_tier_widths("cnn", 10, (3, 32, 32), build_model("cnn", 10))


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return ModelSpec.from_tensors("cnn", 10, dict(build_model("cnn").named_parameters()))


@pytest.fixture(scope="module")
def probed(tmp_path_factory, widths, spec) -> capacity.CapacityDecision:
    """One real width-mode probe of the demo cnn (shared by the tests: about 2 x PROBE_S)."""
    from edge_node.node.local_data import load_local_data

    state = tmp_path_factory.mktemp("state")
    config = NodeConfig(fleet="f", num_clients=6, client_index=0, state_dir=state, tier_mode="width")
    local = load_local_data(config, 0, torch.device("cpu"))
    return capacity.measure(config, local, spec, torch.device("cpu"), widths=widths, probe_s=PROBE_S)


def _measured(tiers: tuple[capacity.TierSpeed, ...] = (), link: float | None = None) -> capacity.Measurements:
    return capacity.Measurements(1000.0, 10, 1.0, 128, 0.1, 1.2, 50 << 20, 8 << 30, 4, 4, "none", link, "test",
                                 tiers=tiers)  # fmt: skip


def _speeds(widths: dict[str, TierWidth], ratios: dict[str, float], full_rate: float = 100.0):
    return tuple(
        capacity.TierSpeed(name, w.width, w.flop_share, full_rate / ratios[name], ratios[name], "probe", 3, 128)
        for name, w in widths.items()
    )


def test_width_mode_times_every_tiers_own_narrow_step(probed):
    m = probed.measurements
    assert m is not None
    tiers = {t.tier: t for t in m.tiers}
    assert list(tiers) == ["0.2", "0.4", "0.6", "0.8", "1.0"]
    assert all(t.source == "probe" and t.probe_steps >= 1 for t in m.tiers)
    # Every tier steps on one batch size (per-sample speeds compare), the full model too, in turns; a tier's speed is
    # the full model's window's over its step ratio in the turns.
    assert len({t.probe_batch_size for t in m.tiers}) == 1 and m.tiers[0].probe_batch_size <= m.probe_batch_size
    assert tiers["1.0"].step_ratio == 1.0 and tiers["1.0"].train_samples_per_s == m.train_samples_per_s
    for t in m.tiers:
        assert t.train_samples_per_s == pytest.approx(m.train_samples_per_s / t.step_ratio)
    # Tier 0.2 is cnn at width ~0.36 (~0.19 of its FLOPs): about 2-4x the full model's samples/s on this machine.
    # Only "faster" is asserted: both are real timings on a CPU other programs share (in turns, so under the same
    # load); a narrow model measured slower than the full one would mean the narrow step was not what was timed.
    assert tiers["0.2"].train_samples_per_s > tiers["1.0"].train_samples_per_s, m.tiers
    # The rule takes each tier's own train time: epochs x samples over the tier's samples/s.
    checks = {c.density: c for c in probed.checks}
    work = {round(checks[float(t.tier)].train_s * t.train_samples_per_s, 6) for t in m.tiers}
    assert len(work) == 1, work
    assert checks[0.2].train_s < checks[1.0].train_s


def test_the_width_probe_takes_at_most_about_twice_a_mask_probe(probed):
    """The tiers take turns in a second window as long as the full model's first one ran, their warm-ups in it; a
    step starts only while its last duration still fits and a first turn always runs, so the turns take at most
    what the warm-ups left of the window, or one turn (sized to a quarter of the window from the first window's
    speed). A turn of slack: a step under load can run longer than its last one."""
    m = probed.measurements
    assert m is not None
    turn = sum(t.probe_s / t.probe_steps for t in m.tiers)  # one step of every tier (their mean steps)
    left = m.probe_s - sum(t.warmup_s for t in m.tiers)
    assert sum(t.probe_s for t in m.tiers) <= max(left, turn) + turn, m.tiers
    assert m.probe_total_s >= m.probe_s + sum(t.probe_s + t.warmup_s for t in m.tiers) - 0.01  # the total has them


def test_capacity_prints_and_jsons_every_tiers_speed(probed):
    text = format_decision(probed)
    assert "tier  width  FLOP share  samples/s" in text
    for t in probed.measurements.tiers:
        assert f"{t.tier:>4}  {t.width:5.2f}" in text
    tiers = json.loads(json.dumps(probed.to_json()))["measurements"]["tiers"]
    assert [t["tier"] for t in tiers] == ["0.2", "0.4", "0.6", "0.8", "1.0"]


def test_mask_mode_is_as_it_was(spec):
    decision = capacity.choose_tier(_measured(link=1.0), spec, **KW)
    assert len({c.train_s for c in decision.checks}) == 1  # dense kernels: one train time for every tier
    fields = {f.name for f in dataclasses.fields(capacity.Measurements)} - {"tiers"}
    assert set(decision.to_json()["measurements"]) == fields  # no width figures in a mask-mode JSON
    assert "tier  width" not in format_decision(decision)


def test_a_width_tier_pulls_its_narrow_model(widths, spec):
    """Transfer: the tier's narrow model's bytes (with --density's mask inside under both), not a mask of the
    tier's density over the full model."""
    measured = _measured(_speeds(widths, {name: 1.0 for name in widths}), link=1.0)
    width = capacity.choose_tier(measured, spec, **KW, widths=widths)
    both = capacity.choose_tier(measured, spec, **KW, widths=widths, mask_density=0.5)
    mask = capacity.choose_tier(measured, spec, **KW)
    t_width, t_both, t_mask = ({c.density: c.transfer_s for c in d.checks} for d in (width, both, mask))
    assert t_width[1.0] == pytest.approx(t_mask[1.0])  # tier 1.0 of width mode is the dense full model
    narrow_02 = ModelSpec("cnn", 10, widths["0.2"].shapes)
    assert t_width[0.2] == pytest.approx(3 * capacity.model_bytes_at(narrow_02, 1.0) * 8 / 1e6)
    assert t_both[0.2] < t_width[0.2] < t_width[1.0]


def test_a_round_is_scaled_by_the_probes_ratios_or_else_by_flop_shares_called_an_estimate(widths, spec):
    ratios = {"0.2": 0.25, "0.4": 0.5, "0.6": 0.7, "0.8": 0.85, "1.0": 1.0}
    start = _measured(_speeds(widths, ratios))
    cpu = torch.device("cpu")
    # The round ran tier 0.4 at 200 samples/s: the full model's is 100, tier 0.2's 400.
    again = capacity.from_round(200.0, (), cpu, start, tier="0.4", widths=widths)
    speeds = {t.tier: t for t in again.tiers}
    assert again.train_samples_per_s == pytest.approx(100.0)
    assert speeds["0.2"].train_samples_per_s == pytest.approx(400.0)
    assert speeds["0.4"].source == "round" and speeds["0.2"].source == "round x probe ratio"
    decision = capacity.choose_tier(again, spec, **KW, widths=widths, source="remeasured")
    assert "estimate" not in decision.decided_by
    # Resumed without a probe: the FLOP shares scale it, and the decision says it is an estimate.
    resumed = capacity.from_round(200.0, (), cpu, None, tier="0.4", widths=widths)
    speeds = {t.tier: t for t in resumed.tiers}
    assert speeds["1.0"].train_samples_per_s == pytest.approx(200.0 * widths["0.4"].flop_share)
    assert speeds["0.2"].source == "round x FLOP share (estimate)"
    decision = capacity.choose_tier(resumed, spec, **KW, widths=widths, source="remeasured")
    assert "estimates from their dense FLOP shares, not measurements" in decision.decided_by
    # The next re-decision carries the ratios on: a probe's stay the probe's, an estimate stays an estimate.
    assert {t.source for t in capacity.from_round(90.0, (), cpu, again, tier="0.2", widths=widths).tiers} == {
        "round",
        "round x probe ratio",
    }
    later = capacity.from_round(90.0, (), cpu, resumed, tier="0.2", widths=widths)
    assert {t.source for t in later.tiers} == {"round", "round x FLOP share (estimate)"}
    # Mask mode: the round's throughput as it is, no tiers.
    assert capacity.from_round(200.0, (), cpu, start).tiers == ()


def test_a_width_rule_without_every_tiers_speed_is_a_bug_not_a_guess(widths, spec):
    with pytest.raises(ValueError, match="every tier's speed"):
        capacity.choose_tier(_measured(), spec, **KW, widths=widths)
    with pytest.raises(ValueError, match="tier_widths"):
        capacity.from_round(1.0, (), torch.device("cpu"), None, tier="0.4")
