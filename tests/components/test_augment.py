"""Batch augmentation of image-shaped features."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from components import augment

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
