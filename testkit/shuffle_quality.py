"""How random a reader's delivered order is: measures any reader can report for one epoch.

An epoch is given as the delivered sequence of example ids, where an example's id is its
position in file order (the files in name order, the records of each in file order), and,
where the labels matter, the delivered labels. Each measure is 0 (or its value under a
uniformly random permutation, returned beside it) for a perfect shuffle:

- `rank_correlation`: Spearman's rho between delivered position and file position. 1
  for a reader that does not shuffle; about 0 (within 2 / sqrt(n)) for a random
  permutation. It sees order kept at the scale of the whole epoch.
- `neighbour_distance`: the mean file distance |id[t+1] - id[t]| between consecutive
  delivered examples, divided by its expectation under a random permutation,
  (n + 1) / 3. About 1 for a random permutation; near 0 when a reader hands out runs of
  neighbours (a small shuffle buffer, blocks read whole). It sees order kept locally.
- `label_autocorrelation`: the lag-1 autocorrelation of the delivered labels (one-hot,
  averaged over classes as Pearson correlations). About 0 for a random permutation; near
  1 when files sorted by label come out in runs. What SGD feels: batches that are not a
  sample of the label mix.
- `batch_majority_share`: the mean, over consecutive batches of `batch_size`, of the
  largest class's share of the batch, beside the same for a random permutation of the
  same labels (seeded), so a reader is judged against what chance gives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _epoch(ids: Sequence[int]) -> np.ndarray:
    order = np.asarray(ids, dtype=np.int64)
    if order.ndim != 1 or len(order) < 3:
        raise ValueError(f"an epoch of at least 3 example ids is needed, got shape {order.shape}")
    return order


def rank_correlation(ids: Sequence[int]) -> float:
    """Spearman's rho between delivered position and file position (ids need not be 0..n-1)."""
    order = _epoch(ids)
    ranks = np.empty(len(order))
    ranks[np.argsort(order, kind="stable")] = np.arange(len(order))
    position = np.arange(len(order), dtype=np.float64)
    return float(np.corrcoef(position, ranks)[0, 1])


def neighbour_distance(ids: Sequence[int]) -> float:
    """Mean |rank[t+1] - rank[t]| over (n + 1) / 3, its expectation for a random permutation."""
    order = _epoch(ids)
    ranks = np.empty(len(order))
    ranks[np.argsort(order, kind="stable")] = np.arange(len(order))
    return float(np.mean(np.abs(np.diff(ranks))) / ((len(order) + 1) / 3))


def label_autocorrelation(labels: Sequence[int]) -> float:
    """Lag-1 autocorrelation of the delivered labels: the mean over classes (present on both
    sides of the lag, not constant) of the Pearson correlation of its indicator."""
    values = _epoch(labels)
    correlations = []
    for label in np.unique(values):
        hit = (values == label).astype(np.float64)
        a, b = hit[:-1], hit[1:]
        if a.std() > 0 and b.std() > 0:
            correlations.append(np.corrcoef(a, b)[0, 1])
    return float(np.mean(correlations)) if correlations else 0.0


def batch_majority_share(labels: Sequence[int], batch_size: int) -> float:
    """Mean over whole consecutive batches of the largest class's share of the batch."""
    values = _epoch(labels)
    batches = len(values) // batch_size
    if batches < 1:
        raise ValueError(f"fewer labels ({len(values)}) than one batch of {batch_size}")
    shares = [
        np.bincount(values[i * batch_size : (i + 1) * batch_size]).max() / batch_size
        for i in range(batches)
    ]
    return float(np.mean(shares))


def random_batch_majority_share(labels: Sequence[int], batch_size: int, seed: int = 0) -> float:
    """`batch_majority_share` of a seeded random permutation of the same labels."""
    values = _epoch(labels)
    return batch_majority_share(np.random.default_rng(seed).permutation(values), batch_size)


def report(ids: Sequence[int], labels: Sequence[int], batch_size: int) -> dict[str, float]:
    """Every measure of one delivered epoch (ids and labels in delivered order)."""
    return {
        "rank_correlation": round(rank_correlation(ids), 4),
        "neighbour_distance": round(neighbour_distance(ids), 4),
        "label_autocorrelation": round(label_autocorrelation(labels), 4),
        "batch_majority_share": round(batch_majority_share(labels, batch_size), 4),
        "batch_majority_share_random": round(random_batch_majority_share(labels, batch_size), 4),
    }
