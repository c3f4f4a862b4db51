"""Summary statistics the benchmarks report over seeds and repeats."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence


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


def compare_accuracies(
    acc: Mapping[str, Sequence[float]], new: str, base: str, key: Callable[[str], str]
) -> dict:
    """Two sides' accuracies over runs, compared.

    Returns, rounded to 4 places: each side's mean under `key(side)` and its
    standard deviation under `key(side) + "_std"`, then `accuracy_diff` (new -
    base) with `accuracy_diff_se`, and `within_seed_noise` (|diff| <= 2 SE).
    The spreads, the SE and the judgement are None with one run on a side.
    """
    out: dict = {}
    for side, values in acc.items():
        mean, std = mean_std(values)
        out[key(side)] = round(mean, 4)
        out[key(side) + "_std"] = None if std is None else round(std, 4)
    diff = statistics.fmean(acc[new]) - statistics.fmean(acc[base])
    se = diff_se(acc[new], acc[base])
    out["accuracy_diff"] = round(diff, 4)
    out["accuracy_diff_se"] = None if se is None else round(se, 4)
    out["within_seed_noise"] = None if se is None else abs(diff) <= 2 * se
    return out
