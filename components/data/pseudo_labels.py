"""Pseudo-labels of an unlabeled transfer set, chosen once and applied in the input (no TFX types).

`select` keeps the examples a teacher labeled confidently and balances the classes
(Noisy Student, Xie et al. 2020); `PseudoLabels.apply` gives each training batch's
unlabeled examples their pseudo-label (or drops them), repeats the examples balancing
asked for, and keeps labeled examples as they are. Examples are found by the fingerprint
of their stored features (`labels.feature_fingerprints`), as the labeled subset is.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from components.data import augment
from components.data.labels import feature_fingerprints


@dataclasses.dataclass(frozen=True)
class PseudoLabels:
    """The kept pseudo-labeled examples, sorted by fingerprint.

    Attributes:
      keys: int64 `[n]` fingerprints, ascending.
      classes: int64 `[n]` the teacher's most likely class.
      targets: float32 `[n, classes]` the teacher's class probabilities.
      counts: int64 `[n]` times each example is used per pass (>= 1).
      hard: Train on `classes` (True) or on `targets` (`augment.SoftLabels`).
    """

    keys: np.ndarray
    classes: np.ndarray
    targets: np.ndarray
    counts: np.ndarray
    hard: bool

    @property
    def num_classes(self) -> int:
        return int(self.targets.shape[-1])

    def class_counts(self) -> np.ndarray:
        """Examples per class in one pass, repeats included."""
        return np.bincount(self.classes, weights=self.counts, minlength=self.num_classes).astype(
            np.int64
        )

    def apply(self, features, label, known: tf.Tensor, fingerprints: tf.Tensor | None = None):
        """One batch relabeled: `(features, label)` with examples repeated or dropped.

        Args:
          features: A batch of stored (not yet augmented) features.
          label: Its labels, `[batch]` or `[batch, 1]`.
          known: bool `[batch]`, which examples keep their own label.
          fingerprints: The batch's `feature_fingerprints`, when already computed.

        Returns:
          The labeled examples once, the kept unlabeled ones `counts` times
          with their pseudo-label, the rest dropped: integer labels, or
          `augment.SoftLabels` when not `hard`.
        """
        flat = tf.reshape(label, [-1])
        keys = tf.constant(self.keys, tf.int64)
        if fingerprints is None:
            fingerprints = feature_fingerprints(features)
        index = tf.minimum(tf.searchsorted(keys, fingerprints), len(self.keys) - 1)
        found = tf.equal(tf.gather(keys, index), fingerprints) & ~known
        counts = tf.where(
            known,
            tf.ones_like(index, tf.int64),
            tf.where(found, tf.gather(tf.constant(self.counts, tf.int64), index), 0),
        )
        pseudo = tf.gather(tf.constant(self.classes, tf.int64), index)
        new = tf.where(known, tf.cast(flat, tf.int64), pseudo)
        out = tf.reshape(tf.cast(new, label.dtype), tf.shape(label))
        if not self.hard:
            own = tf.one_hot(tf.maximum(new, 0), self.num_classes, dtype=tf.float32)
            soft = tf.gather(tf.constant(self.targets, tf.float32), index)
            out = augment.SoftLabels(out, tf.where(known[:, None], own, soft))
        return tf.nest.map_structure(lambda t: tf.repeat(t, counts, axis=0), (features, out))


def select(
    keys: np.ndarray, probs: np.ndarray, confidence: float, balance: bool, hard: bool
) -> PseudoLabels:
    """Chooses the pseudo-labeled examples of a teacher's predictions.

    Keeps the examples whose largest class probability is at least
    `confidence`. With `balance`, every class that kept any gets K = the
    mean kept per class (rounded): a class with more keeps its K most
    confident; a class with n < K uses each example K // n times and its
    K % n most confident once more.

    Args:
      keys: int64 `[n]` fingerprints of the unlabeled examples (distinct).
      probs: float `[n, classes]` the teacher's class probabilities.
      confidence: The threshold, in (0, 1).
      balance: Balance the classes as above.
      hard: Whether training uses the classes (True) or the probabilities.

    Raises:
      ValueError: when no example reaches `confidence`.
    """
    keys = np.asarray(keys, np.int64)
    probs = np.asarray(probs, np.float32)
    top = probs.max(axis=1)
    classes = probs.argmax(axis=1).astype(np.int64)
    kept = np.flatnonzero(top >= confidence)
    if not len(kept):
        raise ValueError(
            f"distillation.noisy_student.confidence: no unlabeled example of {len(keys)} reached "
            f"{confidence} (the teacher's largest probability is {top.max() if len(top) else 'n/a'}); "
            "lower the threshold"
        )
    counts = np.zeros(len(keys), np.int64)
    counts[kept] = 1
    if balance:
        present = np.unique(classes[kept])
        target = int(round(len(kept) / len(present)))
        for c in present:
            members = kept[classes[kept] == c]
            # Most confident first: they are the ones kept, or repeated once more.
            members = members[np.argsort(-top[members], kind="stable")]
            counts[members] = 0
            if len(members) >= target:
                counts[members[:target]] = 1
            else:
                counts[members] = target // len(members)
                counts[members[: target % len(members)]] += 1
    chosen = np.flatnonzero(counts)
    order = chosen[np.argsort(keys[chosen], kind="stable")]
    return PseudoLabels(keys[order], classes[order], probs[order], counts[order], hard)
