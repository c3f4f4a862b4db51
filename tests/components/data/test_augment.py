"""Batch augmentation: image views, mixup and the labels of a mixed batch."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats as scipy_stats

from components.data import augment

SEED = tf.constant([3, 7])


def _images(batch=16, size=8):
    rng = np.random.default_rng(0)
    return tf.constant(rng.uniform(0.1, 1.0, size=(batch, size, size, 1)).astype("float32"))


def _view(img: np.ndarray, dy: int, dx: int, flip: bool) -> np.ndarray:
    """The exact view: `img` shifted by (dy, dx), filled with its own darkest value, then
    mirrored left-right when `flip`."""
    height, width = img.shape[:2]
    out = np.full_like(img, img.min())
    out[max(dy, 0) : height + min(dy, 0), max(dx, 0) : width + min(dx, 0)] = img[
        max(-dy, 0) : height - max(dy, 0), max(-dx, 0) : width - max(dx, 0)
    ]
    return out[:, ::-1] if flip else out


VIEWS = [(dy, dx, f) for dy in range(-2, 3) for dx in range(-2, 3) for f in (False, True)]


def _which_views(images: np.ndarray, out: np.ndarray, views=VIEWS) -> list[tuple]:
    """For each output, the one view (dy, dx, flip) of its input it equals, bit for bit."""
    found = []
    for img, view in zip(images, out, strict=True):
        matches = [v for v in views if np.array_equal(view, _view(img, *v))]
        assert len(matches) == 1, f"{len(matches)} exact views match"
        found.append(matches[0])
    return found


@pytest.fixture(params=["matmul", "gather"])
def path(request, monkeypatch):
    """Both ways `random_views` computes a view: one-hot products and gathers."""
    if request.param == "gather":
        monkeypatch.setattr(augment, "MATMUL_MAX_SIDE", 0)
    return request.param


@pytest.mark.parametrize("channels", [1, 3])
def test_each_view_is_the_exact_shifted_and_flipped_image(path, channels):
    rng = np.random.default_rng(0)
    # Distinct pixel values, so exactly one view of an image can match its output.
    images = rng.permutation(400 * 8 * 7 * channels).reshape(400, 8, 7, channels)
    images = (images / images.size + 0.1).astype("float32")
    out = augment.random_views(
        tf.constant(images), max_pixels=2, flip=True, translate_seed=SEED, flip_seed=SEED + 1
    ).numpy()
    assert out.dtype == np.float32 and out.shape == images.shape
    seen = _which_views(images, out)
    # Every shift and flip is drawn: 50 views over 400 images.
    assert set(seen) == set(VIEWS)


def test_the_products_run_on_the_cpu_where_they_are_exact():
    # A GPU would multiply in TF32 and round the pixels: the views stay on the CPU.
    views = augment.random_views(
        tf.constant(_images()), max_pixels=2, flip=True, translate_seed=SEED, flip_seed=SEED
    )
    assert views.device.endswith("CPU:0")


def test_integer_images_take_the_gather_path_and_the_same_views():
    images = np.random.default_rng(1).permutation(64 * 28 * 28).reshape(64, 28, 28, 1)
    out = augment.random_views(
        tf.constant(images, tf.int32), max_pixels=2, flip=True, translate_seed=SEED, flip_seed=SEED
    ).numpy()
    _which_views(images, out)


def test_the_two_paths_give_the_same_views(monkeypatch):
    images = tf.constant(np.random.default_rng(2).normal(size=(64, 28, 28, 1)).astype("float32"))
    args = {"max_pixels": 3, "flip": True, "translate_seed": SEED, "flip_seed": SEED + 5}
    by_products = augment.random_views(images, **args).numpy()
    monkeypatch.setattr(augment, "MATMUL_MAX_SIDE", 0)
    np.testing.assert_array_equal(augment.random_views(images, **args).numpy(), by_products)


def test_shifts_and_flips_are_uniform_by_a_chi_square_test(path):
    rng = np.random.default_rng(3)
    images = rng.permutation(2000 * 6 * 6).reshape(2000, 6, 6, 1).astype("float32")
    out = augment.random_views(
        tf.constant(images), max_pixels=2, flip=True, translate_seed=SEED, flip_seed=SEED + 1
    ).numpy()
    seen = _which_views(images, out)
    shifts = [
        sum(1 for v in seen if v[:2] == (dy, dx)) for dy in range(-2, 3) for dx in range(-2, 3)
    ]
    flips = [sum(1 for v in seen if v[2]), sum(1 for v in seen if not v[2])]
    for counts in (shifts, flips):
        statistic, p_value = scipy_stats.chisquare(counts)
        # At a fixed seed: p above 0.01 for all 25 shifts, and for the flips.
        assert p_value > 0.01, (counts, statistic)


def test_translate_alone_and_flip_alone():
    images = _images(batch=64).numpy()
    shifted = augment.random_translate(tf.constant(images), 2, SEED).numpy()
    assert {f for _, _, f in _which_views(images, shifted)} == {False}
    flipped = augment.random_flip(tf.constant(images), SEED).numpy()
    kinds = _which_views(images, flipped, [(0, 0, False), (0, 0, True)])
    assert 10 < sum(f for _, _, f in kinds) < 54
    unshifted = tf.constant(images)
    assert augment.random_translate(unshifted, 0, SEED) is unshifted


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


@pytest.mark.parametrize("shape", [(200_000,), (999, 7), (1, 1)])
def test_standard_normal_is_normal_by_a_ks_test_and_bounded(shape):
    draws = augment.standard_normal(tf.constant(shape), SEED)
    assert draws.shape == shape and draws.dtype == tf.float32
    values = draws.numpy().reshape(-1)
    # The 24-bit radius caps |z| at sqrt(2 ln 2^25).
    assert np.abs(values).max() <= np.sqrt(2 * np.log(2.0**25)) + 1e-5
    if values.size > 1000:
        # At a fixed seed: indistinguishable from N(0, 1), and not correlated within pairs.
        assert scipy_stats.kstest(values, "norm").pvalue > 0.01
        assert abs(np.corrcoef(values[:-1], values[1:])[0, 1]) < 0.01
    np.testing.assert_array_equal(augment.standard_normal(tf.constant(shape), SEED), draws)
