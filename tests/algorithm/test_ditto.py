"""Ditto's split of a round's steps between the global and the personal model."""

import pytest

from edge_node.algorithm.ditto import LAMBDA, PERSONAL_SHARE, split_steps, steps_per_epoch
from edge_node.errors import ConfigError


def test_the_papers_setup_splits_five_epochs_into_two_global_and_three_personal():
    assert (LAMBDA, PERSONAL_SHARE) == (0.5, 0.6)
    per_epoch = steps_per_epoch(500, 128)  # the FedSpa paper's 500 samples, batch 128: 4 steps
    assert per_epoch == 4
    assert split_steps(5 * per_epoch, PERSONAL_SHARE) == (2 * per_epoch, 3 * per_epoch)


def test_a_short_round_keeps_the_share_and_gives_each_model_a_step():
    assert split_steps(16, 0.6) == (6, 10)  # 9.6 rounded
    assert split_steps(2, 0.99) == (1, 1)
    assert split_steps(2, 0.01) == (1, 1)
    assert split_steps(1, 0.6) == (0, 1)


@pytest.mark.parametrize("steps, share", [(0, 0.6), (5, 0.0), (5, 1.0), (5, float("nan"))])
def test_bad_splits_are_refused(steps, share):
    with pytest.raises(ConfigError):
        split_steps(steps, share)
