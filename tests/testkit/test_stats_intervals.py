"""The benchmarks' intervals against values computed by hand (numbers written here)."""

from __future__ import annotations

import pytest

from testkit import stats


def test_abba_order_alternates_which_side_runs_first():
    assert stats.abba_order(4, "stock", "swapped") == [
        ("stock", "swapped"),
        ("swapped", "stock"),
        ("stock", "swapped"),
        ("swapped", "stock"),
    ]


def test_cases_alternate_their_order_repeat_by_repeat():
    assert stats.alternating_order(["stock", "ours", "limit"], 4) == [
        ["stock", "ours", "limit"],
        ["limit", "ours", "stock"],
        ["stock", "ours", "limit"],
        ["limit", "ours", "stock"],
    ]


def test_paired_t_interval_matches_a_hand_computation():
    # Differences 1, 2, 3: mean 2, sd 1, se 1/sqrt(3) = 0.57735; t(0.975, 2) = 4.302653.
    mean, low, high = stats.t_interval([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0)
    assert low == pytest.approx(2.0 - 4.302653 * 0.577350, abs=1e-5)
    assert high == pytest.approx(2.0 + 4.302653 * 0.577350, abs=1e-5)


def test_ratio_interval_is_the_geometric_mean_with_its_log_interval():
    # Ratios 0.5 and 2: logs -0.693147 and 0.693147, mean 0 -> geometric mean 1;
    # sd 0.980258, se 0.693147, t(0.975, 1) = 12.706205: exp(+-8.807270).
    gmean, low, high = stats.ratio_interval([0.5, 2.0])
    assert gmean == pytest.approx(1.0)
    assert low == pytest.approx(1.4964e-4, rel=1e-3)
    assert high == pytest.approx(6682.65, rel=1e-4)


def test_one_pair_gives_no_interval():
    with pytest.raises(
        stats.TooFewError, match=r"ratio_interval: 1 value\(s\); an interval needs at least 2"
    ):
        stats.ratio_interval([0.8])
    with pytest.raises(stats.TooFewError):
        stats.t_interval([0.01])


def test_equivalence_by_two_one_sided_tests():
    # new 0.80, 0.81, 0.82 and base 0.80, 0.80, 0.81: diff 0.006667; variances
    # 1e-4 / 3 and 3.3333e-5 / 3: se 0.006667; Welch df 3.2 -> 3, t(0.95, 3) = 2.353363.
    result = stats.equivalent([0.80, 0.81, 0.82], [0.80, 0.80, 0.81], margin=0.05)
    assert result["diff"] == pytest.approx(0.006667, abs=1e-6)
    low, high = result["interval"]
    assert low == pytest.approx(0.006667 - 2.353363 * 0.006667, abs=1e-5)
    assert high == pytest.approx(0.006667 + 2.353363 * 0.006667, abs=1e-5)
    assert result["equivalent"] is True
    assert (
        stats.equivalent([0.80, 0.81, 0.82], [0.80, 0.80, 0.81], margin=0.01)["equivalent"] is False
    )
