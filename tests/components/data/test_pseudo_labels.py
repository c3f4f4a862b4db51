"""Noisy Student's pseudo-labels: what the confidence threshold and the class balancing keep,
and how a training batch is relabeled."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.data import augment
from components.data.labels import feature_fingerprints
from components.data.pseudo_labels import select

# Ten unlabeled examples over three classes; the largest probability of each row.
PROBS = np.array(
    [
        [0.95, 0.05, 0.00],  # 0: class 0, 0.95
        [0.90, 0.10, 0.00],  # 1: class 0, 0.90
        [0.80, 0.20, 0.00],  # 2: class 0, 0.80
        [0.75, 0.25, 0.00],  # 3: class 0, 0.75
        [0.60, 0.40, 0.00],  # 4: class 0, 0.60 (below 0.7)
        [0.10, 0.85, 0.05],  # 5: class 1, 0.85
        [0.20, 0.72, 0.08],  # 6: class 1, 0.72
        [0.00, 0.05, 0.95],  # 7: class 2, 0.95
        [0.30, 0.30, 0.40],  # 8: class 2, 0.40 (below)
        [0.00, 0.31, 0.69],  # 9: class 2, 0.69 (below)
    ],
    np.float32,
)
KEYS = np.arange(100, 110, dtype=np.int64)[::-1].copy()  # not sorted: select sorts them


def _by_key(chosen):
    return dict(zip(chosen.keys.tolist(), chosen.counts.tolist(), strict=True))


def test_the_threshold_alone_keeps_each_confident_example_once():
    chosen = select(KEYS, PROBS, 0.7, balance=False, hard=True)
    kept = [0, 1, 2, 3, 5, 6, 7]
    assert _by_key(chosen) == {int(KEYS[i]): 1 for i in kept}
    assert chosen.class_counts().tolist() == [4, 2, 1]
    assert list(chosen.keys) == sorted(chosen.keys)


def test_balancing_trims_the_large_class_to_its_most_confident_and_repeats_the_small():
    # Seven kept over three classes: K = round(7 / 3) = 2 per class.
    chosen = select(KEYS, PROBS, 0.7, balance=True, hard=True)
    assert chosen.class_counts().tolist() == [2, 2, 2]
    # Class 0 keeps its two most confident (0 and 1); class 1 both once;
    # class 2's one example twice.
    expected = {0: 1, 1: 1, 5: 1, 6: 1, 7: 2}
    assert _by_key(chosen) == {int(KEYS[i]): n for i, n in expected.items()}


def test_a_class_short_of_an_uneven_share_repeats_its_most_confident_once_more():
    probs = np.array([[0.9, 0.1]] * 7 + [[0.2, 0.8], [0.25, 0.75]], np.float32)
    keys = np.arange(9, dtype=np.int64)
    # K = round(9 / 2) = 4 (banker's rounding of 4.5): class 1 has 2 -> 2 each.
    chosen = select(keys, probs, 0.7, balance=True, hard=True)
    assert chosen.class_counts().tolist() == [4, 4]
    probs = np.array([[0.9, 0.1]] * 8 + [[0.2, 0.8], [0.25, 0.75], [0.3, 0.7]], np.float32)
    # K = round(11 / 2) = 6: class 1's three are used 2 times each.
    chosen = select(np.arange(11, dtype=np.int64), probs, 0.7, balance=True, hard=True)
    assert chosen.class_counts().tolist() == [6, 6]
    probs = np.array([[0.9, 0.1]] * 9 + [[0.2, 0.8], [0.25, 0.75]], np.float32)
    # K = round(11 / 2) = 6 (5.5 -> 6): class 1's two: 3 each.
    chosen = select(np.arange(11, dtype=np.int64), probs, 0.7, balance=True, hard=True)
    assert _by_key(chosen)[9] == 3 and _by_key(chosen)[10] == 3
    probs = np.array([[0.9, 0.1]] * 12 + [[0.2, 0.8], [0.3, 0.7], [0.25, 0.75]], np.float32)
    # K = round(15 / 2) = 8: class 1's three get 8 // 3 = 2 each, and the two
    # most confident (0.8, then 0.75) once more.
    chosen = select(np.arange(15, dtype=np.int64), probs, 0.7, balance=True, hard=True)
    counts = _by_key(chosen)
    assert (counts[12], counts[14], counts[13]) == (3, 3, 2)


def test_no_confident_example_is_refused_naming_the_threshold():
    with pytest.raises(ValueError, match=r"^distillation\.noisy_student\.confidence: no unlabeled"):
        select(KEYS, PROBS, 0.99, balance=True, hard=True)


def test_hard_pseudo_labels_are_the_argmax_of_the_soft_ones():
    hard = select(KEYS, PROBS, 0.7, balance=True, hard=True)
    soft = select(KEYS, PROBS, 0.7, balance=True, hard=False)
    np.testing.assert_array_equal(hard.keys, soft.keys)
    np.testing.assert_array_equal(hard.classes, np.argmax(soft.targets, axis=1))


@pytest.mark.parametrize("hard", [True, False])
def test_a_batch_keeps_its_labeled_examples_and_repeats_or_drops_the_others(hard):
    pixels = tf.constant(np.arange(12, dtype=np.float32).reshape(6, 2))
    features = {"x": pixels}
    keys = feature_fingerprints(features).numpy()
    # Examples 2 and 3 are unlabeled and pseudo-labeled (3 used twice); 4 and
    # 5 are unlabeled and not kept; 0 and 1 keep their labels.
    probs = np.array([[0.1, 0.9], [0.8, 0.2], [0.5, 0.5], [0.5, 0.5]], np.float32)
    chosen = select(keys[2:6], probs, 0.7, balance=False, hard=hard)
    chosen = type(chosen)(
        chosen.keys,
        chosen.classes,
        chosen.targets,
        np.where(chosen.keys == keys[3], 2, chosen.counts),
        hard,
    )
    label = tf.constant([[1], [0], [-1], [-1], [-1], [-1]], tf.int64)
    known = tf.constant([True, True, False, False, False, False])
    out_features, out_label = chosen.apply(features, label, known)
    np.testing.assert_array_equal(out_features["x"].numpy(), pixels.numpy()[[0, 1, 2, 3, 3]])
    ids = augment.own_labels(out_label)
    assert ids.shape == (5, 1)
    assert ids.numpy().ravel().tolist() == [1, 0, 1, 0, 0]
    if not hard:
        np.testing.assert_allclose(
            out_label.targets.numpy(),
            [[0, 1], [1, 0], [0.1, 0.9], [0.8, 0.2], [0.8, 0.2]],
        )
