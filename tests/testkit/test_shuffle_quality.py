"""`testkit.shuffle_quality` against orders computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from testkit import shuffle_quality as sq


def test_rank_correlation_of_kept_reversed_and_hand_computed_orders():
    assert sq.rank_correlation([0, 1, 2, 3, 4]) == pytest.approx(1.0)
    assert sq.rank_correlation([4, 3, 2, 1, 0]) == pytest.approx(-1.0)
    # d = position - rank: [1, -1, 1, -1, 0]; rho = 1 - 6 * 4 / (5 * 24) = 0.8.
    assert sq.rank_correlation([1, 0, 3, 2, 4]) == pytest.approx(0.8)
    # Ids need not start at 0 or be contiguous: only their order counts.
    assert sq.rank_correlation([10, 30, 20]) == pytest.approx(0.5)


def test_neighbour_distance_of_hand_computed_orders():
    # Steps of 1 over an expectation of (5 + 1) / 3 = 2.
    assert sq.neighbour_distance([0, 1, 2, 3, 4]) == pytest.approx(0.5)
    # |2-0| + |4-2| + |1-4| + |3-1| = 9 over 4 steps = 2.25; / 2.
    assert sq.neighbour_distance([0, 2, 4, 1, 3]) == pytest.approx(1.125)


def test_a_random_permutation_scores_as_chance():
    ids = np.random.default_rng(3).permutation(20_000)
    assert abs(sq.rank_correlation(ids)) < 2 / np.sqrt(len(ids))
    assert sq.neighbour_distance(ids) == pytest.approx(1.0, abs=0.02)
    labels = ids * 10 // len(ids)  # labels sorted in file order, delivered shuffled
    assert abs(sq.label_autocorrelation(labels)) < 0.02
    assert sq.batch_majority_share(labels, 32) == pytest.approx(
        sq.random_batch_majority_share(labels, 32), abs=0.01
    )


def test_labels_in_runs_are_autocorrelated_and_batches_one_class():
    labels = [0] * 8 + [1] * 8  # one change in 15 steps
    # Class 0's indicator over lags: a = 8 ones then 7 zeros, b = 7 ones then 8 zeros.
    a = np.array([1] * 8 + [0] * 7, float)
    b = np.array([1] * 7 + [0] * 8, float)
    by_hand = np.corrcoef(a, b)[0, 1]  # the same for class 1's indicator
    assert sq.label_autocorrelation(labels) == pytest.approx(by_hand)
    assert sq.label_autocorrelation([0, 1] * 8) == pytest.approx(-1.0)
    assert sq.batch_majority_share(labels, 4) == 1.0
    assert sq.batch_majority_share([0, 1, 0, 1, 0, 0, 2, 2], 4) == pytest.approx((0.5 + 0.5) / 2)


def test_too_short_an_epoch_or_batch_is_an_error():
    with pytest.raises(ValueError, match="at least 3"):
        sq.rank_correlation([0, 1])
    with pytest.raises(ValueError, match="fewer labels"):
        sq.batch_majority_share([0, 1, 2], 4)
