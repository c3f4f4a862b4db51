"""Summary statistics the benchmarks report over seeds and repeats."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1); the spread of one value is None, not 0."""
    values = [float(v) for v in values]
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def diff_se(*samples: Sequence[float]) -> float | None:
    """Standard error of a difference of means of independent samples
    (sqrt of the sum of var / n); None when a sample has fewer than 2 values."""
    if any(len(s) < 2 for s in samples):
        return None
    return math.sqrt(sum(statistics.variance(s) / len(s) for s in samples))
