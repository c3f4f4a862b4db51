"""Batch augmentation: image views, mixup and the labels of a mixed batch."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.data import augment

SEED = tf.constant([3, 7])


def _images(batch=16, size=8):
    rng = np.random.default_rng(0)
    return tf.constant(rng.uniform(0.1, 1.0, size=(batch, size, size, 1)).astype("float32"))


def test_translate_shifts_each_image_by_at_most_max_pixels():
    images = _images()
    shifted = augment.random_translate(images, 2, SEED).numpy()
    original = images.numpy()
    for img, out in zip(original, shifted, strict=True):
        # Exactly one shift in [-2, 2]^2 reproduces the output (zeros where it moved in).
        matches = []
        for dy in range(-2, 3):
            for dx in range(-2, 3):
                # Pixels shifted in take the image's background (its darkest value).
                expected = np.full_like(img, img.min())
                ys, yd = (
                    (slice(0, 8 - dy), slice(dy, 8))
                    if dy >= 0
                    else (slice(-dy, 8), slice(0, 8 + dy))
                )
                xs, xd = (
                    (slice(0, 8 - dx), slice(dx, 8))
                    if dx >= 0
                    else (slice(-dx, 8), slice(0, 8 + dx))
                )
                expected[yd, xd] = img[ys, xs]
                if np.allclose(out, expected, atol=1e-6):
                    matches.append((dy, dx))
        assert len(matches) == 1
    assert not np.array_equal(shifted, original)
    # No pixel darker than the background, none made up: the fill is the background.
    np.testing.assert_allclose(shifted.min(axis=(1, 2, 3)), original.min(axis=(1, 2, 3)), atol=1e-6)


def test_flip_mirrors_some_images_and_keeps_the_others():
    images = _images(batch=64)
    flipped = augment.random_flip(images, SEED).numpy()
    mirrored = [np.array_equal(o, i[:, ::-1]) for o, i in zip(flipped, images.numpy(), strict=True)]
    kept = [np.array_equal(o, i) for o, i in zip(flipped, images.numpy(), strict=True)]
    assert all(m or k for m, k in zip(mirrored, kept, strict=True))
    assert 10 < sum(mirrored) < 54


def test_augment_images_touches_only_image_features_and_keeps_shapes():
    flat = tf.reshape(_images(), [16, 64])
    other = tf.range(16, dtype=tf.int64)[:, None]
    out = augment.augment_images(
        {"img_xf": flat, "id_xf": other}, {"img_xf": (8, 8, 1)}, translate=1, flip=True, seed=SEED
    )
    assert out["id_xf"] is other
    assert out["img_xf"].shape == flat.shape and out["img_xf"].dtype == flat.dtype
    # Same seed, same view: the teacher and the student can be fed one augmented batch.
    again = augment.augment_images(
        {"img_xf": flat, "id_xf": other}, {"img_xf": (8, 8, 1)}, translate=1, flip=True, seed=SEED
    )
    np.testing.assert_array_equal(out["img_xf"].numpy(), again["img_xf"].numpy())


def _batch(n=8):
    rng = np.random.default_rng(2)
    features = {
        "img_xf": tf.constant(rng.normal(size=(n, 64)).astype("float32")),
        "num_xf": tf.constant(rng.normal(size=(n, 1)).astype("float32")),
        "id_xf": tf.constant(rng.integers(0, 5, size=(n, 1))),
    }
    # Each example's label is its index, so the partner labels are the permutation.
    return features, tf.range(n, dtype=tf.int64)[:, None]


def test_mixup_mixes_the_dense_features_with_the_recorded_lam_and_partner():
    features, labels = _batch()
    mixed, mixed_labels = augment.mixup(features, labels, ["img_xf", "num_xf"], 0.4, SEED)
    lam = mixed_labels.lam.numpy()
    perm = mixed_labels.partner.numpy().reshape(-1)
    np.testing.assert_array_equal(mixed_labels.label.numpy(), labels.numpy())
    assert sorted(perm) == list(range(8)) and lam.shape == (8,)
    assert ((lam >= 0) & (lam <= 1)).all() and not np.allclose(lam, lam[0])
    for key in ("img_xf", "num_xf"):
        x = features[key].numpy()
        want = lam[:, None] * x + (1 - lam[:, None]) * x[perm]
        np.testing.assert_allclose(mixed[key].numpy(), want, rtol=1e-6, atol=1e-6)
        assert mixed[key].dtype == features[key].dtype
    # Integer ids have no average: each example keeps its own.
    assert mixed["id_xf"] is features["id_xf"]
    # Stateless: the same seed mixes the same way.
    again, _ = augment.mixup(features, labels, ["img_xf", "num_xf"], 0.4, SEED)
    np.testing.assert_array_equal(again["img_xf"].numpy(), mixed["img_xf"].numpy())


@pytest.mark.parametrize("alpha", [0.2, 1.0, 4.0])
def test_sample_beta_has_the_moments_of_beta_alpha_alpha(alpha):
    draws = augment.sample_beta(alpha, [20000], SEED).numpy()
    # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)); 20,000 draws pin both to ~1%.
    assert draws.mean() == pytest.approx(0.5, abs=0.01)
    assert draws.var() == pytest.approx(1 / (4 * (2 * alpha + 1)), rel=0.05)


def test_sample_beta_stays_finite_where_gamma_draws_underflow():
    # At alpha 0.01 most float Gamma(alpha) draws are 0, and 0 / (0 + 0) is NaN.
    draws = augment.sample_beta(0.01, [10000], SEED).numpy()
    assert np.isfinite(draws).all() and ((draws >= 0) & (draws <= 1)).all()
    assert 0.4 < (draws > 0.5).mean() < 0.6


def test_label_terms_weigh_each_label_by_its_share_and_drop_missing_labels():
    unlabeled = -1
    plain = augment.label_terms(tf.constant([[2], [unlabeled]], tf.int64))
    assert len(plain) == 1
    np.testing.assert_array_equal(plain[0][0].numpy(), [2, 0])
    np.testing.assert_array_equal(plain[0][1].numpy(), [1.0, 0.0])
    mixed = augment.MixedLabels(
        label=tf.constant([[2], [unlabeled], [1]], tf.int64),
        partner=tf.constant([[unlabeled], [2], [0]], tf.int64),
        lam=tf.constant([0.7, 0.4, 0.25]),
    )
    (own, own_w), (partner, partner_w) = augment.label_terms(mixed)
    np.testing.assert_array_equal(own.numpy(), [2, 0, 1])
    np.testing.assert_array_equal(partner.numpy(), [0, 2, 0])
    np.testing.assert_allclose(own_w.numpy(), [0.7, 0.0, 0.25])
    np.testing.assert_allclose(partner_w.numpy(), [0.0, 0.6, 0.75])
    np.testing.assert_array_equal(augment.own_labels(mixed).numpy(), [[2], [unlabeled], [1]])


def test_input_noise_perturbs_the_tabular_floats_with_the_asked_spread_and_nothing_else():
    features = {
        "fare_xf": tf.zeros([4000, 1]),
        "image_xf": tf.ones([4000, 4]),
        "company_xf": tf.range(4000, dtype=tf.int64),
    }
    seed = tf.constant([7, 0], tf.int64)
    noised = augment.input_noise(features, ["fare_xf"], 0.5, seed)
    assert 0.48 < float(tf.math.reduce_std(noised["fare_xf"])) < 0.52
    assert abs(float(tf.reduce_mean(noised["fare_xf"]))) < 0.03
    np.testing.assert_array_equal(noised["image_xf"].numpy(), features["image_xf"].numpy())
    np.testing.assert_array_equal(noised["company_xf"].numpy(), features["company_xf"].numpy())
    # Stateless: the same seed, the same noise; another batch's seed, other noise.
    again = augment.input_noise(features, ["fare_xf"], 0.5, seed)
    np.testing.assert_array_equal(again["fare_xf"].numpy(), noised["fare_xf"].numpy())
    other = augment.input_noise(features, ["fare_xf"], 0.5, tf.constant([7, 1], tf.int64))
    assert not np.array_equal(other["fare_xf"].numpy(), noised["fare_xf"].numpy())
