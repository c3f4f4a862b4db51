"""The ingestion benchmark's conventions: per-repeat ratios, medians and ranges (the
interleaved order is `stats.alternating_order`, tested with the stats)."""

from __future__ import annotations

import pytest

from benchmarks.ingestion import ratio, spread


def test_a_ratio_is_the_geometric_mean_of_per_repeat_ratios_with_its_interval():
    # Per-repeat ratios 2.0, 2.2, 2.4: their logs have mean 0.78567 and standard
    # deviation 0.09119; t(0.975, 2 df) = 4.3027, so the interval on the logs is
    # 0.78567 +- 0.22653: exp gives 2.194 [1.749, 2.752].
    assert ratio([2.0, 4.4, 7.2], [1.0, 2.0, 3.0]) == [2.194, 1.749, 2.752]


def test_one_repeat_gives_no_interval():
    with pytest.raises(ValueError, match="at least 2"):
        ratio([2.0], [1.0])


def test_spread_reports_median_and_range():
    assert spread([3.0, 1.0, 2.0]) == {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
        "runs": [3.0, 1.0, 2.0],
    }
