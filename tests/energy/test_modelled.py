"""The DA-DPFL-style modelled cost: arithmetic, labels, argument checks."""

from __future__ import annotations

import json

import pytest

from edge_node.energy import DeviceConstants, ModelledEnergy, modelled_energy


def test_joules_are_flops_and_bytes_times_constants() -> None:
    constants = DeviceConstants(j_per_flop=1e-9, j_per_byte_sent=3e-6, j_per_byte_received=1e-6, name="test")
    cost = modelled_energy(2e9, 1_000_000, 4_000_000, constants)
    assert isinstance(cost, ModelledEnergy) and cost.label == "modelled"
    assert (cost.compute_j, cost.send_j, cost.receive_j) == pytest.approx((2.0, 3.0, 4.0))
    assert cost.total_j == pytest.approx(9.0) and cost.communication_j == pytest.approx(7.0)
    record = json.loads(json.dumps(cost.to_dict()))
    assert record["label"] == "modelled" and record["total_j"] == pytest.approx(9.0)
    assert record["constants"]["name"] == "test"


def test_default_constants_are_documented_values() -> None:
    cost = modelled_energy(1e10, 1000, 1000)
    assert cost.constants == DeviceConstants()
    assert cost.compute_j == pytest.approx(1e10 * 2e-10)
    assert cost.send_j == pytest.approx(1000 * 2e-6) and cost.receive_j == pytest.approx(1000 * 1e-6)


def test_costs_add_up_only_with_the_same_constants() -> None:
    total = modelled_energy(1e9, 10, 20) + modelled_energy(3e9, 30, 40)
    assert (total.flops, total.bytes_sent, total.bytes_received) == (4e9, 40, 60)
    assert total.total_j == pytest.approx(modelled_energy(4e9, 40, 60).total_j)
    with pytest.raises(ValueError, match="different device constants"):
        _ = total + modelled_energy(1, 1, 1, DeviceConstants(j_per_flop=1.0))


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="flops=-1"):
        modelled_energy(-1, 0, 0)
    with pytest.raises(ValueError, match="bytes_sent=nan"):
        modelled_energy(0, float("nan"), 0)
    with pytest.raises(ValueError, match="j_per_flop=-1"):
        DeviceConstants(j_per_flop=-1e-9)
