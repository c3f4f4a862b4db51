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


class TooFewError(ValueError):
    """An interval was asked of fewer than two pairs or seeds: there is no spread to show."""


def _t_quantile(p: float, df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(p, df))


def _needs_two(values: Sequence[float], what: str) -> list[float]:
    values = [float(v) for v in values]
    if len(values) < 2:
        raise TooFewError(
            f"{what}: {len(values)} value(s); an interval needs at least 2 (run more pairs or seeds)"
        )
    return values


def alternating_order(items: Sequence[str], repeats: int) -> list[list[str]]:
    """The order of `items` in each repeat: as given, then reversed, and so on
    (A B C, C B A, ...), so drift cannot favour an item by its position."""
    return [list(items) if i % 2 == 0 else list(reversed(items)) for i in range(repeats)]


def abba_order(pairs: int, first: str, second: str) -> list[tuple[str, str]]:
    """Which side runs first in each pair: A B, B A, A B, ... (`alternating_order` of two)."""
    return [tuple(order) for order in alternating_order([first, second], pairs)]


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided t interval on n - 1 degrees of freedom.

    For paired designs pass the per-pair differences (distilled - alone at
    the same seed): the paired interval.

    Raises:
      TooFewError: with fewer than 2 values.
    """
    values = _needs_two(values, "t_interval")
    n = len(values)
    mean = statistics.fmean(values)
    half = _t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def ratio_interval(ratios: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of per-pair ratios and its t interval (computed on the logs).

    Raises:
      TooFewError: with fewer than 2 ratios.
    """
    logs = [math.log(r) for r in _needs_two(ratios, "ratio_interval")]
    mean, low, high = t_interval(logs, confidence)
    return math.exp(mean), math.exp(low), math.exp(high)


def equivalent(
    new: Sequence[float], base: Sequence[float], margin: float, alpha: float = 0.05
) -> dict:
    """Two one-sided tests (Welch): is the mean difference within +-margin?

    Equivalent at level alpha when the (1 - 2 alpha) interval of new - base
    lies inside (-margin, margin).

    Raises:
      TooFewError: with fewer than 2 values on a side.
    """
    new = _needs_two(new, "equivalent (new)")
    base = _needs_two(base, "equivalent (base)")
    va, vb = statistics.variance(new) / len(new), statistics.variance(base) / len(base)
    se = math.sqrt(va + vb)
    diff = statistics.fmean(new) - statistics.fmean(base)
    # Welch-Satterthwaite degrees of freedom.
    df = (va + vb) ** 2 / (va**2 / (len(new) - 1) + vb**2 / (len(base) - 1)) if se else 1.0
    half = _t_quantile(1 - alpha, max(int(df), 1)) * se
    low, high = diff - half, diff + half
    return {
        "diff": diff,
        "interval": (low, high),
        "margin": margin,
        "equivalent": -margin < low and high < margin,
    }
