"""Label masks: which examples keep their label, decided by a fingerprint of their features.

Every input pipeline, run and component agrees on the same labeled subset
without an index; an unlabeled transfer-set example carries `UNLABELED`.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

Features = Mapping[str, tf.Tensor]


# The label of an example in an unlabeled transfer set.
UNLABELED = -1


def labeled_mask(features: Features, fraction: float) -> tf.Tensor:
    """Which examples keep their label when only `fraction` of them may (`[batch]` bool).

    Decided by a fingerprint of each example's features, so every input
    pipeline, run and component (teacher Trainer, Distiller, benchmark)
    agrees on the same labeled subset without an index.
    """
    return labeled_by_fingerprint(feature_fingerprints(features), fraction)


def labeled_by_fingerprint(fingerprints: tf.Tensor, fraction: float) -> tf.Tensor:
    """`labeled_mask` of already computed `feature_fingerprints`."""
    buckets = 10000
    return tf.math.floormod(fingerprints, buckets) < int(round(fraction * buckets))


def feature_fingerprints(features: Features) -> tf.Tensor:
    """A 64-bit fingerprint of each example's features (all keys, raw bytes).

    Args:
      features: Dense tensors with a leading batch dimension.

    Returns:
      int64 `[batch]`; equal feature values give equal fingerprints.
    """
    per_feature = [
        tf.fingerprint(tf.reshape(features[k], [tf.shape(features[k])[0], -1]))
        for k in sorted(features)
    ]
    combined = tf.fingerprint(tf.concat(per_feature, axis=1))
    return tf.bitcast(combined, tf.int64)
